"""Whether a job reserved in a quota round could be preempted by a waiting job once it runs
(`corral.core.reservation`): kept apart so the round's module stays small."""

from __future__ import annotations

from collections.abc import Container, Mapping

from corral.core.model import Job, OrderPolicy, SchedulerConfig
from corral.core.quota import ROOT, QueueTree, QueueUsage


class Exposure:
    """Whether a job reserved this round could be preempted by a waiting job once it runs (a
    superset of what `preemption.eligibility.victim_kind` may accept, given queue usage `usage`):
    - a waiting job of higher priority in the same queue (priority preemption);
    - a queue on the job's path above its guarantee, with a waiting job in a sibling subtree of it
      (reclaim: that job may be entitled); a job of a queue with children (admission refuses
      those, the core does not) with a waiting job in a child subtree;
    - any job under LAS with preemption (attained service changes as jobs run), and under
      FAIR_LAS any job of a queue with a waiting job (its level may rise above theirs).
    A job that is not preemptible, or is protected by `min_runtime_seconds` right after its start,
    is never a victim in the round it starts."""

    def __init__(self, config: SchedulerConfig, tree: QueueTree, at: Mapping[str, int], top: Mapping[str, int]):
        """`at`: how many jobs wait per queue (those holding quota too), `top`: their highest
        priority per queue (`backlog.Backlog`)."""
        self.tree = tree
        self.any = config.preemption or config.reclaim
        self.las = config.preemption and config.order is OrderPolicy.LAS
        self.fair_las = config.preemption and config.order is OrderPolicy.FAIR_LAS
        self.priority = config.preemption
        self.reclaim = config.reclaim and config.quotas
        self.top_priority = top
        self.below: dict[str, int] = {}  # known waiting jobs per subtree (ROOT: all of them)
        self.at = at  # waiting jobs of each queue itself
        for q, n in at.items():
            if tree.known(q):
                for a in (*tree.path(q), ROOT):
                    self.below[a] = self.below.get(a, 0) + n

    def of(self, job: Job, usage: QueueUsage) -> bool:
        fixed = self.fixed(job)
        if fixed is not None:
            return fixed
        tree, below = self.tree, self.below
        return any(
            usage.active.get(q, 0) > tree.guarantee[q] and below.get(tree.parent(q), 0) > below.get(q, 0)
            for q in tree.path(job.queue)
        )

    def fixed(self, job: Job) -> bool | None:
        """`of`'s answer where it reads no usage; None: it reads the usage of the job's path."""
        if not self.any or not job.preemptible or job.min_runtime_seconds > 0:
            return False
        if self.las or (self.fair_las and self.at.get(job.queue, 0) > 0):
            return True
        if self.priority and self.top_priority.get(job.queue, job.priority) > job.priority:
            return True
        if not self.reclaim or not self.tree.known(job.queue):
            return False
        if self.below.get(job.queue, 0) > self.at.get(job.queue, 0):
            return True
        return None

    def over(self, queue: str) -> int | None:
        """For a queue that is a child of the root: `of` answers True for a job of it that `fixed`
        leaves to the usage once the queue's active usage is over this many GPUs (None: never)."""
        return self.tree.guarantee[queue] if self.below.get(ROOT, 0) > self.below.get(queue, 0) else None

    def among(self, jobs: Mapping[str, Job], but: Container[str], usage: QueueUsage) -> list[str]:
        """The ids of `jobs` (but those in `but`) that `of` answers True on `usage`, in their order:
        asked once per `key` (a round asks it of every job holding quota, again at every pass)."""
        answers: dict[Key, bool] = {}
        out = []
        for i, job in jobs.items():
            if i in but:
                continue
            k = key(job)
            answer = answers.get(k)
            if answer is None:
                answer = answers[k] = self.of(job, usage)
            if answer:
                out.append(i)
        return out


#: What `Exposure.of` reads of a job: its queue, priority, whether it is preemptible and whether a
#: min runtime protects it.
Key = tuple[str, int, bool, bool]


def key(job: Job) -> Key:
    return (job.queue, job.priority, job.preemptible, job.min_runtime_seconds > 0)


class Growing:
    """`Exposure.of` on a usage that only grows while it is asked (a quota pass adds each
    reservation): `of` is monotone in the usage (a queue over its guarantee stays over), so a
    True answer holds for every later job of the same `key`; a False one is asked again."""

    __slots__ = ("exposure", "usage", "yes")

    def __init__(self, exposure: Exposure, usage: QueueUsage) -> None:
        self.exposure, self.usage = exposure, usage
        self.yes: set[Key] = set()

    def __call__(self, job: Job) -> bool:
        k = key(job)
        if k in self.yes:
            return True
        if self.exposure.of(job, self.usage):
            self.yes.add(k)
            return True
        return False
