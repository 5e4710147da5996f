"""An independent checker of a simulated schedule: it reads only the `jobs` JSON and the cluster.

Why independent: the simulator and the core could share a bug; this module shares no code with
either (it re-derives everything from the recorded placements), so a schedule that passes here is
valid whatever the policy did. It checks that no GPU is held by two jobs at once, that every
placement has all its ranks with the right GPU counts on GPUs that exist, that hard topology holds,
and that times are consistent (no start before submit, intervals in order).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral.core import Cluster

LEVEL_NAMES = ("nvlink", "node", "rack", "zone")


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: which job, a stable code, and a message with the numbers."""

    job_id: str
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.job_id}: {self.code}: {self.message}"


def check_schedule(jobs_json: Sequence[Mapping[str, Any]] | Mapping[str, Any], cluster: Cluster) -> list[Violation]:
    """Every violation in the schedule (empty when valid). `jobs_json` is the `jobs` list of the
    simulator's JSON output, or the whole output document."""
    jobs = jobs_json["jobs"] if isinstance(jobs_json, Mapping) else jobs_json
    domain: dict[tuple[str, int], int] = {}
    rack: dict[str, str] = {}
    zone: dict[str, str] = {}
    for machine in cluster.nodes:
        rack[machine.name] = machine.rack
        zone[machine.name] = machine.zone
        for gpu in machine.gpus:
            domain[(machine.name, gpu.index)] = gpu.nvlink_domain
    violations: list[Violation] = []
    holders: dict[tuple[str, int], list[tuple[float, float, str]]] = {}
    for job in jobs:
        job_id = str(job["id"])
        replicas = int(job.get("replicas", 1))
        per_replica = int(job.get("gpus_per_replica", job["gpus"]))
        topology = job.get("topology") or {}
        if replicas * per_replica != int(job["gpus"]):
            violations.append(
                Violation(
                    job_id,
                    "SHAPE",
                    f"gpus={job['gpus']} but replicas x gpus_per_replica = {replicas}x{per_replica}",
                )
            )
        previous_end = float(job["submit"])
        placements = job.get("placements") or []
        for number, p in enumerate(placements):
            start, end = float(p["start"]), float(p["end"])
            where = f"placement {number} [{start}, {end})"
            if start < previous_end:
                what = "before submit" if number == 0 else "before the previous placement ended"
                violations.append(Violation(job_id, "TIME_ORDER", f"{where} starts {what} ({previous_end})"))
            if end < start:
                violations.append(Violation(job_id, "TIME_ORDER", f"{where} ends before it starts"))
            previous_end = end
            ranks = p.get("ranks") or []
            if len(ranks) != replicas:
                violations.append(
                    Violation(job_id, "MISSING_RANKS", f"{where} has {len(ranks)} ranks, the gang has {replicas}")
                )
            seen: set[tuple[str, int]] = set()
            for r, rank in enumerate(ranks):
                node = str(rank["node"])
                gpus = [int(g) for g in rank["gpus"]]
                if len(gpus) != per_replica:
                    violations.append(
                        Violation(job_id, "RANK_GPUS", f"{where} rank {r} has {len(gpus)} GPUs, asked {per_replica}")
                    )
                for g in gpus:
                    key = (node, g)
                    if key not in domain:
                        violations.append(Violation(job_id, "NO_SUCH_GPU", f"{where} rank {r} uses {node} GPU {g}"))
                        continue
                    if key in seen:
                        violations.append(Violation(job_id, "GPU_TWICE_IN_JOB", f"{where} uses {node} GPU {g} twice"))
                    seen.add(key)
                    if end > start:
                        holders.setdefault(key, []).append((start, end, job_id))
                if topology.get("replica") == "nvlink" and len({domain.get((node, g)) for g in gpus}) > 1:
                    violations.append(
                        Violation(
                            job_id,
                            "TOPOLOGY",
                            f"{where} rank {r} spans NVLink domains on {node} but replica=nvlink",
                        )
                    )
            gang = topology.get("gang")
            if gang and ranks:
                spread = _spread(ranks, domain, rack, zone)
                if spread > LEVEL_NAMES.index(gang):
                    violations.append(Violation(job_id, "TOPOLOGY", f"{where} spans beyond one {gang} (gang={gang})"))
        if placements:
            first, last = float(placements[0]["start"]), float(placements[-1]["end"])
            if job.get("start") is not None and float(job["start"]) != first:
                violations.append(Violation(job_id, "TIME_ORDER", f"start {job['start']} != first placement {first}"))
            if job.get("end") is not None and float(job["end"]) != last:
                violations.append(Violation(job_id, "TIME_ORDER", f"end {job['end']} != last placement end {last}"))
        elif job.get("start") is not None:
            violations.append(Violation(job_id, "MISSING_RANKS", "has a start but no placement"))
    for (host, g), spans in holders.items():
        spans.sort()
        for (_s1, e1, j1), (s2, _e2, j2) in itertools.pairwise(spans):
            if s2 < e1:
                violations.append(
                    Violation(
                        j2,
                        "GPU_DOUBLE_BOOKED",
                        f"{host} GPU {g} held by {j1} until {e1} and by {j2} from {s2}",
                    )
                )
    return violations


def _spread(
    ranks: Sequence[Mapping[str, Any]],
    domain: Mapping[tuple[str, int], int],
    rack: Mapping[str, str],
    zone: Mapping[str, str],
) -> int:
    """The tightest level (0 nvlink .. 3 zone, 4 = beyond) that holds every rank."""
    nodes = {str(r["node"]) for r in ranks}
    if len(nodes) == 1:
        node = next(iter(nodes))
        domains = {domain.get((node, int(g))) for r in ranks for g in r["gpus"]}
        return 0 if len(domains) == 1 else 1
    if len({rack.get(n) for n in nodes}) == 1:
        return 2
    return 3 if len({zone.get(n) for n in nodes}) == 1 else 4
