"""The gang lifecycle: one attempt of a job, from its GPUs reserved to its GPUs free again.

Why: the rules of a gang's life (the start barrier and its timeout, a crashed rank, completion, a
preempted gang that stopped, node loss) are one table that placement and the simulator both
follow, with typed codes. And a gang's GPUs are not free the moment placement ends the gang: the
agents are still stopping its other ranks (a grace of 5-10 s), and a job placed on them then
would share them with the old one's processes.

The fix, written the way h11 writes HTTP: the states and the events that move them are one
transition table (`TRANSITIONS`), and `next_steps(gang, now, limits)` returns what must happen
next as values — mark it running, release it (and how its job goes on), free one node's GPUs —
with no clock and no I/O (time is an argument). Placement folds the log into `Gang` values and
turns the steps into events; the simulator, which has no processes, calls the same function.

A gang's life:

    STARTING --all ranks started--> RUNNING
    STARTING | RUNNING --PreemptRequested--> PREEMPTING
    STARTING | RUNNING | PREEMPTING --JobCancelled--> CANCELLING
    any of the above --GangReleased--> RELEASING --every node's GpusReleased--> RELEASED

RELEASING is the fence: the job-level decision is taken (the job completes, fails or waits again,
the agents stop the ranks), but each node's GPUs stay allocated until that node confirms every
rank of the attempt there has exited (a WorkerExited for each), or its heartbeats, up to one
received after the release and sent once its agent had handled the release, have not listed the
job for `Limits.release_confirm` seconds (which also covers ranks that never started). Only then
is that node's GpusReleased appended. A lost node is no proof (see `_confirmed`): its GPUs stay
held until it is back and says so.

Placement also reconciles the agents' heartbeats with what it believes runs: a RUNNING or
PREEMPTING gang that a live node's heartbeats have not listed for `Limits.workers_lost` seconds
(counted from heartbeats after the gang started) is released and requeued from its checkpoint
(WORKERS_LOST: not the job's fault, so it uses no restart). This is what ends a gang whose agent
was killed and came back without it, and a preemption waiting for a gang that no longer runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from corral.contracts.lifecycle import LifecycleCode, WorkerExit
from corral.contracts.worker import CHOSEN_EXITS

if TYPE_CHECKING:
    from corral.core import Placement

__all__ = [
    "TRANSITIONS",
    "FreeNode",
    "Gang",
    "GangEvent",
    "GangState",
    "Heartbeats",
    "Limits",
    "MarkRunning",
    "NodeSeen",
    "Release",
    "Step",
    "Then",
    "next_steps",
    "transition",
]


class GangState(StrEnum):
    STARTING = "STARTING"      # GPUs reserved; waiting for every rank to start (the barrier)
    RUNNING = "RUNNING"        # every rank started
    PREEMPTING = "PREEMPTING"  # asked to checkpoint and stop; still holds its GPUs
    CANCELLING = "CANCELLING"  # its job was cancelled; still holds its GPUs
    RELEASING = "RELEASING"    # released; each node's GPUs held until its ranks are gone (the fence)
    RELEASED = "RELEASED"      # every node's GPUs are free


class GangEvent(StrEnum):
    ALL_STARTED = "ALL_STARTED"  # JobRunning
    PREEMPT = "PREEMPT"          # PreemptRequested
    CANCEL = "CANCEL"            # JobCancelled
    RELEASE = "RELEASE"          # GangReleased
    FREED = "FREED"              # the last of its nodes' GpusReleased


#: Every legal move. A gang starts in STARTING (its GangReserved); RELEASED is final.
TRANSITIONS: Mapping[tuple[GangState, GangEvent], GangState] = {
    (GangState.STARTING, GangEvent.ALL_STARTED): GangState.RUNNING,
    (GangState.STARTING, GangEvent.PREEMPT): GangState.PREEMPTING,
    (GangState.STARTING, GangEvent.CANCEL): GangState.CANCELLING,
    (GangState.STARTING, GangEvent.RELEASE): GangState.RELEASING,
    (GangState.RUNNING, GangEvent.PREEMPT): GangState.PREEMPTING,
    (GangState.RUNNING, GangEvent.CANCEL): GangState.CANCELLING,
    (GangState.RUNNING, GangEvent.RELEASE): GangState.RELEASING,
    (GangState.PREEMPTING, GangEvent.CANCEL): GangState.CANCELLING,
    (GangState.PREEMPTING, GangEvent.RELEASE): GangState.RELEASING,
    (GangState.CANCELLING, GangEvent.RELEASE): GangState.RELEASING,
    (GangState.RELEASING, GangEvent.FREED): GangState.RELEASED,
}

#: The states in which a gang holds its GPUs and may still be released.
HOLDING = frozenset({GangState.STARTING, GangState.RUNNING, GangState.PREEMPTING, GangState.CANCELLING})


def transition(state: GangState, event: GangEvent) -> GangState | None:
    """The state after `event`, or None when the event is no move of `state`.

    None is a value, not an error: the log legitimately holds events that raced a move (a
    PreemptRequested appended just after the gang was released); a fold ignores them."""
    return TRANSITIONS.get((state, event))


# ---- what placement knows about a gang --------------------------------------------------------

@dataclass(frozen=True, slots=True)
class NodeSeen:
    """What one node's heartbeats say about one job: `last_at` is the newest heartbeat's time,
    `absent_since` the time of the first heartbeat since which none has listed the job (None:
    the newest lists it), `handled_position` the log position its agent says it has handled up
    to (None: an agent that does not say)."""

    last_at: float
    absent_since: float | None
    handled_position: int | None = None


@dataclass(frozen=True, slots=True)
class Gang:
    """One attempt of a job, as the log and the heartbeats describe it at `now`.

    `exits`: rank -> exit code (None: killed by a signal, or never started) from WorkerExited;
    `exit_reasons`: rank -> the (code, message) its node reported, for ranks that did not exit 0;
    `freed`: nodes whose GpusReleased is recorded; `seen`: per node of the gang, its heartbeats
    about this job (absent: no heartbeat from that node since placement started)."""

    job_id: str
    attempt: int
    state: GangState
    placement: Placement
    placed_at: float
    started: frozenset[int] = frozenset()
    exits: Mapping[int, int | None] = field(default_factory=dict)
    exit_reasons: Mapping[int, tuple[str, str]] = field(default_factory=dict)
    running_since: float | None = None
    released_at: float | None = None
    freed: frozenset[str] = frozenset()
    restarts: int = 0
    max_restarts: int = 0
    preemptor: str | None = None
    preempt_deadline: float | None = None
    lost_nodes: frozenset[str] = frozenset()
    #: (node, GPU) -> why it is unhealthy, for the gang's GPUs its agents find unhealthy now
    unhealthy_gpus: Mapping[tuple[str, int], str] = field(default_factory=dict)
    seen: Mapping[str, NodeSeen] = field(default_factory=dict)
    released_position: int | None = None  # the GangReleased's log position, once known
    time_limit: float | None = None  # the spec's `time_limit`: seconds this attempt may run
    #: Every report the nodes sent before this time has been read (None: every report sent).
    #: Heartbeats that stopped listing the gang prove its workers lost only up to it: past it,
    #: the ranks' exits may be among the reports not read yet.
    reports_read_at: float | None = None

    @property
    def ranks(self) -> frozenset[int]:
        return frozenset(r.rank for r in self.placement.ranks)

    def ranks_on(self, node: str) -> list[int]:
        return [r.rank for r in self.placement.ranks if r.node == node]


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of a gang's life, in seconds (placement reads them from the environment)."""

    start_timeout: float = 120.0    # CORRAL_START_TIMEOUT_SECONDS: every rank started within
    workers_lost: float = 10.0      # CORRAL_WORKERS_LOST_SECONDS: a live node not listing a running gang
    release_confirm: float = 3.0    # CORRAL_RELEASE_CONFIRM_SECONDS: heartbeats silent about a released gang
    preempt_overrun: float = 30.0   # CORRAL_PREEMPT_OVERRUN_SECONDS: past a preemption's deadline

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Limits:
        def seconds(name: str, default: float) -> float:
            raw = environ.get(name)
            if raw is None:
                return default
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r}: give a number of seconds, e.g. {default:g}") from None
            if value < 0:
                raise ValueError(f"{name}={raw!r}: must be >= 0 seconds")
            return value

        d = cls()
        return cls(seconds("CORRAL_START_TIMEOUT_SECONDS", d.start_timeout),
                   seconds("CORRAL_WORKERS_LOST_SECONDS", d.workers_lost),
                   seconds("CORRAL_RELEASE_CONFIRM_SECONDS", d.release_confirm),
                   seconds("CORRAL_PREEMPT_OVERRUN_SECONDS", d.preempt_overrun))


# ---- what must happen next --------------------------------------------------------------------

class Then(StrEnum):
    """How the job goes on once its gang is released."""

    COMPLETE = "COMPLETE"  # JobCompleted
    FAIL = "FAIL"          # JobFailed
    REQUEUE = "REQUEUE"    # JobRequeued for the next attempt, from the last checkpoint
    NOTHING = "NOTHING"    # the job's story goes on elsewhere (preemption requeues; cancelled is over)


@dataclass(frozen=True, slots=True)
class MarkRunning:
    """Every rank started: JobRunning."""


@dataclass(frozen=True, slots=True)
class Release:
    """End the gang (GangReleased with `code`), then `then`. `requeue_code` is the JobRequeued's
    code (RESTARTING uses a restart), `fail_message` the JobFailed's message."""

    code: LifecycleCode
    message: str
    then: Then = Then.NOTHING
    requeue_code: LifecycleCode | None = None
    fail_message: str | None = None


@dataclass(frozen=True, slots=True)
class FreeNode:
    """Every rank of the attempt on `node` is gone: its GPUs are free (GpusReleased)."""

    node: str
    gpus: tuple[int, ...]


Step = MarkRunning | Release | FreeNode


def next_steps(gang: Gang, now: float, limits: Limits) -> tuple[Step, ...]:
    """What moves `gang` on at `now`; empty when it stays as it is."""
    if gang.state is GangState.RELEASED:
        return ()
    if gang.state is GangState.RELEASING:
        return _free(gang, gang.released_at if gang.released_at is not None else now, now, limits)
    steps: list[Step] = []
    state = gang.state
    if state is GangState.STARTING and gang.ranks and gang.ranks <= gang.started:
        steps.append(MarkRunning())  # (a gang of no ranks is a fold that lost its placement: never)
        state = GangState.RUNNING
    release = _release(gang, state, now, limits)
    if release is None:
        return tuple(steps)
    if release.then is Then.COMPLETE and not steps and state is GangState.STARTING:
        steps.append(MarkRunning())  # every rank exited 0: it did run
    steps.append(release)
    steps.extend(_free(gang, now, now, limits))
    return tuple(steps)


def _release(gang: Gang, state: GangState, now: float, limits: Limits) -> Release | None:
    """Whether the gang ends now, why, and how its job goes on."""
    attempt = f"attempt {gang.attempt}"
    if state is GangState.CANCELLING:
        return Release(LifecycleCode.CANCELLED, f"the job was cancelled ({attempt})")
    lost = sorted({r.node for r in gang.placement.ranks} & gang.lost_nodes)
    if lost:
        return _requeue(LifecycleCode.NODE_LOST, f"node {', '.join(lost)} was lost ({attempt})")
    if gang.unhealthy_gpus:
        bad = sorted((r.node, g) for r in gang.placement.ranks for g in r.gpus if (r.node, g) in gang.unhealthy_gpus)
        if bad:
            words = "; ".join(f"GPU {n}:{g} is unhealthy ({gang.unhealthy_gpus[(n, g)]})" for n, g in bad)
            return _requeue(LifecycleCode.GPU_UNHEALTHY, f"{words} ({attempt}); requeued from its checkpoint")
    ranks, exits = gang.ranks, gang.exits
    if state is GangState.STARTING and now - gang.placed_at > limits.start_timeout:
        missing = sorted(ranks - gang.started)
        return _requeue(LifecycleCode.START_TIMEOUT, f"ranks {missing} did not start within "
                        f"{limits.start_timeout:.0f}s ({attempt}); the whole gang is released")
    crashed = {r: c for r, c in exits.items() if c not in CHOSEN_EXITS}
    ended = bool(exits) and ranks <= exits.keys()
    if ended and all(c == WorkerExit.COMPLETED for c in exits.values()):
        # also when asked to checkpoint: a job that finishes within its grace is done, not requeued
        return Release(LifecycleCode.COMPLETED, f"every rank exited 0 ({attempt})", Then.COMPLETE)
    if state is GangState.PREEMPTING:
        if ended:
            why = f"for job {gang.preemptor}" if gang.preemptor else "as asked (requeue or drain)"
            return Release(LifecycleCode.PREEMPTED, f"checkpointed and stopped {why} ({attempt})")
    elif crashed:
        # The rank that failed first has an exit code, or could not start; its peers were killed.
        rank, code = min(crashed.items(), key=lambda rc: (
            gang.exit_reasons.get(rc[0], ("",))[0] in PEER_ENDS, rc[1] is None, rc[0]))
        message = f"rank {rank} {_failure(code, gang.exit_reasons.get(rank))} ({attempt})"
        if gang.restarts < gang.max_restarts:
            return Release(LifecycleCode.WORKER_FAILED, message, Then.REQUEUE, LifecycleCode.RESTARTING)
        return Release(LifecycleCode.WORKER_FAILED, message, Then.FAIL, fail_message=(
            f"{message}; no restarts left ({gang.restarts} of {gang.max_restarts} used)"))
    elif ended:
        return _requeue(LifecycleCode.CHECKPOINTED, f"every rank stopped after a checkpoint ({attempt})")
    if state is GangState.RUNNING and gang.time_limit is not None and gang.running_since is not None \
            and now - gang.running_since >= gang.time_limit:
        message = (f"ran {now - gang.running_since:.0f}s, past its time_limit of {gang.time_limit:g}s ({attempt}); "
                   "its ranks are stopped, its checkpoints kept")
        return Release(LifecycleCode.TIME_LIMIT, message, Then.FAIL, fail_message=message)
    if state in (GangState.RUNNING, GangState.PREEMPTING):
        gone = _workers_lost(gang, limits)
        if gone is not None:
            node, seconds = gone
            return _requeue(LifecycleCode.WORKERS_LOST, (
                f"node {node} is alive but has not reported ranks {_unexited(gang, node)} of {attempt} for "
                f"{seconds:.0f}s (limit {limits.workers_lost:.0f}s); requeued from its checkpoint, "
                "using no restart"))
    if state is GangState.PREEMPTING and gang.preempt_deadline is not None \
            and now - gang.preempt_deadline > limits.preempt_overrun:
        return _requeue(LifecycleCode.PREEMPT_OVERRUN, (
            f"asked to checkpoint and stop, still not stopped {now - gang.preempt_deadline:.0f}s after its "
            f"deadline ({attempt}); released, its GPUs stay held until its ranks are gone"))
    return None


#: WorkerExited codes of a rank ended by its node because of another rank (or a stop): never the cause.
PEER_ENDS = frozenset({"GANG_KILLED", "STOPPED", "PREEMPTED"})
#: WorkerExited codes of a rank that ran and then ended on its own (a code, or a signal).
RAN_AND_ENDED = frozenset({"CRASHED", "COMPLETED", "CHECKPOINTED"})


def _failure(code: int | None, reported: tuple[str, str] | None) -> str:
    """How a failed rank ended, in the words its node reported when it says more than a code: a
    rank that never ran (START_FAILED, or refused to run as its submitter) says why."""
    if code is not None:
        return f"exited with {code}"
    if reported is None:
        return "was killed"
    kind, said = reported
    said = said.split(": ", 1)[1] if said.startswith("rank ") and ": " in said else said
    if kind in RAN_AND_ENDED or kind in PEER_ENDS:
        return f"was {said}" if said.startswith("killed") else "was killed"
    return f"could not start ({kind}): {said}"


def _requeue(code: LifecycleCode, message: str) -> Release:
    return Release(code, message, Then.REQUEUE, code)


def _unexited(gang: Gang, node: str) -> list[int]:
    return [r for r in gang.ranks_on(node) if r not in gang.exits]


def _workers_lost(gang: Gang, limits: Limits) -> tuple[str, float] | None:
    """A node of the gang, alive, whose heartbeats (after the gang started, and up to the
    reports read: `Gang.reports_read_at`) have not listed it for `workers_lost` seconds while
    ranks of it there have not exited: (node, seconds)."""
    began = gang.running_since if gang.running_since is not None else gang.placed_at
    for node in gang.placement.nodes():
        seen = gang.seen.get(node)
        if seen is None or seen.absent_since is None or not _unexited(gang, node):
            continue
        heard = seen.last_at if gang.reports_read_at is None else min(seen.last_at, gang.reports_read_at)
        silent = heard - max(seen.absent_since, began)
        if silent >= limits.workers_lost:
            return node, silent
    return None


def _free(gang: Gang, released_at: float, now: float, limits: Limits) -> tuple[FreeNode, ...]:
    """The nodes of a released gang whose ranks are all gone (the fence)."""
    out = []
    for node, gpus in gang.placement.gpus_by_node().items():
        if node not in gang.freed and _confirmed(gang, node, released_at, now, limits):
            out.append(FreeNode(node, gpus))
    return tuple(out)


def _confirmed(gang: Gang, node: str, released_at: float, now: float, limits: Limits) -> bool:
    """Nothing of the gang runs on `node` any more. A lost node proves nothing: it was lost because
    placement stopped hearing it (a stalled or partitioned agent), its ranks may still run, and
    the agent registers it again as soon as it hears of the loss. Freeing its GPUs then (as
    before) let the next gang start beside the old ranks, which the agent was still stopping:
    two jobs on one GPU for ~20 s in a chaos run. A lost node's GPUs cannot be placed on anyway;
    they are freed when it is back and its heartbeats stop listing the gang (a node that comes
    back after a reboot lists nothing: 3 s)."""
    unexited = _unexited(gang, node)
    if not unexited:
        return True
    seen = gang.seen.get(node)
    if seen is None:
        # No heartbeat heard from the node yet: a placement that has just taken over (kill -9,
        # standby) knows nothing of it, and "nothing heard" is no proof that nothing runs (the
        # 20-minute chaos run: a reservation the agent had not handled yet started right after
        # a fresh placement freed its GPUs). A live node heartbeats within seconds; a dead one
        # is declared lost, and its GPUs wait for it to come back.
        return False
    if not _handled_release(gang, seen):
        # A node whose agent lags (its backlog still holds the reservation) lists nothing of the
        # gang now and starts it a moment later, after the release. Its silence counts once its
        # agent has handled the release.
        return False
    if seen.absent_since is not None and seen.last_at >= released_at \
            and seen.last_at - seen.absent_since >= limits.release_confirm:
        return True  # heartbeats up to after the release have not listed it for the bound: all gone
    # ranks that never started, and no heartbeat says they run: nothing to wait for after the bound
    return (not gang.started.intersection(unexited) and now - released_at >= limits.release_confirm
            and seen.absent_since is not None)


def _handled_release(gang: Gang, seen: NodeSeen) -> bool:
    """Whether the node's agent has handled the gang's release (an agent that does not report
    its position is taken at its heartbeats' word, as before)."""
    if seen.handled_position is None:
        return True
    return gang.released_position is not None and seen.handled_position >= gang.released_position


# ---- the heartbeats ----------------------------------------------------------------------------

class Heartbeats:
    """What the nodes' heartbeats (core NATS, never in the log) say runs where, kept in memory.

    Not a fold of the log: a placement that restarts starts empty, so every bound counted from
    heartbeats starts again from the first heartbeat it receives (never shorter, only later).
    Jobs unlisted for `forget_after` seconds are forgotten (they count as never listed, which
    is "absent since the node's first heartbeat": still absent)."""

    def __init__(self, forget_after: float = 600.0) -> None:
        self._forget_after = forget_after
        self._last: dict[str, float] = {}
        self._first: dict[str, float] = {}
        self._listed: dict[str, dict[str, float]] = {}   # node -> job -> last heartbeat listing it
        self._gone: dict[str, dict[str, float]] = {}     # node -> job -> first heartbeat after that not listing it
        self._handled: dict[str, int | None] = {}        # node -> the newest heartbeat's handled_position

    def record(self, node: str, at: float, job_ids: list[str] | tuple[str, ...],
               handled_position: int | None = None) -> None:
        self._first.setdefault(node, at)
        self._last[node] = at
        self._handled[node] = handled_position
        listed = self._listed.setdefault(node, {})
        gone = self._gone.setdefault(node, {})
        for job in job_ids:
            listed[job] = at
            gone.pop(job, None)
        for job, when in list(listed.items()):
            if when == at:
                continue
            first_gone = gone.setdefault(job, at)
            if at - first_gone > self._forget_after:
                del listed[job], gone[job]

    def seen(self, node: str, job_id: str) -> NodeSeen | None:
        last = self._last.get(node)
        if last is None:
            return None
        listed = self._listed[node].get(job_id)
        handled = self._handled.get(node)
        if listed == last:
            return NodeSeen(last, None, handled)
        if listed is None:
            return NodeSeen(last, self._first[node], handled)
        return NodeSeen(last, self._gone[node].get(job_id, last), handled)

    def about(self, nodes: list[str] | tuple[str, ...], job_id: str) -> dict[str, NodeSeen]:
        """`seen` for each of `nodes` that has heartbeated."""
        out = {}
        for node in nodes:
            seen = self.seen(node, job_id)
            if seen is not None:
                out[node] = seen
        return out
