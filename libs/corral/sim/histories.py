"""Each job's preemption history as the simulator hands it to the core: who preempted it
(`preempted_by`) and when (`preempted_at`).

Why trimmed: the core reads these only through rules that ignore most of a long history. A
preemptor that has finished is never again waiting or running, and every reader of `preempted_by`
asks about a waiting or running job (`eligibility.spared`, `victim_kind`, the kept state's
indices), so a finished preemptor is dropped from its victims' sets. `preempted_at` is read only by
`eligibility.budget_spent`, which asks whether `preemption_budget` of the times fall within the
window (the times come in order, so that holds exactly when it holds for the last `budget` times),
and by `protection.level_protected`, which counts them up to a cap: the last `protection.times_read`
of them are kept. A job preempted hundreds of times then costs the cycle and the kept state
what one preempted a few times costs. `full=True` keeps everything (a caller's own scheduler may
read more than the core does; tests compare the two).
"""

from __future__ import annotations


class PreemptionHistory:
    """Preemptors and preemption times per job, kept as far as the core reads them."""

    def __init__(self, keep: int, *, full: bool = False) -> None:
        self._full = full
        self._keep = max(keep, 0)
        self._by: dict[str, frozenset[str]] = {}
        self._at: dict[str, tuple[float, ...]] = {}
        self._named_by: dict[str, set[str]] = {}  # preemptor -> the jobs whose set names it
        self._finished: set[str] = set()

    def by(self, job_id: str) -> frozenset[str]:
        return self._by.get(job_id, frozenset())

    def at(self, job_id: str) -> tuple[float, ...]:
        return self._at.get(job_id, ())

    def asked(self, victim: str, now: float) -> None:
        """`victim` was asked to checkpoint and stop at `now` (times come in order)."""
        times = (*self._at.get(victim, ()), now)
        self._at[victim] = times if self._full else times[-self._keep:] if self._keep else ()

    def stopped_for(self, victim: str, preemptor: str) -> None:
        """`victim` gave its GPUs back to `preemptor`."""
        if preemptor in self._finished and not self._full:
            return
        self._by[victim] = self._by.get(victim, frozenset()) | {preemptor}
        self._named_by.setdefault(preemptor, set()).add(victim)

    def finished(self, job_id: str) -> None:
        """`job_id` completed: it is never waiting or running again."""
        if self._full:
            return
        self._finished.add(job_id)
        self._by.pop(job_id, None)
        self._at.pop(job_id, None)
        for victim in self._named_by.pop(job_id, ()):
            named = self._by.get(victim)
            if named is None:
                continue  # the victim finished first
            left = named - {job_id}
            if left:
                self._by[victim] = left
            else:
                del self._by[victim]
