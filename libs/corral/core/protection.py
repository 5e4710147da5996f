"""A job swapped out many times keeps its GPUs longer: its protection from level preemption grows
with how often it has been preempted (FAIR_LAS, `SchedulerConfig.level_protection_seconds` and
`level_protection_count`).

Why: under FAIR_LAS each new job of a queue may preempt the queue's running jobs above level 0,
and the starvation limit brings them back, so in a queue whose new jobs keep coming a long job is
swapped out and in for weeks: each swap loses work and a wait of `starvation_limit` times the run
before it, and the schedule's last end is that job's. As Tiresias' demotion does not send a job
back down the levels it has left, a job preempted `n` times before is no level victim while its
current run is shorter than `level_protection_seconds` x (2**n - 1) (a job never preempted is not
protected), and from `level_protection_count` preemptions on (0: never) it is no level victim at
all: a waiting job of its queue takes its GPUs only when it ends. Priority and reclaim still take
it (a guarantee is restored whatever the victim's history).

The rule reads the count of a job's preemption times up to `COUNT_CAP` (past it the protection
outlasts any run), so a caller that trims a job's history keeps at least `times_read` of the
latest times.
"""

from __future__ import annotations

import math

from corral.core.model import OrderPolicy, RunningJob, SchedulerConfig

COUNT_CAP = 32  # 2**32 - 1 seconds outlast any run: counting further changes no answer


def times_read(config: SchedulerConfig) -> int:
    """How many of a job's latest preemption times the core reads: the budget's window and the
    protection's count."""
    protection = max(COUNT_CAP if config.level_protection_seconds > 0 else 0, config.level_protection_count)
    return max(config.preemption_budget, protection, 0)


def protected_for(preemptions: int, config: SchedulerConfig) -> float:
    """How long a run of a job preempted `preemptions` times before is no level victim (0: not
    protected, as outside FAIR_LAS or with the protection off; inf: for good)."""
    if preemptions <= 0 or config.order is not OrderPolicy.FAIR_LAS:
        return 0.0
    count = config.level_protection_count
    if 0 < count <= preemptions:
        return math.inf
    base = config.level_protection_seconds
    return base * (2.0 ** min(preemptions, COUNT_CAP) - 1.0) if base > 0 else 0.0


def level_protected(r: RunningJob, now: float, config: SchedulerConfig) -> bool:
    """Whether `r`'s current run is still too short to make it a level victim (module docstring)."""
    return now - r.start_time < protected_for(len(r.preempted_at), config)
