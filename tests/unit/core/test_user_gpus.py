"""`max_gpus_per_user` (`corral.core.user_gpus`, asked by `quota_check`) against its plain definition.

Plain definition: a job of user U in queue Q waits MAX_GPUS_PER_USER exactly when some queue on
Q's path with a limit L has U's running jobs of its subtree holding more than L - the job's GPUs;
the queue named is the nearest such one. However the usage is built (from the running jobs at
once, job by job as the cycle adds them, or minus victims as a preemption search removes them),
the answer is the same; a tree without the limit never waits MAX_GPUS_PER_USER.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.core import (
    Cluster,
    Job,
    Placement,
    QueueConfig,
    QueueTree,
    QueueUsage,
    RankPlacement,
    ReasonCode,
    RunningJob,
    Snapshot,
    quota_check,
)
from corral.core.quota import ROOT
from corral.core.submit_limits import path_of

LEAVES = ("a/x", "a/y", "b")
USERS = ("alice", "bob", None)
CLUSTER = Cluster.uniform(4, 8, "H100")


def job(n: int, queue: str, gpus: int, user: str | None) -> Job:
    return Job(f"j{n}", queue, 1, gpus, submit_time=float(n), user=user)


def running(n: int, queue: str, gpus: int, user: str | None) -> RunningJob:
    return RunningJob(job(n, queue, gpus, user), Placement((RankPlacement(0, "n000", tuple(range(gpus))),)), 0.0)


def in_subtree(leaf: str, queue: str) -> bool:
    return leaf == queue or leaf.startswith(queue + "/")


limits = st.fixed_dictionaries({q: st.one_of(st.none(), st.integers(1, 12)) for q in ("a", "a/x", "a/y", "b")})
jobs = st.lists(st.tuples(st.sampled_from(LEAVES), st.integers(1, 8), st.sampled_from(USERS)), max_size=12)


@settings(max_examples=300)
@given(limits, jobs, st.tuples(st.sampled_from(LEAVES), st.integers(1, 8), st.sampled_from(USERS)))
def test_the_per_user_limit_is_its_plain_definition(table: dict[str, int | None],
                                                    held: list[tuple[str, int, str | None]],
                                                    new: tuple[str, int, str | None]) -> None:
    queues = tuple(QueueConfig(q, max_gpus_per_user=m) for q, m in table.items())
    runs = tuple(running(i, q, g, u) for i, (q, g, u) in enumerate(held))
    snapshot = Snapshot(0.0, CLUSTER, queues, (), runs)
    leaf, gpus, user = new
    wanted = job(99, leaf, gpus, user)
    over = [q for q in path_of(leaf) if user is not None and (m := table[q]) is not None
            and sum(g for lf, g, u in held if u == user and in_subtree(lf, q)) + gpus > m]
    tree = QueueTree(queues, CLUSTER.usable_gpus)
    built = [QueueUsage.of(tree, runs)]  # at once; job by job; with one more job then its removal
    one_by_one = QueueUsage(tree)
    for r in runs:
        one_by_one.add(r.job.queue, r.placement.gpu_count, user=r.job.user)
    built.append(one_by_one)
    extra = one_by_one.copy()
    extra.add("a/x", 3, user="alice")
    extra.add("a/x", -3, user="alice")
    built.append(extra)
    for usage in built:
        reason = quota_check(snapshot, wanted, usage, tree=tree, quotas=False)
        if over:
            assert reason is not None and reason.code is ReasonCode.MAX_GPUS_PER_USER
            assert reason.detail("queue") == over[0] and reason.detail("max_gpus_per_user") == table[over[0]]
        else:
            assert reason is None


def test_a_tree_without_the_limit_keeps_nothing_per_user() -> None:
    tree = QueueTree((QueueConfig("a", max_gpus=8),), 32)
    usage = QueueUsage.of(tree, (running(1, "a", 4, "alice"),))
    assert not tree.per_user and usage.users == {} and usage.held == {"a": 4}
    assert ROOT not in usage.held


def test_the_reason_names_the_user_the_limit_and_what_is_held() -> None:
    queues = (QueueConfig("team", max_gpus_per_user=8),)
    snapshot = Snapshot(0.0, CLUSTER, queues, (), (running(1, "team", 4, "alice"), running(2, "team", 4, "alice"),
                                                   running(3, "team", 8, "bob")))
    reason = quota_check(snapshot, job(9, "team", 4, "alice"))
    assert reason is not None and reason.code is ReasonCode.MAX_GPUS_PER_USER
    assert reason.message == ("user alice holds 8 GPUs in queue team, whose max_gpus_per_user is 8; "
                              "job needs 4 more")
    assert quota_check(snapshot, job(10, "team", 4, None)) is None  # no user: not limited
