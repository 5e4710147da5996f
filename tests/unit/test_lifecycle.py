"""The gang lifecycle (`corral.lifecycle`): its transition table and `next_steps`, table-driven, and
invariants over random report sequences (hypothesis)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.contracts.lifecycle import LifecycleCode, WorkerExit
from corral.core import Placement, RankPlacement
from corral.lifecycle import (
    HOLDING,
    TRANSITIONS,
    FreeNode,
    Gang,
    GangEvent,
    GangState,
    Heartbeats,
    Limits,
    MarkRunning,
    NodeSeen,
    Release,
    Then,
    next_steps,
    transition,
)

S, E = GangState, GangEvent

LEGAL = {
    (S.STARTING, E.ALL_STARTED): S.RUNNING,
    (S.STARTING, E.PREEMPT): S.PREEMPTING,
    (S.STARTING, E.CANCEL): S.CANCELLING,
    (S.STARTING, E.RELEASE): S.RELEASING,
    (S.RUNNING, E.PREEMPT): S.PREEMPTING,
    (S.RUNNING, E.CANCEL): S.CANCELLING,
    (S.RUNNING, E.RELEASE): S.RELEASING,
    (S.PREEMPTING, E.CANCEL): S.CANCELLING,
    (S.PREEMPTING, E.RELEASE): S.RELEASING,
    (S.CANCELLING, E.RELEASE): S.RELEASING,
    (S.RELEASING, E.FREED): S.RELEASED,
}


@pytest.mark.parametrize(("state", "event"), list(itertools.product(GangState, GangEvent)))
def test_every_pair_of_state_and_event_is_legal_exactly_as_the_table_says(state: GangState,
                                                                         event: GangEvent) -> None:
    assert transition(state, event) == LEGAL.get((state, event))


def test_the_table_is_the_documented_one_and_released_is_final() -> None:
    assert dict(TRANSITIONS) == LEGAL
    assert all(transition(S.RELEASED, e) is None for e in GangEvent)
    assert {s for s, _ in LEGAL} == set(GangState) - {S.RELEASED}
    assert all(transition(s, E.RELEASE) is S.RELEASING for s in HOLDING)


# ---- next_steps, table-driven ------------------------------------------------------------------

TWO_NODES = Placement((RankPlacement(0, "a", (0, 1)), RankPlacement(1, "b", (2, 3))))
LIMITS = Limits(start_timeout=120, workers_lost=10, release_confirm=3, preempt_overrun=30)


def gang(state: GangState = S.RUNNING, **fields: object) -> Gang:
    base = Gang(job_id="j", attempt=0, state=state, placement=TWO_NODES, placed_at=100.0,
                started=frozenset({0, 1}), running_since=101.0)
    return replace(base, **fields)  # type: ignore[arg-type]


def release_of(steps: tuple[object, ...]) -> Release | None:
    found = [s for s in steps if isinstance(s, Release)]
    assert len(found) <= 1
    return found[0] if found else None


def freed(steps: tuple[object, ...]) -> list[str]:
    return [s.node for s in steps if isinstance(s, FreeNode)]


CASES: list[tuple[str, Gang, float, tuple[LifecycleCode | None, Then | None, list[str]]]] = [
    ("starting, waiting for rank 1", gang(S.STARTING, started=frozenset({0}), running_since=None), 110,
     (None, None, [])),
    ("start barrier expired", gang(S.STARTING, started=frozenset({0}), running_since=None), 221,
     (LifecycleCode.START_TIMEOUT, Then.REQUEUE, [])),  # b freed `release_confirm` later
    ("all ranks exited 0", gang(exits={0: 0, 1: 0}), 150, (LifecycleCode.COMPLETED, Then.COMPLETE, ["a", "b"])),
    ("one rank exited 0, the other runs", gang(exits={0: 0}), 150, (None, None, [])),
    ("all stopped after a checkpoint", gang(exits={0: WorkerExit.CHECKPOINTED, 1: 0}), 150,
     (LifecycleCode.CHECKPOINTED, Then.REQUEUE, ["a", "b"])),
    ("rank 0 crashed, restarts left", gang(exits={0: 3}, max_restarts=1), 150,
     (LifecycleCode.WORKER_FAILED, Then.REQUEUE, ["a"])),
    ("rank 0 crashed, no restarts left", gang(exits={0: 3}), 150, (LifecycleCode.WORKER_FAILED, Then.FAIL, ["a"])),
    ("preempting, rank 1 still stopping", gang(S.PREEMPTING, exits={0: WorkerExit.CHECKPOINTED}), 150,
     (None, None, [])),
    ("preempting, all stopped", gang(S.PREEMPTING, exits={0: WorkerExit.CHECKPOINTED, 1: None}), 150,
     (LifecycleCode.PREEMPTED, Then.NOTHING, ["a", "b"])),
    ("preempting, finished within its grace", gang(S.PREEMPTING, exits={0: 0, 1: 0}), 150,
     (LifecycleCode.COMPLETED, Then.COMPLETE, ["a", "b"])),
    ("preempting, far past its deadline", gang(S.PREEMPTING, preempt_deadline=110.0), 141,
     (LifecycleCode.PREEMPT_OVERRUN, Then.REQUEUE, [])),
    ("cancelled", gang(S.CANCELLING), 150, (LifecycleCode.CANCELLED, Then.NOTHING, [])),
    ("node b lost", gang(lost_nodes=frozenset({"b"})), 150, (LifecycleCode.NODE_LOST, Then.REQUEUE, [])),
    ("GPU b:3 unhealthy", gang(unhealthy_gpus={("b", 3): "XID 79"}), 150,
     (LifecycleCode.GPU_UNHEALTHY, Then.REQUEUE, [])),
    ("GPU b:3 unhealthy while preempting", gang(S.PREEMPTING, unhealthy_gpus={("b", 3): "XID 79"}), 150,
     (LifecycleCode.GPU_UNHEALTHY, Then.REQUEUE, [])),
    ("an unhealthy GPU the gang does not hold", gang(unhealthy_gpus={("b", 0): "XID 79", ("c", 3): "lost"}), 150,
     (None, None, [])),
    ("node b alive, not listing the job for 12 s", gang(seen={"b": NodeSeen(last_at=150, absent_since=138)}), 150,
     (LifecycleCode.WORKERS_LOST, Then.REQUEUE, ["b"])),
    ("node b not listing the job for 8 s", gang(seen={"b": NodeSeen(last_at=150, absent_since=142)}), 150,
     (None, None, [])),
    ("absence counted from the start", gang(seen={"b": NodeSeen(last_at=105, absent_since=50)}), 105,
     (None, None, [])),
    ("node b listing it", gang(seen={"b": NodeSeen(last_at=150, absent_since=None)}), 150, (None, None, [])),
    ("node b's ranks exited, peers run", gang(exits={1: 0}, seen={"b": NodeSeen(150, 120)}), 150,
     (None, None, [])),
    # Placement has read the nodes' reports only up to 141: node b's exits may be in the rest.
    ("node b silent 12 s, its reports read 3 s into it", gang(seen={"b": NodeSeen(150, 138)}, reports_read_at=141.0),
     150, (None, None, [])),
    ("node b silent 12 s, its reports read 11 s into it", gang(seen={"b": NodeSeen(150, 138)}, reports_read_at=149.0),
     150, (LifecycleCode.WORKERS_LOST, Then.REQUEUE, ["b"])),
    ("no report read yet", gang(seen={"b": NodeSeen(150, 120)}, reports_read_at=float("-inf")), 150,
     (None, None, [])),
    # marked running in the pass that sees the ranks started (running_since unknown yet), the exit
    # reports still unread behind the start reports
    ("started reports read late, exits unread", gang(S.STARTING, running_since=None, seen={"b": NodeSeen(112, 101)},
                                                     reports_read_at=101.5), 112, (None, None, [])),
]


@pytest.mark.parametrize(("name", "g", "now", "expected"), CASES, ids=[c[0] for c in CASES])
def test_next_steps(name: str, g: Gang, now: float,
                    expected: tuple[LifecycleCode | None, Then | None, list[str]]) -> None:
    code, then, nodes = expected
    steps = next_steps(g, now, LIMITS)
    release = release_of(steps)
    assert (release.code if release else None, release.then if release else None) == (code, then)
    if release is not None and release.then is Then.REQUEUE:
        assert release.requeue_code is not None
        assert release.requeue_code.uses_a_restart == (release.code is LifecycleCode.WORKER_FAILED)
    assert freed(steps) == nodes


def test_an_unhealthy_gpu_says_which_gpu_and_why() -> None:
    release = release_of(next_steps(gang(unhealthy_gpus={("a", 1): "XID 79 (a critical error)"}), 150, LIMITS))
    assert release is not None and release.requeue_code is LifecycleCode.GPU_UNHEALTHY
    assert release.message == ("GPU a:1 is unhealthy (XID 79 (a critical error)) (attempt 0); requeued from its "
                               "checkpoint")
    assert not LifecycleCode.GPU_UNHEALTHY.uses_a_restart


def test_a_gang_whose_ranks_all_started_is_marked_running_once() -> None:
    steps = next_steps(gang(S.STARTING, running_since=None), 105, LIMITS)
    assert steps == (MarkRunning(),)
    steps = next_steps(gang(S.STARTING, running_since=None, exits={0: 0, 1: 0}), 105, LIMITS)
    assert isinstance(steps[0], MarkRunning) and release_of(steps).code is LifecycleCode.COMPLETED  # type: ignore[union-attr]


def test_a_gang_of_no_ranks_is_never_marked_running() -> None:
    """Every one of no ranks started: a fold that lost a gang's placement (a job requeued whose
    gang it never saw released) must not mark the next attempt running without its GangReserved."""
    empty = gang(S.STARTING, running_since=None, placement=Placement(()), started=frozenset({0}))
    assert not [s for s in next_steps(empty, 105, LIMITS) if isinstance(s, MarkRunning)]


def test_the_failure_message_names_the_rank_the_attempt_and_the_restarts() -> None:
    release = release_of(next_steps(gang(exits={1: 7, 0: None}, attempt=2, restarts=2, max_restarts=2), 150, LIMITS))
    assert release is not None and release.message == "rank 1 exited with 7 (attempt 2)"
    assert release.fail_message == "rank 1 exited with 7 (attempt 2); no restarts left (2 of 2 used)"


def test_a_rank_that_could_not_start_is_the_cause_and_its_nodes_words_are_the_reason() -> None:
    # rank 0 was ended by its node because rank 1 could not start: rank 1 is named, with why
    reported = {0: ("GANG_KILLED", "rank 0: killed by SIGKILL"),
                1: ("START_FAILED", "rank 1: FileNotFoundError: [Errno 2] No such file or directory: 'trian.py'")}
    release = release_of(next_steps(gang(S.STARTING, started=frozenset({0}), running_since=None,
                                         exits={0: None, 1: None}, exit_reasons=reported), 105, LIMITS))
    assert release is not None and release.then is Then.FAIL
    assert release.message == ("rank 1 could not start (START_FAILED): FileNotFoundError: [Errno 2] No such file "
                               "or directory: 'trian.py' (attempt 0)")


def test_a_rank_killed_by_a_signal_says_which() -> None:
    release = release_of(next_steps(gang(exits={0: None, 1: None}, exit_reasons={
        0: ("GANG_KILLED", "rank 0: killed by SIGKILL"), 1: ("CRASHED", "rank 1: killed by SIGSEGV")}), 150, LIMITS))
    assert release is not None and release.message == "rank 1 was killed by SIGSEGV (attempt 0)"


def test_without_reports_a_failure_reads_as_before() -> None:
    release = release_of(next_steps(gang(exits={0: None, 1: None}), 150, LIMITS))
    assert release is not None and release.message == "rank 0 was killed (attempt 0)"


FENCE_CASES: list[tuple[str, Gang, float, list[str]]] = [
    ("rank 1 still running", gang(S.RELEASING, exits={0: 3}, released_at=150), 151, ["a"]),
    ("rank 1 exited", gang(S.RELEASING, exits={0: 3, 1: None}, released_at=150), 151, ["a", "b"]),
    ("node a already freed", gang(S.RELEASING, exits={0: 3, 1: None}, released_at=150, freed=frozenset({"a"})), 151,
     ["b"]),
    # a lost node is not a dead one: its ranks may run on (a partition, a stalled agent) and it may
    # come back; its GPUs stay held until its heartbeats, after the release, stop listing the gang
    ("node b lost", gang(S.RELEASING, exits={0: 3}, released_at=150, lost_nodes=frozenset({"b"})), 151, ["a"]),
    ("node b lost, back, listing the gang", gang(S.RELEASING, exits={0: 3}, released_at=150,
                                                 lost_nodes=frozenset({"b"}), seen={"b": NodeSeen(170, None)}),
     170, ["a"]),
    ("node b lost, back, silent about it 3 s", gang(S.RELEASING, exits={0: 3}, released_at=150,
                                                    lost_nodes=frozenset({"b"}), seen={"b": NodeSeen(173, 170)}),
     173, ["a", "b"]),
    ("b silent about it 3 s after the release", gang(S.RELEASING, exits={0: 3}, released_at=150,
                                                      seen={"b": NodeSeen(153, 149)}), 153, ["a", "b"]),
    ("b silent about it, but only 2 s", gang(S.RELEASING, exits={0: 3}, released_at=150,
                                             seen={"b": NodeSeen(152, 150)}), 152, ["a"]),
    ("b silent about it long before", gang(S.RELEASING, exits={0: 3}, released_at=150,
                                           seen={"b": NodeSeen(151, 140)}), 151, ["a", "b"]),
    ("b silent, but no heartbeat since the release", gang(S.RELEASING, exits={0: 3}, released_at=150,
                                                          seen={"b": NodeSeen(149, 140)}), 150.5, ["a"]),
    ("b lists it", gang(S.RELEASING, exits={0: 3}, released_at=150, seen={"b": NodeSeen(160, None)}), 160, ["a"]),
    ("rank 1 never started, nothing heard", gang(S.RELEASING, exits={0: 3}, started=frozenset({0}), released_at=150),
     152, ["a"]),
    # a placement that has just taken over has heard nothing yet: no proof (the chaos run's double use)
    ("rank 1 never started, 3 s on, nothing heard", gang(S.RELEASING, exits={0: 3}, started=frozenset({0}),
                                                         released_at=150), 153, ["a"]),
    ("rank 1 never started, 3 s on, b heard not listing it",
     gang(S.RELEASING, exits={0: 3}, started=frozenset({0}), released_at=150, seen={"b": NodeSeen(152, 151)}),
     153, ["a", "b"]),
    ("rank 1 never started but b lists the job", gang(S.RELEASING, exits={0: 3}, started=frozenset({0}),
                                                      released_at=150, seen={"b": NodeSeen(160, None)}), 160, ["a"]),
    # the 20-minute chaos run's last double use: b's agent lagged, its backlog still held the
    # reservation; b listed nothing, the GPUs were freed, and the rank started after the release
    ("rank 1 never started, b silent but its agent behind the release",
     gang(S.RELEASING, exits={0: 3}, started=frozenset({0}), released_at=150, released_position=900,
          seen={"b": NodeSeen(160, 150, handled_position=850)}), 160, ["a"]),
    ("rank 1 never started, b silent and its agent past the release",
     gang(S.RELEASING, exits={0: 3}, started=frozenset({0}), released_at=150, released_position=900,
          seen={"b": NodeSeen(160, 150, handled_position=905)}), 160, ["a", "b"]),
    ("b silent 3 s after the release, its agent behind it",
     gang(S.RELEASING, exits={0: 3}, released_at=150, released_position=900,
          seen={"b": NodeSeen(153, 149, handled_position=899)}), 153, ["a"]),
    ("b's agent says its position, the release's not looked up yet",
     gang(S.RELEASING, exits={0: 3}, released_at=150, seen={"b": NodeSeen(153, 149, handled_position=2000)}),
     153, ["a"]),
    ("b's ranks exited: its agent's position does not matter",
     gang(S.RELEASING, exits={0: 3, 1: 0}, released_at=150, released_position=900,
          seen={"b": NodeSeen(151, None, handled_position=10)}), 151, ["a", "b"]),
]


@pytest.mark.parametrize(("name", "g", "now", "nodes"), FENCE_CASES, ids=[c[0] for c in FENCE_CASES])
def test_a_released_gangs_gpus_are_freed_node_by_node_once_its_ranks_are_gone(
        name: str, g: Gang, now: float, nodes: list[str]) -> None:
    steps = next_steps(g, now, LIMITS)
    assert all(isinstance(s, FreeNode) for s in steps)
    assert freed(steps) == nodes
    assert next_steps(replace(g, state=S.RELEASED), now, LIMITS) == ()


def test_heartbeats_tell_since_when_a_node_stopped_listing_a_job() -> None:
    beats = Heartbeats()
    assert beats.seen("a", "j") is None
    beats.record("a", 10, ["j"])
    assert beats.seen("a", "j") == NodeSeen(10, None)
    assert beats.seen("a", "other") == NodeSeen(10, 10)  # never listed: absent since the first beat
    beats.record("a", 12, [])
    beats.record("a", 14, [])
    assert beats.seen("a", "j") == NodeSeen(14, 12)
    beats.record("a", 16, ["j"])
    assert beats.seen("a", "j") == NodeSeen(16, None)
    assert beats.about(["a", "b"], "j") == {"a": NodeSeen(16, None)}


def test_limits_from_the_environment_name_the_variable_when_wrong() -> None:
    assert Limits.from_env({"CORRAL_WORKERS_LOST_SECONDS": "4"}).workers_lost == 4
    with pytest.raises(ValueError, match="CORRAL_RELEASE_CONFIRM_SECONDS='soon'"):
        Limits.from_env({"CORRAL_RELEASE_CONFIRM_SECONDS": "soon"})


# ---- invariants over random report sequences ---------------------------------------------------

Report = tuple[str, int, int | None]  # ("start" | "exit" | "preempt" | "cancel" | "lose" | "tick", rank, code)

reports = st.lists(st.one_of(
    st.tuples(st.just("start"), st.integers(0, 2), st.none()),
    st.tuples(st.just("exit"), st.integers(0, 2), st.sampled_from([0, 0, WorkerExit.CHECKPOINTED, 1, 137, None])),
    st.tuples(st.just("preempt"), st.just(0), st.none()),
    st.tuples(st.just("cancel"), st.just(0), st.none()),
    st.tuples(st.just("lose"), st.integers(0, 2), st.none()),
    st.tuples(st.just("silent"), st.integers(0, 2), st.none()),
    st.tuples(st.just("tick"), st.integers(1, 40), st.none()),
), max_size=30)

THREE = Placement((RankPlacement(0, "a", (0,)), RankPlacement(1, "a", (1,)), RankPlacement(2, "b", (0,))))


@settings(max_examples=400, deadline=None)
@given(reports, st.integers(0, 2))
def test_random_reports_never_release_an_attempt_twice_nor_complete_a_crashed_gang(
        sequence: list[Report], max_restarts: int) -> None:
    """Fold random reports into a gang as placement does, apply every step it returns, and check:
    one release per attempt; COMPLETED only when every rank exited 0; a crashed rank never
    completes; GPUs of a node are freed once, only after the release, and only when every rank
    there exited or its heartbeats stopped listing the gang (a lost node proves nothing)."""
    now = 100.0
    g = Gang(job_id="j", attempt=0, state=S.STARTING, placement=THREE, placed_at=now, max_restarts=max_restarts)
    silent_since: dict[str, float] = {}
    releases: list[Release] = []
    freed_nodes: list[str] = []
    for kind, value, code in sequence:
        if kind == "tick":
            now += value
        elif kind == "start" and g.state in HOLDING:
            g = replace(g, started=g.started | {value})
        elif kind == "exit" and value not in g.exits:
            g = replace(g, exits={**g.exits, value: code})
        elif kind == "preempt" and g.state in (S.STARTING, S.RUNNING):
            g = replace(g, state=S.PREEMPTING, preemptor="p", preempt_deadline=now + 30)
        elif kind == "cancel" and g.state in (S.STARTING, S.RUNNING, S.PREEMPTING):
            g = replace(g, state=S.CANCELLING)
        elif kind == "lose":
            g = replace(g, lost_nodes=g.lost_nodes | {"ab"[value % 2]})
        elif kind == "silent":
            silent_since.setdefault("ab"[value % 2], now)
        g = replace(g, seen={n: NodeSeen(now, since) for n, since in silent_since.items()})
        for step in next_steps(g, now, LIMITS):
            if isinstance(step, MarkRunning):
                assert g.state is S.STARTING
                g = replace(g, state=S.RUNNING, running_since=now)
            elif isinstance(step, Release):
                assert g.state in HOLDING, "released twice"
                releases.append(step)
                g = replace(g, state=S.RELEASING, released_at=now)
                if step.code is LifecycleCode.COMPLETED:
                    assert set(g.exits) == {0, 1, 2} and all(c == 0 for c in g.exits.values())
                if step.then is Then.COMPLETE:
                    assert step.code is LifecycleCode.COMPLETED
            else:
                assert g.state is S.RELEASING, "GPUs freed before the gang was released"
                assert step.node not in freed_nodes, "a node freed twice"
                ranks = g.ranks_on(step.node)
                assert (all(r in g.exits for r in ranks)
                        or step.node in silent_since), \
                    f"node {step.node} freed while ranks of it there may run"
                freed_nodes.append(step.node)
                g = replace(g, freed=g.freed | {step.node})
                if g.freed == {"a", "b"}:
                    g = replace(g, state=transition(S.RELEASING, E.FREED) or g.state)
    assert len(releases) <= 1
    if any(c not in (0, WorkerExit.CHECKPOINTED) for c in g.exits.values()):
        assert all(r.code is not LifecycleCode.COMPLETED for r in releases)


# ---- time limit ----------------------------------------------------------------------------------

def test_a_running_attempt_past_its_time_limit_fails_with_time_limit() -> None:
    g = gang(time_limit=3.0)  # running since 101
    assert next_steps(g, 103.9, LIMITS) == ()
    steps = next_steps(g, 104.0, LIMITS)
    release = next(s for s in steps if isinstance(s, Release))
    assert (release.code, release.then) == (LifecycleCode.TIME_LIMIT, Then.FAIL)
    assert "time_limit of 3s" in release.message and "checkpoints kept" in (release.fail_message or "")


def test_the_time_limit_gives_way_to_completion_and_to_a_preemption_under_way() -> None:
    done = gang(time_limit=3.0, exits={0: WorkerExit.COMPLETED, 1: WorkerExit.COMPLETED})
    assert next(s for s in next_steps(done, 500.0, LIMITS) if isinstance(s, Release)).code is LifecycleCode.COMPLETED
    preempting = gang(S.PREEMPTING, time_limit=3.0, preempt_deadline=200.0)
    assert not any(isinstance(s, Release) for s in next_steps(preempting, 150.0, LIMITS))
    assert next_steps(gang(S.STARTING, started=frozenset(), running_since=None, time_limit=3.0), 110.0, LIMITS) == ()
