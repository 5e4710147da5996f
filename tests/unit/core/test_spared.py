"""Who preempted whom, as a job's class reads it (`eligibility.spared`), against its definition.

A waiting job may never preempt a running job that preempted it, nor one it preempted before
(`victim_kind`). Its class carries only that set of running jobs, not its whole `preempted_by`:
jobs whose preemptors have ended are one class with the jobs never preempted, and share their
answers (the cycle's class answers are compared with deciding every job in full in
test_core_fast_paths.py, and the kept classes with the from-scratch ones in test_scheduler_state.py).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from corral.core import Cluster, PendingJob, QueueConfig, SchedulerConfig
from corral.core.preemption.eligibility import spared
from corral.core.prepared import prepare
from corral.core.shortcuts import ClassMemo

from .builders import job, running, snapshot

IDS = st.sampled_from([f"j{i}" for i in range(8)])


@given(preempted_by=st.frozensets(IDS), runs=st.lists(st.tuples(IDS, st.frozensets(IDS)), unique_by=lambda x: x[0]))
def test_spared_is_every_running_job_with_a_history_with_the_waiting_job(preempted_by, runs) -> None:
    p = PendingJob(job("w"), preempted_by=preempted_by)
    victims_of: dict[str, list[str]] = {}
    for rid, by in runs:
        for x in by | ({"w"} if rid.endswith("0") else set()):
            victims_of.setdefault(x, []).append(rid)
    running_by = {rid: by | ({"w"} if rid.endswith("0") else set()) for rid, by in runs}
    plain = {rid for rid, by in running_by.items() if "w" in by or rid in preempted_by}
    assert spared(p, running_by, victims_of) == plain


def test_jobs_whose_preemptors_ended_are_one_class_with_a_job_never_preempted() -> None:
    cluster = Cluster.uniform(1, 2, "H100")
    waiting = [PendingJob(job("a")), PendingJob(job("b"), preempted_by=frozenset({"gone"})),
               PendingJob(job("c"), preempted_by=frozenset({"x"}))]
    runs = [running(job("x"), [("n000", (0,))])]
    prepared = prepare(snapshot(cluster, waiting, runs, queues=[QueueConfig("q", 2)]), SchedulerConfig(), ClassMemo())
    assert prepared.spared == {"c": frozenset({"x"})}
    assert prepared.classes["a"] == prepared.classes["b"] != prepared.classes["c"]
