"""The worker's garbage collector, tuned once the node has started.

A worker makes and drops tens of thousands of small objects a second (records, rows,
models) that rarely form cycles, yet CPython's young-generation collection runs every 700
container allocations and scans everything alive, then promotes the survivors (the
wheel's rows, the service's modules) to be scanned again by the older generations. A
profile of a worker through a burst found the cyclic collector in 10-26 % of its samples;
freezing what start-up made and collecting the young generation every `threshold`
allocations cut the worker's CPU per fired timer by about a third (docs/performance.md).
Reference counting still frees everything at once; only cycles wait a little longer.
"""

from __future__ import annotations

import gc
import logging

__all__ = ["tune_collector"]

logger = logging.getLogger(__name__)


def tune_collector(threshold: int) -> None:
    """Freezes the objects alive now (modules, the service, the restored state: the
    collector never scans them again) and sets the young generation's threshold to
    `threshold`, each older one every 20 collections of the one below (Python's: 10); 0
    leaves the collector as it is."""
    if threshold == 0:
        return
    gc.freeze()
    gc.set_threshold(threshold, 20, 20)
    logger.debug("collector: %d objects frozen, threshold %d", gc.get_freeze_count(), threshold)
