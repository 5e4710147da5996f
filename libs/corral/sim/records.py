"""The exact schedule a simulation produced: one record per job with every placement interval.

Why this is its own module: the `jobs` part of the JSON output is a contract with people who check
a schedule independently (the checker in this package is one of them), so its shape is defined in
one place and read back by `records_from_json` without any engine state.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class RankRecord:
    """One rank of a placement: the node and the GPU indices it used."""

    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Interval:
    """A span of time during which the job held exactly these GPUs (`end` included the grace)."""

    start: float
    end: float
    ranks: tuple[RankRecord, ...]

    @property
    def gpu_count(self) -> int:
        return sum(len(r.gpus) for r in self.ranks)


@dataclass(slots=True)
class JobRecord:
    """What happened to one job; `start` is the first start, `end` the completion (None if never).

    `preemptions` counts runs stopped by the policy, `failures` runs stopped by a node failure;
    `lost_gpu_seconds` is the work both threw away (done since the last checkpoint)."""

    id: str
    queue: str
    gpus: int
    replicas: int
    gpus_per_replica: int
    priority: int
    submit: float
    duration: float
    topology: dict[str, str | None]
    start: float | None = None
    end: float | None = None
    preemptions: int = 0
    failures: int = 0
    lost_gpu_seconds: float = 0.0
    placements: list[Interval] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "queue": self.queue,
            "gpus": self.gpus,
            "replicas": self.replicas,
            "gpus_per_replica": self.gpus_per_replica,
            "priority": self.priority,
            "topology": self.topology,
            "submit": self.submit,
            "duration": self.duration,
            "start": self.start,
            "end": self.end,
            "preemptions": self.preemptions,
            "failures": self.failures,
            "lost_gpu_seconds": self.lost_gpu_seconds,
            "placements": [
                {
                    "start": p.start,
                    "end": p.end,
                    "ranks": [{"node": r.node, "gpus": list(r.gpus)} for r in p.ranks],
                }
                for p in self.placements
            ],
        }


def records_to_json(records: Iterable[JobRecord]) -> list[dict[str, Any]]:
    return [r.to_json() for r in records]


def records_from_json(jobs: Sequence[dict[str, Any]]) -> list[JobRecord]:
    """Read back the `jobs` list of a simulation's JSON output (missing optional fields default)."""
    out = []
    for raw in jobs:
        gpus = int(raw["gpus"])
        out.append(
            JobRecord(
                id=str(raw["id"]),
                queue=str(raw["queue"]),
                gpus=gpus,
                replicas=int(raw.get("replicas", 1)),
                gpus_per_replica=int(raw.get("gpus_per_replica", gpus)),
                priority=int(raw.get("priority", 0)),
                submit=float(raw["submit"]),
                duration=float(raw.get("duration", 0.0)),
                topology=dict(raw.get("topology") or {}),
                start=None if raw.get("start") is None else float(raw["start"]),
                end=None if raw.get("end") is None else float(raw["end"]),
                preemptions=int(raw.get("preemptions", 0)),
                failures=int(raw.get("failures", 0)),
                lost_gpu_seconds=float(raw.get("lost_gpu_seconds", 0.0)),
                placements=[
                    Interval(
                        float(p["start"]),
                        float(p["end"]),
                        tuple(RankRecord(str(r["node"]), tuple(int(g) for g in r["gpus"])) for r in p["ranks"]),
                    )
                    for p in raw.get("placements", ())
                ],
            )
        )
    return out
