"""Node conditions, as the kubelet's: a node short of disk or memory takes no new work.

A node agent measures its node (the free share of each folder it writes: run state, rank logs,
checkpoints; the memory available) and reports the conditions that hold (`pressures`, against
the thresholds of its options). A node under a condition is, to the cycle, a node that is
draining (`node_state`): what runs there goes on, nothing new is placed there. When the agent
measures the pressure gone, it reports no condition and the node takes work again: nobody has
to clear it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum

from corral.core.model import NodeState


class Condition(StrEnum):
    DISK_PRESSURE = "DiskPressure"
    MEMORY_PRESSURE = "MemoryPressure"


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Below these, a condition holds (the kubelet's `nodefs.available<10%`, `memory.available<100Mi`)."""

    disk_free_fraction: float = 0.10
    memory_available_mib: float = 256.0


@dataclass(frozen=True, slots=True)
class Sample:
    """What an agent measured: per folder (free bytes, total bytes); memory available (MiB), None: unknown."""

    disks: Mapping[str, tuple[int, int]]
    memory_available_mib: float | None = None


def pressures(sample: Sample, thresholds: Thresholds) -> dict[Condition, str]:
    """The conditions that hold, each with its words (folders in name order, the fullest named)."""
    held: dict[Condition, str] = {}
    short = sorted((free / total, folder, free) for folder, (free, total) in sample.disks.items()
                   if total > 0 and free / total < thresholds.disk_free_fraction)
    if short:
        share, folder, free = short[0]
        others = f" (and {len(short) - 1} more folder{'s' if len(short) > 2 else ''})" if len(short) > 1 else ""
        held[Condition.DISK_PRESSURE] = (f"{folder} has {share:.1%} free ({free >> 20} MiB), below "
                                         f"{thresholds.disk_free_fraction:.0%}{others}")
    memory = sample.memory_available_mib
    if memory is not None and memory < thresholds.memory_available_mib:
        held[Condition.MEMORY_PRESSURE] = (f"{memory:.0f} MiB of memory available, below "
                                           f"{thresholds.memory_available_mib:.0f} MiB")
    return held


def node_state(*, lost: bool, draining: bool, conditions: Collection[object]) -> NodeState:
    """How the cycle sees a node: lost; draining when drained or under any condition (no new work,
    what runs goes on); else ready."""
    if lost:
        return NodeState.LOST
    if draining or conditions:
        return NodeState.DRAINING
    return NodeState.READY
