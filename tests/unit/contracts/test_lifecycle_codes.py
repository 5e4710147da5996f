"""The lifecycle codes and worker exit codes of the contracts are the ones the worker and the log use."""

from __future__ import annotations

import corral.worker
from corral.contracts.envelope import Reason
from corral.contracts.lifecycle import LifecycleCode, WorkerExit


def test_the_worker_helper_exits_with_the_contract_checkpointed_code() -> None:
    # corral.worker re-exports the worker protocol of the contracts (tests/unit/test_import_contracts.py)
    assert corral.worker.CHECKPOINTED_EXIT_CODE == WorkerExit.CHECKPOINTED == 85
    assert WorkerExit.COMPLETED == 0


def test_every_lifecycle_code_is_a_valid_wire_reason_code_and_only_restarting_uses_a_restart() -> None:
    for code in LifecycleCode:
        assert Reason(code=code.value, message="m").code == code
    assert [c for c in LifecycleCode if c.uses_a_restart] == [LifecycleCode.RESTARTING]
