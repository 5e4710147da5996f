"""The bus refuses inbox subjects no service reads, and remembers the ones it found read.

Why: matching every publish of a node agent's report against every inbox pattern, rebuilding the
list of patterns each time, is a visible share of the agents' process in a busy replay. Approved
subjects are remembered; a refused one is refused each time.
"""

from __future__ import annotations

import re

import pytest

from corral.bus import bus as bus_module
from corral.bus.bus import Bus
from corral.bus.naming import Namespace


class _NoNats:
    def jetstream(self) -> None:
        return None


def _bus() -> Bus:
    return Bus(_NoNats(), Namespace("t"))


def test_a_read_inbox_subject_is_checked_once_then_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    bus = _bus()
    calls = []
    real = bus.inbox_subjects
    monkeypatch.setattr(bus, "inbox_subjects", lambda: calls.append(1) or real())
    subject = "t.inbox.node.n1.WorkerStarted"
    for _ in range(5):
        bus._check_subject(subject)
    assert len(calls) == 1
    bus._check_subject("t.events.JobSubmitted")  # not an inbox subject: nothing to check
    assert len(calls) == 1


def test_an_unread_inbox_subject_is_refused_every_time() -> None:
    bus = _bus()
    for _ in range(2):
        with pytest.raises(ValueError, match=re.escape("no Corral service reads 't.inbox.node.n1.Nonsense'")):
            bus._check_subject("t.inbox.node.n1.Nonsense")


def test_the_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bus_module, "_READABLE_KEPT", 3)
    bus = _bus()
    for n in range(10):
        bus._check_subject(f"t.inbox.node.n{n}.WorkerExited")
    # full at 3: forgotten before the 4th, the 7th and the 10th subject were remembered
    assert bus._readable_inbox == {"t.inbox.node.n9.WorkerExited"}
