"""The live services' three steps, each a named configuration of the one scheduling cycle.

Why: quota, placement and preemption are separate services that decide one after the other on the
same state; what each step sees and decides is written once, here, so that the services, the
simulator's pipeline mode and the tests ask the core the same way. Each step is named here, with the
one config it derives from the cluster's policy:
- `Step.QUOTA`: `corral.core.reservation.reserve_quota`, with the policy as it is (the config of
  the preemption whose decisions must not undo its reservations);
- `Step.PLACEMENT` (`placement_step`): the cycle with preemption, reclaim and quota checks off,
  over the waiting jobs that hold quota: the same order and backfill, `max_gpus` still enforced;
- `Step.PREEMPTION` (`preemption_step`): the full cycle over every waiting job; only its Preempt
  decisions are acted on.
`corral.core.pipeline.run_round` runs the three in a row, as the services do; `StepMemos` is what
a caller asking them about one state in a row keeps between the asks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from enum import StrEnum

from corral.core.cycle import schedule
from corral.core.decisions import Decision, Pending, Preempt
from corral.core.kept_preemption import KeptPreemption, started_job
from corral.core.model import Placement, SchedulerConfig, Snapshot
from corral.core.running_parts import RunningParts
from corral.core.shortcuts import ClassMemo


class Step(StrEnum):
    """The services that decide, in the order they act on a waiting job."""

    QUOTA = "quota"
    PLACEMENT = "placement"
    PREEMPTION = "preemption"


def step_config(step: Step, config: SchedulerConfig) -> SchedulerConfig:
    """What `step` decides with under the cluster's policy `config`."""
    if step is Step.PLACEMENT:
        return dataclasses.replace(config, preemption=False, reclaim=False, quotas=False)
    return config


def placement_step(
    snapshot: Snapshot,
    config: SchedulerConfig,
    *,
    holding: Collection[str] | None = None,
    explain: bool = True,
    memo: ClassMemo | None = None,
) -> list[Decision]:
    """Placement's decisions: the cycle in its placement configuration over the waiting jobs of
    `snapshot` that hold quota (`holding`; None: every waiting job of the snapshot does)."""
    if holding is not None:
        pending = tuple(p for p in snapshot.pending if p.job.id in holding)
        snapshot = Snapshot(snapshot.now, snapshot.cluster, snapshot.queues, pending, snapshot.running)
    return schedule(snapshot, step_config(Step.PLACEMENT, config), explain=explain, memo=memo)


def preemption_step(snapshot: Snapshot, config: SchedulerConfig, *, memo: ClassMemo | None = None) -> list[Preempt]:
    """Preemption's decisions: the full cycle over every waiting job; only the Preempts (the core
    may skip explaining the jobs that stay pending)."""
    return [d for d in schedule(snapshot, step_config(Step.PREEMPTION, config), explain=False, memo=memo)
            if isinstance(d, Preempt)]


class StepMemos:
    """A caller's memos for the placement and preemption steps (each step's own `ClassMemo`, as
    each service keeps one), and the last answer of each step on one snapshot.

    Why: the quota step plays placement and preemption out on the round's snapshot
    (`reservation.reserve_quota`), and the round then asks the same two steps, often with the
    inputs its last play had; the core is pure, so an answer on equal inputs is reused. The
    preemption step runs on state kept between the asks (`kept_preemption.KeptPreemption`)."""

    __slots__ = ("_kept", "_placed", "_preempts", "placement", "preemption")

    def __init__(self) -> None:
        self.placement = ClassMemo()
        self.preemption = ClassMemo()
        self._placed: tuple[Snapshot, frozenset[str], bool, list[Decision]] | None = None
        self._preempts: tuple[Snapshot, tuple[tuple[str, Placement], ...], list[Preempt]] | None = None
        self._kept = KeptPreemption()

    def place(self, snapshot: Snapshot, config: SchedulerConfig, holding: Collection[str], *,
              explain: bool = True) -> list[Decision]:
        """`placement_step(snapshot, config, holding=holding, explain=explain)`; an explained
        answer serves an unexplained ask too (its actions are the same, `schedule`)."""
        key = frozenset(holding)
        last = self._placed
        if last is not None and last[0] is snapshot and last[1] == key and (last[2] or not explain):
            return last[3] if explain or not last[2] else [d for d in last[3] if not isinstance(d, Pending)]
        self._parts(snapshot)
        out = placement_step(snapshot, config, holding=key, explain=explain, memo=self.placement)
        self._placed = (snapshot, key, explain, out)
        return out

    def preempt(self, snapshot: Snapshot, config: SchedulerConfig, placed: Mapping[str, Placement]) -> list[Preempt]:
        """`preemption_step(after_placing(snapshot, placed, config), config)`."""
        key = tuple(placed.items())
        last = self._preempts
        if last is not None and last[0] is snapshot and last[1] == key:
            return last[2]
        out = self._kept.decide(snapshot, config, placed)
        self._preempts = (snapshot, key, out)
        return out

    def _parts(self, snapshot: Snapshot) -> RunningParts:
        """The running jobs' parts of `snapshot`, one for both steps' memos: they read no step's
        config but the tree's, which they keep per config (`RunningParts.tree`)."""
        parts = RunningParts.of(snapshot, self.preemption)
        self.placement.running = parts
        return parts


def after_placing(snapshot: Snapshot, placed: Mapping[str, Placement], config: SchedulerConfig) -> Snapshot:
    """The state once the jobs of `placed` (in its order) run from `snapshot.now`: what the next
    step sees (a promoted job runs with its promotion, `levels.started_promotion`)."""
    by_id = {p.job.id: p for p in snapshot.pending}
    started = tuple(started_job(by_id[i], placement, snapshot.now, config) for i, placement in placed.items())
    waiting = tuple(p for p in snapshot.pending if p.job.id not in placed)
    return Snapshot(snapshot.now, snapshot.cluster, snapshot.queues, waiting, snapshot.running + started)

