"""Admission's queue rules: who may submit to a queue, who may cancel, and who a subject names."""

from __future__ import annotations

from types import SimpleNamespace

from corral.contracts.subjects import Subjects
from corral.services.admission.service import Sender, cancel_denied, queue_access_refused, sender_of


def test_a_user_not_listed_is_refused_an_admin_too() -> None:
    """An admin submits as a person (on its user subject): a queue that does not list it refuses it."""
    queue = SimpleNamespace(name="private", submitters=["carol"])
    refused = queue_access_refused(queue, "bob")
    assert refused is not None and refused[1].code == "ACCESS_DENIED_QUEUE" and refused[0].path == "queue"
    assert queue_access_refused(queue, "carol") is None
    assert queue_access_refused(queue, "root") is not None
    assert queue_access_refused(SimpleNamespace(name="open", submitters=None), "bob") is None


def test_only_the_owner_or_an_admin_cancels() -> None:
    assert cancel_denied(Sender("bob"), "alice") is not None
    assert cancel_denied(Sender("alice"), "alice") is None
    assert cancel_denied(Sender("root"), "alice") is not None  # the admin as a person (its user subject)
    assert cancel_denied(Sender("root", admin=True), "alice") is None  # on its admin subject
    assert cancel_denied(None, "alice") is None  # bare subject: superuser only


def test_admin_ness_comes_from_the_subject() -> None:
    subjects = Subjects("corral")
    assert sender_of(subjects, subjects.admin_request("root", "JobCancelRequested")) == Sender("root", admin=True)
    assert sender_of(subjects, subjects.user_request("root", "JobCancelRequested")) == Sender("root")
    assert sender_of(subjects, subjects.node_report("node-0", "WorkerExited")) is None
    assert sender_of(subjects, subjects.inbox("JobCancelRequested")) is None
    assert Sender("root", admin=True).actor == "admin/root" and Sender("bob").actor == "user/bob"
