"""Node conditions (`corral.core.conditions`): a node under disk or memory pressure takes no new work."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from corral.core import NodeState, Place, QueueConfig, SchedulerConfig, schedule
from corral.core.conditions import Condition, Sample, Thresholds, node_state, pressures
from tests.unit.core.builders import job, snapshot
from tests.unit.core.test_core_properties import SETTINGS, clusters

CONDITIONS = st.sets(st.sampled_from(list(Condition)), max_size=2)


@SETTINGS
@given(st.data(), st.sampled_from(["corral", "fifo", "priority", "backfill", "las"]))
def test_nothing_new_is_placed_on_a_node_under_pressure(data: st.DataObject, policy: str) -> None:
    cluster = data.draw(clusters(ready_only=True))
    held = {n.name: data.draw(CONDITIONS) for n in cluster.nodes}
    nodes = tuple(dataclasses.replace(n, state=node_state(lost=False, draining=False, conditions=held[n.name]))
                  for n in cluster.nodes)
    cluster = dataclasses.replace(cluster, nodes=nodes)
    pending = [job(f"j{i}", replicas=data.draw(st.integers(1, 3)), gpus=data.draw(st.sampled_from([1, 2, 4, 8])),
                   submit_time=float(i)) for i in range(data.draw(st.integers(1, 12)))]
    decisions = schedule(snapshot(cluster, pending, queues=[QueueConfig("q")]), SchedulerConfig.named(policy))
    under = {name for name, conds in held.items() if conds}
    for d in decisions:
        if isinstance(d, Place):
            assert not set(d.placement.nodes()) & under, (d, held)


@given(st.booleans(), st.booleans(), CONDITIONS)
def test_a_node_state_is_lost_over_draining_over_ready(lost: bool, draining: bool, conditions: set[Condition]) -> None:
    state = node_state(lost=lost, draining=draining, conditions=conditions)
    assert state is (NodeState.LOST if lost else NodeState.DRAINING if draining or conditions else NodeState.READY)


@given(st.dictionaries(st.sampled_from(["run", "logs", "checkpoints"]),
                       st.tuples(st.integers(0, 1 << 40), st.integers(1, 1 << 40)), max_size=3),
       st.none() | st.floats(0, 1 << 20), st.floats(0.01, 0.5), st.floats(1, 4096))
def test_a_condition_holds_exactly_when_a_measure_is_below_its_threshold(
        disks: dict[str, tuple[int, int]], memory: float | None, disk_fraction: float, memory_mib: float) -> None:
    disks = {k: (min(free, total), total) for k, (free, total) in disks.items()}
    held = pressures(Sample(disks, memory), Thresholds(disk_fraction, memory_mib))
    assert (Condition.DISK_PRESSURE in held) == any(free / total < disk_fraction for free, total in disks.values())
    assert (Condition.MEMORY_PRESSURE in held) == (memory is not None and memory < memory_mib)


def test_the_words_name_the_fullest_folder_and_the_threshold() -> None:
    held = pressures(Sample({"/data/run": (50 << 20, 1 << 30), "/data/logs": (10 << 20, 1 << 30)}, 100.0),
                     Thresholds(0.10, 256))
    assert held == {
        Condition.DISK_PRESSURE: "/data/logs has 1.0% free (10 MiB), below 10% (and 1 more folder)",
        Condition.MEMORY_PRESSURE: "100 MiB of memory available, below 256 MiB",
    }
