"""An empty `corral jobs` says where the jobs went.

Why: after `make demo` every example has ended, and the README points a newcomer at `corral jobs`:
a table of headers only reads as "the cluster lost my jobs". squeue prints the bare header too;
Corral says one line more, on stderr (the table and `--json` are unchanged).
"""

from __future__ import annotations

from corral.cli.jobs import empty_listing_hint


def test_an_empty_listing_of_active_jobs_points_at_all() -> None:
    hint = empty_listing_hint([], all_jobs=False, states=None)
    assert hint is not None and "corral jobs --all" in hint


def test_nothing_is_added_when_there_are_rows_or_the_listing_was_asked_otherwise() -> None:
    assert empty_listing_hint([{"id": "j1"}], all_jobs=False, states=None) is None
    assert empty_listing_hint([], all_jobs=True, states=None) is None
    assert empty_listing_hint([], all_jobs=False, states={"FAILED"}) is None
