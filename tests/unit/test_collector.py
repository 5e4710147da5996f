"""The busy-process GC thresholds apply inside a replay and the caller's come back afterwards."""

from __future__ import annotations

import gc

import pytest

from corral.collector import BUSY_THRESHOLDS, busy_collection


def test_busy_collection_sets_the_busy_thresholds_and_restores_the_callers_even_on_error():
    before = gc.get_threshold()
    with busy_collection():
        assert gc.get_threshold() == BUSY_THRESHOLDS
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), busy_collection():
        raise RuntimeError("a replay failed")
    assert gc.get_threshold() == before
