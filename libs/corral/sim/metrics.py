"""Summary figures of a simulated schedule, computed only from the job records (the `jobs` JSON).

Why only from records: anyone holding the JSON output can recompute every figure, and the same
function scores every policy, so a comparison can't be skewed by engine internals.

Definitions (repeated in the report so that numbers are never ambiguous):
- JCT = end - submit of finished jobs; wait = first start - submit of started jobs.
- makespan = last end (the first submission is at 0).
- utilisation = GPU-seconds held by jobs (grace included) / (cluster GPUs x makespan).
- tight placement: a multi-GPU job whose every placement sits inside the tightest unit that could
  ever hold it (one NVLink domain, else one node, else one rack, else one zone).
- fairness: at every instant some job waits, each queue's fair share is the capacity divided by
  water-filling (first its guarantee, then the surplus by weight), never more than its demand
  (GPUs of its submitted, unfinished jobs). Jain's index of allocation / fair share over the queues
  with demand, averaged over the time with a waiting job. 1.0 is perfectly fair.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from corral.core import Cluster, QueueConfig
from corral.sim.records import Interval, JobRecord

LEVELS = ("nvlink", "node", "rack", "zone", "cluster")


@dataclass(frozen=True, slots=True)
class QueueFigures:
    """One queue's GPU-time against what it is entitled to."""

    name: str
    jobs: int
    gpu_seconds: float
    share_of_gpu_time: float
    entitlement: float
    mean_fair_share_ratio: float | None
    avg_jct: float | None


@dataclass(frozen=True, slots=True)
class Summary:
    jobs: int
    finished: int
    never_started: int
    avg_duration: float
    avg_jct: float
    p50_jct: float
    p95_jct: float
    p99_jct: float
    avg_wait: float
    p99_wait: float
    makespan: float
    capacity_gpus: int
    gpu_utilisation: float
    multi_gpu_jobs: int
    tight_placement_share: float
    preemptions: int
    preempted_jobs: int
    gpu_seconds_lost_to_preemption: float
    jain_fairness: float
    contended_seconds: float
    queues: tuple[QueueFigures, ...]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["queues"] = [asdict(q) for q in self.queues]
        return out


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of sorted `values` (0.0 when empty): deterministic, no interpolation."""
    if not values:
        return 0.0
    rank = max(1, math.ceil(pct / 100.0 * len(values)))
    return values[min(rank, len(values)) - 1]


def summarize(records: Sequence[JobRecord], cluster: Cluster, queues: Sequence[QueueConfig]) -> Summary:
    """All summary figures of one schedule (see the module docstring for the definitions)."""
    finished = [r for r in records if r.end is not None]
    started = [r for r in records if r.start is not None]
    jcts = sorted(r.end - r.submit for r in finished if r.end is not None)
    waits = sorted(r.start - r.submit for r in started if r.start is not None)
    makespan = max((r.end for r in finished if r.end is not None), default=0.0)
    makespan = max(makespan, max((p.end for r in records for p in r.placements), default=0.0))
    capacity = cluster.total_gpus
    held = sum((p.end - p.start) * p.gpu_count for r in records for p in r.placements)
    multi = [r for r in records if r.gpus > 1 and r.placements]
    tightness = _Tightness(cluster)
    tight = sum(1 for r in multi if all(tightness.is_tight(p, r.gpus) for p in r.placements))
    jain, contended, ratios = fairness(records, capacity, queues)
    return Summary(
        jobs=len(records),
        finished=len(finished),
        never_started=len(records) - len(started),
        avg_duration=_mean([r.duration for r in records]),
        avg_jct=_mean(jcts),
        p50_jct=percentile(jcts, 50),
        p95_jct=percentile(jcts, 95),
        p99_jct=percentile(jcts, 99),
        avg_wait=_mean(waits),
        p99_wait=percentile(waits, 99),
        makespan=makespan,
        capacity_gpus=capacity,
        gpu_utilisation=held / (capacity * makespan) if capacity and makespan else 0.0,
        multi_gpu_jobs=len(multi),
        tight_placement_share=tight / len(multi) if multi else 1.0,
        preemptions=sum(r.preemptions for r in records),
        preempted_jobs=sum(1 for r in records if r.preemptions),
        gpu_seconds_lost_to_preemption=sum(r.lost_gpu_seconds for r in records),
        jain_fairness=jain,
        contended_seconds=contended,
        queues=_queue_figures(records, queues, capacity, ratios, held),
    )


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def entitlements(names: Sequence[str], queues: Sequence[QueueConfig]) -> dict[str, tuple[float, float]]:
    """Queue -> (guaranteed GPUs, weight); a queue missing from the config has no guarantee, weight 1."""
    by_name = {q.name: q for q in queues}
    return {n: (float(by_name[n].guaranteed_gpus), by_name[n].weight) if n in by_name else (0.0, 1.0) for n in names}


def fair_shares(
    capacity: float, demand: Sequence[float], guaranteed: Sequence[float], weight: Sequence[float]
) -> list[float]:
    """Water-filling: each queue first gets min(demand, guarantee), the rest is shared by weight
    among queues that still want more, never above a queue's demand."""
    share = [min(d, g) for d, g in zip(demand, guaranteed, strict=True)]
    left = capacity - sum(share)
    hungry = [i for i, d in enumerate(demand) if d > share[i]]
    while left > 1e-9 and hungry:
        total = sum(weight[i] for i in hungry)
        still = []
        spent = 0.0
        for i in hungry:
            give = left * weight[i] / total
            room = demand[i] - share[i]
            if give >= room:
                share[i] = demand[i]
                spent += room
            else:
                share[i] += give
                spent += give
                still.append(i)
        left -= spent
        if len(still) == len(hungry):
            break
        hungry = still
    return share


def fairness(
    records: Sequence[JobRecord], capacity: int, queues: Sequence[QueueConfig]
) -> tuple[float, float, dict[str, float | None]]:
    """(time-averaged Jain's index, seconds with a waiting job, queue -> mean allocation/fair share)."""
    names = sorted({r.queue for r in records})
    index = {n: i for i, n in enumerate(names)}
    ent = entitlements(names, queues)
    guaranteed = [ent[n][0] for n in names]
    weight = [ent[n][1] for n in names]
    # (time, kind, queue, gpus): kind 0 = demand change, 1 = allocation change.
    events: list[tuple[float, int, int, int]] = []
    for r in records:
        q = index[r.queue]
        events.append((r.submit, 0, q, r.gpus))
        if r.end is not None:
            events.append((r.end, 0, q, -r.gpus))
        for p in r.placements:
            events.append((p.start, 1, q, p.gpu_count))
            events.append((p.end, 1, q, -p.gpu_count))
    events.sort()
    n = len(names)
    demand = [0] * n
    alloc = [0] * n
    weighted_jain = 0.0
    contended = 0.0
    ratio_time = [0.0] * n
    ratio_sum = [0.0] * n
    i = 0
    while i < len(events):
        now = events[i][0]
        while i < len(events) and events[i][0] == now:
            _, kind, q, delta = events[i]
            if kind == 0:
                demand[q] += delta
            else:
                alloc[q] += delta
            i += 1
        if i == len(events):
            break
        span = events[i][0] - now
        if span <= 0 or not any(demand[k] > alloc[k] for k in range(n)):
            continue
        fair = fair_shares(float(capacity), demand, guaranteed, weight)
        xs = []
        for k in range(n):
            if fair[k] > 0:
                x = alloc[k] / fair[k]
                xs.append(x)
                ratio_sum[k] += x * span
                ratio_time[k] += span
        square = sum(x * x for x in xs)
        if not xs or square == 0:
            continue
        weighted_jain += (sum(xs) ** 2 / (len(xs) * square)) * span
        contended += span
    jain = weighted_jain / contended if contended else 1.0
    ratios = {nm: (ratio_sum[k] / ratio_time[k] if ratio_time[k] else None) for nm, k in index.items()}
    return jain, contended, ratios


def _queue_figures(
    records: Sequence[JobRecord],
    queues: Sequence[QueueConfig],
    capacity: int,
    ratios: dict[str, float | None],
    held: float,
) -> tuple[QueueFigures, ...]:
    names = sorted({r.queue for r in records})
    ent = entitlements(names, queues)
    total_guaranteed = sum(g for g, _ in ent.values())
    total_weight = sum(w for _, w in ent.values())
    out = []
    for name in names:
        mine = [r for r in records if r.queue == name]
        seconds = sum((p.end - p.start) * p.gpu_count for r in mine for p in r.placements)
        g, w = ent[name]
        entitled = g / total_guaranteed if total_guaranteed else w / total_weight
        jcts = [r.end - r.submit for r in mine if r.end is not None]
        out.append(
            QueueFigures(
                name=name,
                jobs=len(mine),
                gpu_seconds=seconds,
                share_of_gpu_time=seconds / held if held else 0.0,
                entitlement=entitled,
                mean_fair_share_ratio=ratios.get(name),
                avg_jct=_mean(jcts) if jcts else None,
            )
        )
    return tuple(out)


class _Tightness:
    """The loosest unit each placement spans vs the tightest unit that could ever hold the job."""

    def __init__(self, cluster: Cluster) -> None:
        self._domain: dict[tuple[str, int], int] = {}
        self._rack: dict[str, str] = {}
        self._zone: dict[str, str] = {}
        rack_gpus: dict[str, int] = {}
        zone_gpus: dict[str, int] = {}
        biggest_domain = biggest_node = 0
        for node in cluster.nodes:
            self._rack[node.name] = node.rack
            self._zone[node.name] = node.zone
            for gpu in node.gpus:
                self._domain[(node.name, gpu.index)] = gpu.nvlink_domain
            for members in node.domains().values():
                biggest_domain = max(biggest_domain, len(members))
            biggest_node = max(biggest_node, node.gpu_count)
            rack_gpus[node.rack] = rack_gpus.get(node.rack, 0) + node.gpu_count
            zone_gpus[node.zone] = zone_gpus.get(node.zone, 0) + node.gpu_count
        self._capacity = (
            biggest_domain,
            biggest_node,
            max(rack_gpus.values(), default=0),
            max(zone_gpus.values(), default=0),
        )
        self._cache: dict[int, int] = {}

    def tightest_possible(self, gpus: int) -> int:
        level = self._cache.get(gpus)
        if level is None:
            level = next((i for i, cap in enumerate(self._capacity) if gpus <= cap), len(self._capacity))
            self._cache[gpus] = level
        return level

    def level(self, placement: Interval) -> int:
        nodes = {r.node for r in placement.ranks}
        if len(nodes) == 1:
            node = next(iter(nodes))
            domains = {self._domain.get((node, g)) for r in placement.ranks for g in r.gpus}
            return 0 if len(domains) == 1 else 1
        if len({self._rack.get(n) for n in nodes}) == 1:
            return 2
        return 3 if len({self._zone.get(n) for n in nodes}) == 1 else 4

    def is_tight(self, placement: Interval, gpus: int) -> bool:
        return self.level(placement) <= self.tightest_possible(gpus)
