"""Admission's queue rules: who may submit to a queue, who may cancel (issue 12)."""

from __future__ import annotations

from types import SimpleNamespace

from corral.services.admission.service import cancel_denied, queue_access_refused


def test_a_user_not_listed_is_refused_an_admin_is_not() -> None:
    queue = SimpleNamespace(name="private", submitters=["carol"])
    refused = queue_access_refused(queue, "bob", frozenset())
    assert refused is not None and refused[1].code == "ACCESS_DENIED_QUEUE" and refused[0].path == "queue"
    assert queue_access_refused(queue, "carol", frozenset()) is None
    assert queue_access_refused(queue, "root", frozenset({"root"})) is None
    assert queue_access_refused(SimpleNamespace(name="open", submitters=None), "bob", frozenset()) is None


def test_only_the_owner_or_an_admin_cancels() -> None:
    assert cancel_denied("bob", "alice", frozenset()) is not None
    assert cancel_denied("alice", "alice", frozenset()) is None
    assert cancel_denied("root", "alice", frozenset({"root"})) is None
    assert cancel_denied(None, "alice", frozenset()) is None  # bare subject: superuser only
