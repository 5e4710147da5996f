"""One decision round of the live services: quota reserves, placement places, preemption preempts.

Why: the live system does not run the single combined cycle (`schedule` with the full policy,
where quota, placement and preemption are decided for each job together). Three services decide
one after the other, each on the state the previous one leaves, and quota reserved for a job that
cannot start yet holds its queue's share until it starts; the combined cycle alone cannot show
what the split does to a schedule. `run_round` is that round, built from the named steps of `corral.core.steps`:
1. quota: `reserve_quota` over every waiting job not holding quota yet (`holding` already do;
   one that would be started and taken back at once gives its quota back: `Revoke`);
2. placement: `placement_step` over the jobs holding quota, this round's reservations included;
3. preemption: `preemption_step` on the state where those placements run.
The simulator's pipeline mode (`corral.sim.engine.Simulator(pipeline=True)`) applies its Place and
Preempt decisions; tests/unit/sim/test_pipeline_agreement.py states where it and the combined
cycle must agree.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from corral.core.backlog import Backlog
from corral.core.decisions import Pending, Place, Preempt
from corral.core.model import SchedulerConfig, Snapshot
from corral.core.reservation import Reserve, Revoke, reserve_quota
from corral.core.steps import StepMemos


@dataclass(frozen=True, slots=True)
class Round:
    """What each step decided: quota's Reserve / Pending per job it looked at, placement's Place
    decisions, preemption's Preempt decisions."""

    quota: tuple[Reserve | Pending | Revoke, ...]
    placed: tuple[Place, ...]
    preempts: tuple[Preempt, ...]

    @property
    def reserved(self) -> frozenset[str]:
        """The jobs quota reserved for in this round."""
        return frozenset(d.job_id for d in self.quota if isinstance(d, Reserve))

    @property
    def revoked(self) -> frozenset[str]:
        """The jobs that held quota and give it back in this round (they would be taken back at once)."""
        return frozenset(d.job_id for d in self.quota if isinstance(d, Revoke))

    @property
    def victims(self) -> frozenset[str]:
        return frozenset(v for d in self.preempts for v in d.victims)


def run_round(
    snapshot: Snapshot,
    config: SchedulerConfig,
    *,
    holding: Collection[str] = frozenset(),
    held: Iterable[tuple[str, int]] = (),
    memos: StepMemos | None = None,
    explain: bool = True,
    backlog: Backlog | None = None,
) -> Round:
    """The three steps on `snapshot` under the policy `config`. `holding`: waiting jobs that hold
    quota from earlier rounds; `held`: (queue, GPUs) still reserved by jobs neither running nor
    waiting (see `reserve_quota`); `memos`: the caller's, kept from round to round as the
    services keep theirs (a fresh one if None); `explain`, `backlog`: quota's (`reserve_quota`).
    Placement does not explain the jobs it leaves waiting."""
    memos = memos if memos is not None else StepMemos()
    quota = reserve_quota(snapshot, config, reserved=holding, held=held, memos=memos, explain=explain,
                          backlog=backlog)
    holders = (set(holding) - {d.job_id for d in quota if isinstance(d, Revoke)}) | {
        d.job_id for d in quota if isinstance(d, Reserve)}
    placed = [d for d in memos.place(snapshot, config, holders, explain=False) if isinstance(d, Place)]
    preempts = memos.preempt(snapshot, config, {d.job_id: d.placement for d in placed})
    return Round(tuple(quota), tuple(placed), tuple(preempts))
