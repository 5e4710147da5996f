"""GpuLedger: which GPUs a cycle has handed out, and to whom -- the one home of the bitmask code.

Why: the cycle keeps four GPU books -- free GPUs (the FreeGpus index), GPUs being released
by preempted jobs, GPUs claimed for a job that waits for those releases, and the jobs picked as
victims -- and the bit arithmetic that moves GPUs between them belongs in one place, not
written out at each step (placing, waiting for releasing GPUs, committing a preemption plan,
planning one). Like Volcano's
Statement for a gang, the ledger owns the books and offers the moves:
- `take(placement)`: a placed gang takes its free GPUs;
- `claim(placement, victims)`: a job that waits holds its GPUs -- free ones are taken now, those
  being released (by earlier preemptions or by its own victims) are claimed; the victims' GPUs
  it does not need join the releasing pool;
- `fit_with_releasing(job)` and `avoiding(masks)`: what-ifs on the index, always rolled back;
- `give_back(stmt, masks)`: count held GPUs as free inside a what-if (plans and reservations);
- `add_masks(books, masks)`: add GPUs to a book (node index -> mask).
Every move makes the index operations in the cycle's order, so the simulator's schedules do not
depend on the ledger being a module of its own (the Philly replay's are byte-identical).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

from corral.core.gpuset import FreeGpus, Statement
from corral.core.model import Job, Placement, RunningJob
from corral.core.placement import placement_or_none

Masks = tuple[tuple[int, int], ...]


def add_masks(books: dict[int, int], masks: Iterable[tuple[int, int]]) -> None:
    """Add GPUs (node index, mask) to a book of GPUs per node."""
    for i, m in masks:
        books[i] = books.get(i, 0) | m


def give_back(stmt: Statement, masks: Iterable[tuple[int, int]]) -> None:
    """Inside a what-if, count the GPUs of `masks` that the index holds as free."""
    fi = stmt.index
    for i, m in masks:
        give = m & ~fi.free[i] & fi.usable_masks[i]
        if give:
            stmt.give(i, give)


class GpuLedger:
    """The cycle's GPU books: `fi` (free), `releasing` and `claimed` (node index -> GPU mask) and
    `victims` (job ids asked to checkpoint this cycle). GPUs of jobs asked to checkpoint are still
    taken in `fi`, will be free soon, and may be claimed by one waiting job."""

    __slots__ = ("claimed", "fi", "releasing", "victims")

    def __init__(self, fi: FreeGpus, releasing: dict[int, int]) -> None:
        self.fi = fi
        self.releasing = releasing
        self.claimed: dict[int, int] = {}
        self.victims: set[str] = set()

    def masks_of(self, placement: Placement) -> Masks:
        return self.fi.masks_of(placement)

    def releasing_count(self) -> int:
        return sum(m.bit_count() for m in self.releasing.values())

    def take(self, placement: Placement) -> Masks:
        """A placed gang takes its GPUs (all free); returns them per node."""
        masks = self.fi.masks_of(placement)
        for i, m in masks:
            self.fi.take(i, m)
        return masks

    def fit_with_releasing(self, job: Job) -> Placement | None:
        """Where the job would fit once the releasing GPUs are free (the index is left as it was)."""
        if not self.releasing:
            return None
        if self.fi.total_free + self.releasing_count() < job.total_gpus:
            return None
        stmt = Statement(self.fi)
        try:
            for i, m in self.releasing.items():
                stmt.give(i, m)
            return placement_or_none(self.fi, job)
        finally:
            stmt.rollback()

    def claim(self, placement: Placement, victims: Sequence[RunningJob] = ()) -> tuple[int, bool]:
        """Hold `placement`'s GPUs for a job that waits: free ones are taken now, releasing ones
        (earlier preemptions' or `victims`', who are asked to checkpoint now) are claimed; victims'
        GPUs the placement does not need join the releasing pool. Returns (how many GPUs come from
        earlier releases, whether the releasing pool grew)."""
        fi, releasing, claimed = self.fi, self.releasing, self.claimed
        leaving: dict[int, int] = {}
        for v in victims:
            self.victims.add(v.job.id)
            add_masks(leaving, fi.masks_of(v.placement))
        coming = 0
        for i, m in fi.masks_of(placement):
            from_victims = m & leaving.get(i, 0)
            from_release = m & releasing.get(i, 0)
            if from_victims:
                leaving[i] &= ~from_victims
            if from_victims | from_release:
                claimed[i] = claimed.get(i, 0) | from_victims | from_release
            if from_release:
                coming += from_release.bit_count()
                releasing[i] &= ~from_release
                if not releasing[i]:
                    del releasing[i]
            hold = m & ~from_victims & ~from_release
            if hold:
                fi.take(i, hold)
        spare = {i: m for i, m in leaving.items() if m}
        add_masks(releasing, spare.items())
        return coming, bool(spare)

    @contextmanager
    def avoiding(self, masks: Masks | None) -> Iterator[None]:
        """While inside, the free GPUs of `masks` (a reservation's) count as taken."""
        hold = Statement(self.fi)
        fi = self.fi
        for i, m in masks or ():
            if m & fi.free[i]:
                hold.take(i, m & fi.free[i])
        try:
            yield
        finally:
            hold.rollback()
