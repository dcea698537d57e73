"""A data directory written against another Kafka cluster is dropped before it is read
(issue 10, item 1: TICKWHEEL_DATA_DIR reused against another cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.node.local_state import keep_for_cluster


def state_of(data: Path, name: str) -> Path:
    (data / name / "timers").mkdir(parents=True)
    (data / name / "timers" / "000001.sst").write_bytes(b"rows")
    return data / name


def test_a_first_run_marks_the_directory_and_keeps_what_is_there(tmp_path: Path) -> None:
    kept = state_of(tmp_path, "shop.order")
    assert keep_for_cluster(tmp_path, "c-1", ["shop.order"]) == []
    assert kept.exists() and (tmp_path / "cluster-id").read_text() == "c-1\n"


def test_the_same_cluster_keeps_the_local_state(tmp_path: Path) -> None:
    keep_for_cluster(tmp_path, "c-1", ["shop.order"])
    kept = state_of(tmp_path, "shop.order")
    assert keep_for_cluster(tmp_path, "c-1", ["shop.order"]) == []
    assert (kept / "timers" / "000001.sst").exists()


def test_another_cluster_drops_the_types_state_and_marks_the_new_one(tmp_path: Path) -> None:
    keep_for_cluster(tmp_path, "c-1", ["shop.order", "shop.invoice"])
    order = state_of(tmp_path, "shop.order")
    other = state_of(tmp_path, "billing.account")  # not this node's type: left alone
    assert keep_for_cluster(tmp_path, "c-2", ["shop.order", "shop.invoice"]) == [order]
    assert not order.exists() and other.exists()
    assert (tmp_path / "cluster-id").read_text() == "c-2\n"
    assert keep_for_cluster(tmp_path, "c-2", ["shop.order"]) == []


def test_an_empty_cluster_id_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    kept = state_of(tmp_path, "shop.order")
    with pytest.raises(ValueError, match="cluster id"):
        keep_for_cluster(tmp_path, " ", ["shop.order"])
    assert kept.exists() and not (tmp_path / "cluster-id").exists()
