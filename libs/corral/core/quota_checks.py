"""The quota round's checks of waiting jobs on the usage as a pass changes it (`corral.core.reservation`):
kept apart so the round's module stays small."""

from __future__ import annotations

from corral.core.decisions import Reason, ReasonCode
from corral.core.model import Job, SchedulerConfig, Snapshot
from corral.core.quota import QueueTree, QueueUsage, quota_check


class Checks:
    """`quota_check` of a job on `usage` as it stands, asked once per (queue, GPUs) until the usage
    changes (`usage_changed`): the check reads nothing else of the job (but its user, when a queue
    sets `max_gpus_per_user`: then once per (queue, GPUs, user)). A queue the check never refuses
    for its usage (`usage_blind`) is answered once for the whole pass.

    With a backlog of thousands behind a full cohort (Kueue's shape), a round asks the same
    question of every waiting job, twice (at its turn, then with the round's usage to word its
    reason): a few distinct answers per queue, remembered here; with queues that borrow without
    limit, every waiting job is reserved in turn and each reservation changes the usage."""

    def __init__(self, snapshot: Snapshot, config: SchedulerConfig, tree: QueueTree, usage: QueueUsage):
        self.snapshot, self.quotas, self.tree, self.usage = snapshot, config.quotas, tree, usage
        self.answers: dict[tuple[str, int, str | None], Reason | None] = {}
        self.fixed: dict[tuple[str, int, str | None], Reason | None] = {}  # of usage-blind queues
        self.blind: dict[str, bool] = {}
        self.by_user = tree.per_user  # the answer reads the job's user only then

    def __call__(self, job: Job) -> Reason | None:
        key = (job.queue, job.total_gpus, job.user if self.by_user else None)
        answer = self.fixed.get(key, _ASK)
        if answer is not _ASK:
            return answer
        try:
            return self.answers[key]
        except KeyError:
            answer = quota_check(self.snapshot, job, self.usage, tree=self.tree, quotas=self.quotas)
            blind = self.blind.get(job.queue)
            if blind is None:
                blind = self.blind[job.queue] = usage_blind(self.tree, job.queue)
            (self.fixed if blind else self.answers)[key] = answer
            return answer

    def usage_changed(self) -> None:
        self.answers.clear()


#: `_Checks.fixed` has no answer yet
_ASK = Reason(ReasonCode.QUOTA_EXCEEDED, "")


def usage_blind(tree: QueueTree, queue: str) -> bool:
    """Whether `quota_check` answers alike on any usage for the jobs of `queue`: an unknown queue,
    or one with no ceiling and no per-user ceiling on its path and that borrows without a lend
    limit at every level (`QueueTree.limited`)."""
    if not tree.known(queue):
        return True
    return (not tree.ceilings_of(queue) and not (tree.per_user and tree.user_ceilings_of(queue))
            and not any(tree.limited[q] for q in tree.path(queue)))
