"""The evidence gate's criteria: standing gates in the queues file, `--require` adding to them, and
no client able to record a verdict."""

from __future__ import annotations

import pytest

from corral.bus.auth import submitter
from corral.client import Client
from corral.contracts.problems import SpecError
from corral.contracts.queues import QueuesFile, gate_criteria, load_queues_text, parse_gate
from corral.contracts.subjects import ADMIN_REQUEST_TYPES, INBOX_TYPES, USER_REQUEST_TYPES, Subjects


def test_require_adds_criteria_and_never_removes_a_standing_one() -> None:
    standing = ["queue a p95_wait <= 2h"]
    assert gate_criteria(standing, None, []) == standing
    assert gate_criteria(standing, [], []) == standing  # a file that drops its gates still meets them
    added = gate_criteria(standing, ["queue b gpu_hours > 0"], [" queue a p95_wait <= 2h", "queue c preemptions <= 1"])
    assert added == ["queue a p95_wait <= 2h", "queue b gpu_hours > 0", "queue c preemptions <= 1"]


def test_a_queues_file_declares_standing_gates_and_a_bad_one_names_its_field() -> None:
    file = load_queues_text("gates: ['queue a p95_wait <= 2h']\nqueues:\n  - {name: a, guaranteed_gpus: 1}\n")
    assert isinstance(file, QueuesFile) and file.gates == ["queue a p95_wait <= 2h"]
    assert parse_gate(file.gates[0]).threshold == 7200.0
    with pytest.raises(SpecError) as err:
        load_queues_text("gates: ['a p95 <= 2h']\nqueues:\n  - {name: a}\n")
    assert err.value.problems[0].path == "gates[0]" and "queue NAME METRIC OP VALUE" in err.value.problems[0].message


def test_a_client_cannot_record_a_refusal_or_a_pass() -> None:
    """Quota alone records QueueChangeRefused; a request's `evidence` is never read (quota replays
    the log itself: tests/e2e/test_queue_versions.py sends one that lies)."""
    assert "QueueChangeRefused" not in INBOX_TYPES
    assert "QueueChangeRefused" not in ADMIN_REQUEST_TYPES + USER_REQUEST_TYPES
    with pytest.raises(ValueError, match="not an admin request"):
        Subjects().admin_request("root", "QueueChangeRefused")
    assert not hasattr(Client, "refuse_queues")
    admin = submitter("corral", "root", "secret", admin=True)
    assert not any(subject.endswith(".QueueChangeRefused") for subject in admin.publish)
