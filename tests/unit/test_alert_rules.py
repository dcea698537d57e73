"""The recommended alerting rules, ops/alerts.yml, kept from drifting from the code as the
Grafana dashboard is (test_metrics): each rule well-formed, every metric its expression
reads one a node exports (as a sample name: `_total`, `_bucket`), every label it matches
or groups by one that metric carries, every page it sends a reader to a heading there, and
the monitoring profile's Prometheus loading the file. Every expression parses with
promql-parser (a port of Prometheus' parser); the metrics and labels are read from it with
regular expressions.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

import promql_parser
import pytest
import yaml
from test_metrics import ROOT, TYPE, fed
from test_project import _anchors

from app.kafka.broker_watch import BrokerWatch
from app.ops.status_for_node import bad_records_counter, report_errors_counter

RULES = ROOT / "ops" / "alerts.yml"
PROMETHEUS = ROOT / "ops" / "prometheus.yml"
SEVERITIES = {"critical", "warning"}
RULE_KEYS = {"alert", "expr", "for", "labels", "annotations"}
TARGET_LABELS = {"instance", "job"}
"""Labels Prometheus puts on every series it scrapes (the scrape job's, the target's)."""

SELECTOR = re.compile(r"\b(tickwheel_[a-z0-9_]+|up)\b\s*(\{[^}]*\})?")
MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*\"([^\"]*)\"")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
COUNTING = re.compile(r"\b(rate|irate|increase|delta|deriv)\s*\(\s*(tickwheel_[a-z0-9_]+)")
DOC_LINK = re.compile(r"\bdocs/([a-z-]+\.md)#([a-z0-9-]+)")
DURATION = re.compile(r"^[0-9]+[smhd]$")


def groups() -> list[dict[str, Any]]:
    loaded: dict[str, Any] = yaml.safe_load(RULES.read_text())
    assert set(loaded) == {"groups"}, "a rule file holds groups alone"
    found: list[dict[str, Any]] = loaded["groups"]
    return found


def rules() -> list[dict[str, Any]]:
    return [rule for group in groups() for rule in group["rules"]]


async def exported_series() -> tuple[dict[str, set[str]], dict[str, str]]:
    """A worker's registry as Prometheus scrapes it: each sample name with its labels' names,
    and its family's type. test_metrics' node, its broker watch and cluster status counters,
    and one of each labelled metric it leaves uncounted, counted where the node counts it."""
    metrics = await fed()
    BrokerWatch("127.0.0.1:9092", registry=metrics.registry)
    bad_records_counter(metrics.registry)
    report_errors_counter(metrics.registry)
    metrics.dead_letters.labels("shop.order.commands").inc()
    metrics.deleted_unread.labels("shop.order.events").inc()
    metrics.followed.labels(TYPE).inc()
    metrics.misplaced.labels(TYPE, "0", "log").inc()
    metrics.unknown_result_codes.labels(context="shop").inc()
    metrics.operator_requests.labels(TYPE, "retry", "0").inc()
    metrics.let_go.labels("failed").inc()
    metrics.replication_findings.labels("shop.order.events").set(1)
    labels: dict[str, set[str]] = {}
    kinds: dict[str, str] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
            kinds[sample.name] = family.type
    return labels, kinds


def scrape_job() -> str:
    prometheus: dict[str, Any] = yaml.safe_load(PROMETHEUS.read_text())
    [job] = prometheus["scrape_configs"]
    name: str = job["job_name"]
    return name


# --- the rules' shape -----------------------------------------------------------------------


def test_every_rule_has_an_alert_an_expression_a_wait_a_severity_and_what_to_do() -> None:
    names = [g["name"] for g in groups()]
    assert names and len(names) == len(set(names)), "named groups, each once"
    alerts = [r.get("alert") for r in rules()]
    assert 12 <= len(alerts) <= 16, f"a focused set: {len(alerts)} rules"
    assert len(alerts) == len(set(alerts)), "each alert once"
    for rule in rules():
        name = rule.get("alert")
        assert isinstance(name, str) and re.fullmatch(r"Tickwheel[A-Z][A-Za-z]+", name), rule
        assert set(rule) == RULE_KEYS, f"{name}: {sorted(set(rule) ^ RULE_KEYS)}"
        assert isinstance(rule["expr"], str) and rule["expr"].strip(), name
        assert DURATION.fullmatch(str(rule["for"])), f"{name}: for {rule['for']!r}"
        assert rule["labels"] == {"severity": rule["labels"].get("severity")}, name
        assert rule["labels"]["severity"] in SEVERITIES, name
        notes = rule["annotations"]
        assert set(notes) == {"summary", "description"}, name
        assert all(isinstance(v, str) and v.strip() for v in notes.values()), name
        assert DOC_LINK.search(notes["description"]), f"{name}: says where to read on"
    severities = {r["labels"]["severity"] for r in rules()}
    assert severities == SEVERITIES, "both: some wake someone, some only tell"


def test_the_rules_cover_what_an_operator_must_be_woken_for_or_told_of() -> None:
    read = {m for r in rules() for m in re.findall(r"\b(?:tickwheel_[a-z0-9_]+|up)\b", r["expr"])}
    for name in (
        "up",
        "tickwheel_broker_reachable",
        "tickwheel_owned_partitions",
        "tickwheel_timer_lateness_seconds_bucket",
        "tickwheel_timer_backlog_oldest_seconds",
        "tickwheel_commit_duration_seconds_bucket",
        "tickwheel_dead_letters_total",
        "tickwheel_records_deleted_unread_total",
        "tickwheel_topic_replication_findings",
        "tickwheel_unknown_result_codes_total",
        "tickwheel_misplaced_events_total",
        "tickwheel_partitions_let_go_total",
        "tickwheel_ledger_entries",
    ):
        assert name in read, name
    severity = {r["alert"]: r["labels"]["severity"] for r in rules()}
    for woken in ("TickwheelBrokerUnreachable", "TickwheelBacklogStalled", "TickwheelNoWorkers"):
        assert severity[woken] == "critical", woken


# --- the rules against what a node exports --------------------------------------------------


async def test_every_metric_and_label_a_rule_reads_is_one_a_node_exports() -> None:
    labels, kinds = await exported_series()
    labels["up"] = set(TARGET_LABELS)  # Prometheus' own, one per target
    job = scrape_job()
    for rule in rules():
        name, expr = rule["alert"], rule["expr"]
        read: set[str] = set()
        for selected in SELECTOR.finditer(expr):
            metric, matchers = selected.group(1), selected.group(2) or ""
            assert metric in labels, f"{name}: {metric} is no sample a node exports"
            read.add(metric)
            for label, _, value in MATCHER.findall(matchers):
                assert label in labels[metric] | TARGET_LABELS, f"{name}: {metric}{{{label}}}"
                if label == "job":
                    assert value == job, f"{name}: job {value!r}, not the scrape job {job!r}"
        for grouping in GROUPING.findall(expr):
            for label in filter(None, (word.strip() for word in grouping.split(","))):
                for metric in read:
                    allowed = labels[metric] | TARGET_LABELS
                    assert label in allowed, f"{name}: grouped by {label}, not on {metric}"
        for function, metric in COUNTING.findall(expr):
            kind = kinds.get(metric)
            if function in ("delta", "deriv"):
                assert kind == "gauge", f"{name}: {function}() of the {kind} {metric}"
            else:
                assert kind in ("counter", "histogram"), f"{name}: {function}() of a {kind}"
        if "histogram_quantile" in expr:
            assert all(m.endswith("_bucket") for m in read), f"{name}: quantile of buckets"
            assert re.search(r"\bby\s*\([^)]*\ble\b", expr), f"{name}: kept by le"


def test_every_page_an_annotation_sends_a_reader_to_has_that_heading() -> None:
    for rule in rules():
        for page, anchor in DOC_LINK.findall(" ".join(rule["annotations"].values())):
            path = ROOT / "docs" / page
            assert path.exists(), f"{rule['alert']}: docs/{page}"
            assert anchor in _anchors(path), f"{rule['alert']}: docs/{page}#{anchor}"


def test_the_docs_metrics_section_lists_exactly_the_rules() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    assert "`ops/alerts.yml`" in section
    listed = set(re.findall(r"`(Tickwheel[A-Z][A-Za-z]+)`", section))
    assert listed == {r["alert"] for r in rules()}


# --- the monitoring profile loads them ------------------------------------------------------


def test_prometheus_loads_the_rules_and_the_monitoring_profile_mounts_them_beside_it() -> None:
    prometheus: dict[str, Any] = yaml.safe_load(PROMETHEUS.read_text())
    [rule_file] = prometheus["rule_files"]
    # Relative to the configuration file, in the container as beside it here.
    assert (PROMETHEUS.parent / rule_file).resolve() == RULES.resolve()
    compose: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounts = {}
    for volume in compose["services"]["prometheus"]["volumes"]:
        source, target = volume.split(":")[:2]
        mounts[target] = (ROOT / source).resolve()
    [config] = [a for a in compose["services"]["prometheus"]["command"] if "config.file" in a]
    in_container = posixpath.dirname(config.split("=", 1)[1])
    assert mounts[posixpath.join(in_container, rule_file)] == RULES.resolve()


def test_every_expression_parses_as_promql() -> None:
    # An unclosed bracket, an unknown function or a bad duration fails here as it would in
    # Prometheus' rule loading.
    for rule in rules():
        promql_parser.parse(rule["expr"])


def test_the_promql_check_catches_a_broken_expression() -> None:
    for broken in ("rate(tickwheel_dead_letters_total[15m]", "rat(up[5m])", "up[5x]"):
        with pytest.raises(ValueError):
            promql_parser.parse(broken)
