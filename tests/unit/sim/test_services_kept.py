"""The simulator's services round, from inputs kept between rounds, decides at every round what
the round decides from that round's snapshot alone.

`corral.sim.services.ServicesRound` keeps the quota step's backlog (`KeptBacklog`, told each job
that came to wait, reserved, revoked or placed), a `SchedulerState` per step (`KeptSteps`, told
every change of the engine's jobs and cluster, moved to each ask's inputs) and the last tuple of
running jobs. At every round of random replays under every policy: its snapshot is the engine
state's, its backlog equals `Backlog.of(snapshot, holding)` (the plain definition), and its round
(reservations, revocations, placements, preemptions, in order) equals `run_round` on the snapshot
with fresh memos.
"""

from __future__ import annotations

from collections.abc import Collection
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.core import Decision, SchedulerConfig, Snapshot
from corral.core.backlog import Backlog
from corral.core.pipeline import Round, run_round
from corral.core.state import SchedulerState
from corral.core.steps import StepMemos
from corral.sim import services
from tests.unit.core.test_backlog_kept import same_backlog
from tests.unit.sim.test_pipeline_agreement import POLICIES, SETTINGS, replay, worlds


@SETTINGS
@given(world=worlds(), policy=st.sampled_from(POLICIES))
def test_the_kept_round_is_the_snapshots_at_every_round(world, policy) -> None:  # type: ignore[no-untyped-def]
    rounds = []
    states = []
    plain_run = services.ServicesRound.run

    def run(self: services.ServicesRound, now: float, state: SchedulerState) -> list[Decision]:
        states.append(state)
        return plain_run(self, now, state)

    def checked(snapshot: Snapshot, config: SchedulerConfig, *, holding: Collection[str], memos: StepMemos,
                explain: bool, backlog: Backlog) -> Round:
        assert isinstance(memos, services.KeptSteps) and not explain
        assert snapshot == states[-1].snapshot(snapshot.now)  # the running tuple kept is the state's
        same_backlog(backlog, Backlog.of(snapshot, holding))
        plain = run_round(snapshot, config, holding=frozenset(holding), explain=False)
        kept = run_round(snapshot, config, holding=holding, memos=memos, explain=False, backlog=backlog)
        assert (kept.reserved, kept.revoked, kept.placed, kept.preempts) == (
            plain.reserved, plain.revoked, plain.placed, plain.preempts)
        rounds.append(snapshot.now)
        return kept

    with mock.patch.object(services, "run_round", checked), mock.patch.object(services.ServicesRound, "run", run):
        replay(world, policy, "services")
    assert rounds


if __name__ == "__main__":
    pytest.main([__file__])
