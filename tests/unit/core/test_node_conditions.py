"""Node conditions (`corral.core.conditions`): a node under disk or memory pressure takes no new work."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from corral.core import NodeState, Place, QueueConfig, SchedulerConfig, schedule
from corral.core.conditions import Condition, Held, Sample, Thresholds, node_state, pressures, transition
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


# --- hysteresis: enter below the threshold, clear at or above a higher one, after a hold ----------

MEMORY = Thresholds(memory_available_mib=256.0, memory_clear_mib=384.0, hold_seconds=10.0)


def run(measures: list[tuple[float, float]], thresholds: Thresholds = MEMORY) -> list[bool]:
    """Memory pressure after each (seconds since the last, MiB available) measurement."""
    held: dict[Condition, Held] = {}
    now, out = 0.0, []
    for gap, mib in measures:
        now += gap
        held = transition(held, Sample({}, mib), thresholds, now)
        out.append(Condition.MEMORY_PRESSURE in held)
    return out


MEASURES = st.lists(st.tuples(st.floats(0.1, 20), st.floats(0, 1024)), min_size=1, max_size=60)


@given(MEASURES)
def test_a_condition_enters_below_its_threshold_and_clears_only_above_the_clear_one_after_the_hold(
        measures: list[tuple[float, float]]) -> None:
    held = run(measures)
    now, last_below = 0.0, None
    for (gap, mib), now_held, before in zip(measures, held, [False, *held], strict=False):
        now += gap
        if mib < 256:
            last_below = now
            assert now_held  # enters at once, as the kubelet's
        elif before and not now_held:  # it cleared: above the clear threshold, held long enough
            assert mib >= 384 and last_below is not None and now - last_below >= 10.0
        elif before:
            assert mib < 384 or now - (last_below or 0) < 10.0
        else:
            assert not now_held  # never held without a measure below the threshold


@given(st.lists(st.tuples(st.floats(0.1, 20), st.floats(200, 383.9)), min_size=1, max_size=60))
def test_a_node_wavering_at_the_threshold_does_not_flap(measures: list[tuple[float, float]]) -> None:
    """Measures between the entry threshold's neighbourhood and the clear one: once it entered, the
    condition holds to the end, whatever the wavering (a single threshold flipped at every crossing)."""
    held = run(measures)
    if True in held:
        first = held.index(True)
        assert all(held[first:]), held
    flips = sum(1 for a, b in zip([False, *held], held, strict=False) if a != b)
    assert flips <= 1


@given(st.floats(0.0, 0.5), st.floats(0, 1 << 30))
def test_a_disk_condition_clears_at_the_higher_share_after_the_hold(enter: float, total_extra: int) -> None:
    t = Thresholds(disk_free_fraction=enter, hold_seconds=5.0)
    assert enter <= t.disk_clear <= enter + 0.10
    total = (1 << 30) + int(total_extra)
    full = Sample({"/run": (0, total)})
    held = transition({}, full, t, 0.0)
    assert (Condition.DISK_PRESSURE in held) == (enter > 0)
    clear = Sample({"/run": (min(total, int(t.disk_clear * total) + 1), total)})
    assert (Condition.DISK_PRESSURE in transition(held, clear, t, 4.9)) == (enter > 0)  # inside the hold
    assert Condition.DISK_PRESSURE not in transition(held, clear, t, 5.0)


def test_a_held_condition_keeps_its_words_and_an_unknown_measure_clears_after_the_hold() -> None:
    held = transition({}, Sample({}, 100.0), MEMORY, 0.0)
    assert held == {Condition.MEMORY_PRESSURE: Held("100 MiB of memory available, below 256 MiB", 0.0)}
    assert transition(held, Sample({}, 300.0), MEMORY, 20.0) == held
    assert transition(held, Sample({}, None), MEMORY, 5.0) == held
    assert transition(held, Sample({}, None), MEMORY, 10.0) == {}
