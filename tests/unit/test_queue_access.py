"""Admission's queue rules: who may submit to a queue, and its highest priority (issue 12)."""

from __future__ import annotations

from types import SimpleNamespace

from corral.services.admission.service import cancel_denied, queue_access_refused


def test_a_user_not_listed_is_refused_an_admin_is_not() -> None:
    queue = SimpleNamespace(name="private", submitters=["carol"])
    refused = queue_access_refused(queue, "bob", 100, frozenset())
    assert refused is not None and refused[1].code == "ACCESS_DENIED_QUEUE" and refused[0].path == "queue"
    assert queue_access_refused(queue, "carol", 100, frozenset()) is None
    assert queue_access_refused(queue, "root", 100, frozenset({"root"})) is None
    assert queue_access_refused(SimpleNamespace(name="open", submitters=None), "bob", 100, frozenset()) is None


def test_a_priority_above_the_queues_top_is_refused() -> None:
    queue = SimpleNamespace(name="batch", submitters=None, max_priority=500)
    refused = queue_access_refused(queue, "bob", 900, frozenset())
    assert refused is not None and refused[1].code == "ACCESS_DENIED_PRIORITY" and refused[0].path == "priority"
    assert queue_access_refused(queue, "bob", 500, frozenset()) is None


def test_only_the_owner_or_an_admin_cancels() -> None:
    assert cancel_denied("bob", "alice", frozenset()) is not None
    assert cancel_denied("alice", "alice", frozenset()) is None
    assert cancel_denied("root", "alice", frozenset({"root"})) is None
    assert cancel_denied(None, "alice", frozenset()) is None  # bare subject: superuser only
