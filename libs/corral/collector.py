"""How often CPython's cyclic garbage collector runs in Corral's busy loops (replays, services).

Why: a scheduling cycle allocates hundreds of thousands of short-lived tuples and small objects,
almost none of them in reference cycles, and reference counting frees them at once. With the
default generation-0 threshold (700 net allocations) the collector still runs every few hundred
allocations and re-examines the young objects a cycle is holding: a fifth of a Philly replay's CPU
(bench/README.md). At 50,000 the collector keeps doing its job (objects in reference cycles are
still collected, only in bigger batches) at a fraction of the cost.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

BUSY_THRESHOLDS = (50_000, 20, 100)


def tune_for_busy_process() -> None:
    """For a process that runs scheduling work for its whole life (a service's `main`)."""
    gc.set_threshold(*BUSY_THRESHOLDS)


@contextmanager
def busy_collection() -> Iterator[None]:
    """The busy thresholds for the duration of the block (a replay); the caller's are restored."""
    before = gc.get_threshold()
    gc.set_threshold(*BUSY_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
