"""A class's shared RESERVED_FOR answer is reworded per job when it is the backfill reservation's;
the guarantee hold is RESERVED_FOR too, and counts the GPUs the starved guaranteed jobs are owed,
which grow while the state version does not: a class shares it only at the count it was given at."""

from __future__ import annotations

import random

from corral.core import Cluster, QueueConfig, SchedulerConfig, reasons, schedule
from corral.core.backfill import Reservation
from corral.core.cycle import Cycle

from .builders import job as gang
from .builders import running, snapshot
from .test_core_properties import random_job


class _PlainCycle(Cycle):
    """Every job decided in full: no class answers."""

    def class_of(self, p: object) -> None:
        return None


def test_only_the_backfill_reservations_reason_names_the_reservation() -> None:
    rng = random.Random(7)
    job, holder, starving = (random_job(rng, i, 0.0, ["a", "b"], False) for i in range(3))
    held = Reservation(holder.id, 120.0, ((0, 0b11),), 2, True)
    assert reasons.names_the_reservation(reasons.reserved_for(job, held, 0.0))
    hold = reasons.held_for_guarantee(job, 9, starving, 11)
    assert hold.code is reasons.ReasonCode.RESERVED_FOR and not reasons.names_the_reservation(hold)


def test_a_guarantee_hold_counts_the_guaranteed_jobs_starved_before_each_job_of_a_class() -> None:
    """Fair-share order a1, c1, a2, c2: a1 and a2 (queue a, under its guarantee) do not fit the 3
    free GPUs and starve; c1 and c2 (one class, borrowing) are refused the free GPUs a1, then a1
    and a2, are owed. Starving changes no GPUs, so c2 meets the state c1 was answered at; its
    answer still counts a2."""
    cluster = Cluster.uniform(1, 8, "H100")
    queues = [QueueConfig("a", guaranteed_gpus=4), QueueConfig("b", guaranteed_gpus=4), QueueConfig("c")]
    run = [running(gang("r", gpus=5, queue="b", preemptible=False), [("n000", tuple(range(5)))])]
    pend = [gang("a1", gpus=4, queue="a", submit_time=0.0), gang("c1", queue="c", submit_time=1.0),
            gang("a2", gpus=4, queue="a", submit_time=2.0), gang("c2", queue="c", submit_time=3.0)]
    for config in (SchedulerConfig(), SchedulerConfig(backfill=False)):
        snap = snapshot(cluster, pend, run, queues)
        decisions = schedule(snap, config)
        assert decisions == _PlainCycle.of(snap, config).run()
        held = {d.job_id: dict(d.reason.details) for d in decisions if d.job_id in ("c1", "c2")}
        assert held["c1"]["owed_gpus"] == 4 and held["c2"]["owed_gpus"] == 8
        assert held["c1"]["reserved_gpus"] == held["c2"]["reserved_gpus"] == 3  # the free GPUs
