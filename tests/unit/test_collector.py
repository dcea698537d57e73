"""The worker's collector tuning (app/node/collector.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from app.errors import ConfigError
from app.node.collector import tune_collector
from app.node.settings import Settings


@pytest.fixture
def collector() -> Iterator[None]:
    """Whatever a test does to the collector is undone after it."""
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


@pytest.mark.usefixtures("collector")
def test_a_threshold_freezes_what_lives_and_collects_the_young_less_often() -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    tune_collector(50_000)
    assert gc.get_threshold() == (50_000, 20, 20)
    assert gc.get_freeze_count() > 0  # the modules, this test: out of the collector's way


@pytest.mark.usefixtures("collector")
def test_zero_leaves_the_collector_as_it_is() -> None:
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    tune_collector(0)
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


def test_the_setting_defaults_to_50000_and_reads_its_variable() -> None:
    assert Settings.from_env({}).gc_threshold == 50_000
    assert Settings.from_env({"TICKWHEEL_GC_THRESHOLD": "0"}).gc_threshold == 0
    with pytest.raises(ConfigError, match="TICKWHEEL_GC_THRESHOLD"):
        Settings.from_env({"TICKWHEEL_GC_THRESHOLD": "-1"})
