"""Preemption and reclaim: which running jobs to checkpoint so that a pending job fits.

Rules (the issue's, enforced here and checked by property tests):
- within a queue, only by strictly higher priority (a tie never preempts);
- across queues, only to reclaim guarantee: the preemptor stays within its guarantee, and victims
  come from sibling subtrees that are borrowing (over their own guarantee) at the moment each one
  is picked;
- under LAS, a job with much less attained service may preempt one with much more;
- never a victim: non-preemptible jobs, jobs younger than `min_runtime_seconds`, jobs already
  preempting, a job already preempted once by this preemptor, or the job that preempted it (no
  ping-pong), a job that spent its preemption budget (preempted `preemption_budget` times within
  `preemption_budget_seconds`: no loops);
- victims minimise lost work (GPU-seconds since their last checkpoint), then their number;
- never preempt unless the preemptor provably fits once the victims are gone: the placement is
  simulated on the index (Statement, rolled back) and the quota re-checked.

Cut as Kueue cuts it, one job per module:
    eligibility  the victim rule: who may be a victim of whom (the only place it is written)
    candidates   possible victims in cost order: per cycle (`Candidates`), per plan (lazily)
    search       `VictimSearch`: the cheapest victim set after which the job fits
    plan         `PreemptionPlan`, `plan_preemption` (the cycle's), `select_victims` (a service's)
    preemptors   `Preemptors`: whether any waiting job could preempt at all, kept as jobs come and go
"""

from corral.core.preemption.candidates import Candidates, victim_cost_key
from corral.core.preemption.eligibility import budget_spent, statically_eligible, victim_kind
from corral.core.preemption.plan import PreemptionPlan, plan_preemption, select_victims
from corral.core.preemption.preemptors import Preemptors

__all__ = [
    "Candidates",
    "PreemptionPlan",
    "Preemptors",
    "budget_spent",
    "plan_preemption",
    "select_victims",
    "statically_eligible",
    "victim_cost_key",
    "victim_kind",
]
