"""Node conditions, as the kubelet's: a node short of disk or memory takes no new work.

A node agent measures its node (the free share of each folder it writes: run state, rank logs,
checkpoints; the memory available) and reports the conditions that hold (`pressures`, against
the thresholds of its options). A node under a condition is, to the cycle, a node that is
draining (`node_state`): what runs there goes on, nothing new is placed there. When the agent
measures the pressure gone, it reports no condition and the node takes work again: nobody has
to clear it.

A condition enters below its threshold and clears only at or above a higher one, and only once
its measure has not been below the entry threshold for a hold time (`transition`; the kubelet's
`eviction-pressure-transition-period`): a node whose measure wavers at the threshold stays under
the condition instead of taking work, filling up and refusing it again at every measurement.
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
    """Below these, a condition holds (the kubelet's `nodefs.available<10%`, `memory.available<100Mi`);
    a held one clears at or above the clear thresholds (None: the entry one plus half of it, at most
    the entry one plus 10% of the disk) once `hold_seconds` have passed since it was last below."""

    disk_free_fraction: float = 0.10
    memory_available_mib: float = 256.0
    disk_clear_fraction: float | None = None
    memory_clear_mib: float | None = None
    hold_seconds: float = 0.0

    @property
    def disk_clear(self) -> float:
        if self.disk_clear_fraction is not None:
            return max(self.disk_clear_fraction, self.disk_free_fraction)
        return min(self.disk_free_fraction * 1.5, self.disk_free_fraction + 0.10)

    @property
    def memory_clear(self) -> float:
        if self.memory_clear_mib is not None:
            return max(self.memory_clear_mib, self.memory_available_mib)
        return self.memory_available_mib * 1.5


@dataclass(frozen=True, slots=True)
class Held:
    """A condition in force: its words, and when its measure was last below the entry threshold."""

    message: str
    below_at: float


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


def _above_clear(kind: Condition, sample: Sample, thresholds: Thresholds) -> bool:
    """Whether the measure of `kind` is at or above its clear threshold (an unknown one is: nothing
    says pressure, as `pressures` says)."""
    if kind is Condition.DISK_PRESSURE:
        return all(total <= 0 or free / total >= thresholds.disk_clear for free, total in sample.disks.values())
    memory = sample.memory_available_mib
    return memory is None or memory >= thresholds.memory_clear


def transition(held: Mapping[Condition, Held], sample: Sample, thresholds: Thresholds,
               now: float) -> dict[Condition, Held]:
    """The conditions in force after measuring `sample` at `now` (seconds), given those `held`
    before: each whose measure is below its entry threshold (`pressures`), and each held one whose
    measure is not yet at or above its clear threshold, or was below the entry one less than
    `hold_seconds` ago (it keeps its words)."""
    entered = pressures(sample, thresholds)
    after = {kind: Held(words, now) for kind, words in entered.items()}
    for kind, was in held.items():
        if kind in after:
            continue
        if not _above_clear(kind, sample, thresholds) or now - was.below_at < thresholds.hold_seconds:
            after[kind] = was
    return after
