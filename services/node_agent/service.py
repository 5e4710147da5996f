"""The node-agent service: one process hosting one agent per node, wired to NATS JetStream.

Why one process for many nodes: `corral up` simulates a whole cluster on one machine; each node
still has its own `Supervisor`, inventory, registration and heartbeat, exactly as one agent per
real machine would. On a real cluster run one process per machine (`corral agent`).

What an agent does:
- at start: publish NodeRegistered (its inventory) to `<ns>.inbox.NodeRegistered`;
- every `heartbeat_seconds`: a NodeHeartbeat on core NATS `<ns>.heartbeat.<node>` (not the log);
- consume its nodes' work with ONE durable consumer per process (`durable_name(nodes)`) on
  `<ns>.events.node.<node>.>` (`Subjects.node_work`; the relay sends each node only what is
  for it, `corral.bus.node_work`): NodeAssignment (start this node's ranks of a GangReserved,
  with the job's JobSubmitted and its queue's QueueConfigured: whether it may run as root, see
  `run_as`), PreemptRequested (checkpoint signal, then SIGTERM/SIGKILL at the deadline),
  GangReleased / JobCancelled / JobRequeued (stop an attempt still running here), NodeLost of one
  of its nodes (register again: the node is alive, placement may use it again). With
  `work_subjects="broadcast"` it consumes the broadcast `<ns>.events.<Type>` of `CONSUMED_TYPES`
  instead (every job's events: for a control plane whose relay does not send node work yet);
- report WorkerStarted / WorkerExited / CheckpointDone to the inbox (see `reports`);
- publish each rank's output to `<ns>.logs.user.<owner>.<job>.<attempt>.<node>.<rank>` (see `log_shipper`).

The durable delivers only events published after it was first created (DeliverPolicy.NEW), and a
restarted process resumes from its acknowledged position: an agent never replays history and
relaunches long-finished gangs. What it needs from before that point (reservations for adoption;
with broadcast subjects also the specs of jobs not ended) is read once at start from its own
subjects of the events stream, before any event is handled. Changing `work_subjects` keeps the
durable (its filter is updated): it goes on after the last message it acknowledged.

Workers outlive the agent: each gang attempt runs under its own stepd (see `stepd`,
`supervisor`), which records every start and exit in the node's run dir. At start, before any
event is handled or the node registers, the agents adopt the stepds an earlier process left
(`Supervisor.adopt`): their exits that happened meanwhile are reported (deterministic event ids:
a second copy is dropped), running ones are listed in the heartbeats, and those the log no longer
keeps on this node (released, requeued, ended, superseded: `adoption.ReservationLedger`, folded
from the events stream with the job specs) are stopped and waited for.

Shutdown (SIGTERM/SIGINT, or `stop` set): stop consuming, publish the pending reports, exit. The
stepds keep running (an upgrade: the next agent adopts them) unless `stop_workers_on_exit` is set:
then every gang is stopped first (SIGTERM, SIGKILL after `stop_grace_seconds`; their WorkerExited
carry STOPPED). The `sim-timer` runtime's gangs live in the agent and end with it, unreported.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import nats.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from corral import environment
from corral.bus import Bus, Delivery, Outgoing, Poison, Retry, StreamMissing, Unavailable
from corral.bus.naming import EVENTS, durable_name, history_consumer
from corral.bus.relay import POSITION, STREAM_VERSION
from corral.bus.urls import addresses
from corral.contracts.cluster import NodeInventory
from corral.contracts.envelope import Event, node_stream
from corral.contracts.events import (
    GangReleased,
    GangReserved,
    GpuHealthChanged,
    GpuProblem,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobRejected,
    JobRequeued,
    JobSubmitted,
    NodeCondition,
    NodeConditionsChanged,
    NodeHeartbeat,
    NodeLost,
    NodeRegistered,
    PortRange,
    PreemptRequested,
    QueueConfigured,
)
from corral.contracts.flow import NODE_AGENT
from corral.contracts.flow import names as flow_names
from corral.contracts.jobspec import JobSpec
from corral.contracts.node_work import KIND as ASSIGNMENT
from corral.contracts.node_work import decode_assignment
from corral.contracts.problems import ContractError
from corral.contracts.queues import QueueSpec
from corral.contracts.registry import decode, encode
from corral.contracts.routes import consumed_by
from corral.contracts.subjects import Subjects
from corral.core.conditions import Condition, Held, Thresholds, transition
from corral.health import start_beat
from corral.services.waiting import when_up
from corral.telemetry.agent import AgentTelemetry
from corral.telemetry.health import Phase

from .host import pressure
from .host.gpu_health import NvmlWatcher, Problem
from .host.interfaces import with_gloo_interface
from .process.adoption import LEDGER_TYPES, ReservationLedger, Verdict, should_stop
from .process.fork_server import ForkServer
from .process.run_as import Refused, RunAs, WorkerUser, resolve, switches_users
from .process.supervisor import AgentEvents, Supervisor
from .process.timer_supervisor import TimerSupervisor
from .reporting.log_shipper import LogShipper, ShippingEvents
from .reporting.reports import START_FAILED, NodeReports, ReportPublisher
from .reservation import AgentRuntime, build_assignment, local_ranks

log = logging.getLogger("corral.node_agent")

CONSUMED_TYPES: tuple[str, ...] = flow_names(consumed_by(NODE_AGENT))
"""Event types the agents' durable consumer reads from `<ns>.events.<Type>` with broadcast
subjects (each event's `flow`)."""
WORK_SUBJECTS = ("node", "broadcast")

_HISTORY_TYPES = flow_names((JobSubmitted, QueueConfigured, *LEDGER_TYPES))
_TRUST_ABSENCE_AFTER = 3600.0  # seconds: see `AgentHost.reservations_known_since`
_VERSIONS_KEPT = 100_000  # streams whose last handled version the agent remembers (the least recent go)
_ENDED = (JobCompleted, JobFailed, JobCancelled, JobRejected)
EVENTS_MAX_DELIVER = 5  # deliveries of an event to the agents' durable (see `AgentHost._await_submission`)
_HISTORY_FETCH = 512
_GANGS_KEPT = 100_000  # jobs whose nodes in this process are kept (`AgentHost._gang_nodes`)
_SPECS_KEPT = 100_000  # job specs kept (node work carries each assignment's own: a bound, not a need)


#: The server deletes an agent durable no process has used for this long (seconds): durables are
#: named after their node set, so those of node sets that are gone for good would pile up.
IDLE_EXPIRY = 86_400.0


@dataclass(frozen=True)
class AgentOptions:
    """How the agents run workers; paths are created on demand.

    `job_log_dir`: rank logs go to `<job_log_dir>/<job>/rank-<N>.log`. `checkpoint_root`: a job's
    `CORRAL_CHECKPOINT_DIR` is `<checkpoint_root>/<job>`; it must be shared storage when a job can
    resume on another machine (on one machine hosting fake nodes it is simply shared).
    `run_as`: whose OS account the ranks run as (see `run_as`); AGENT here, so that code starting
    agents in-process keeps its behaviour; `corral agent` defaults to
    SUBMITTER, which takes effect when the agent is root.
    `advertise_address`: where other hosts reach this machine, sent in NodeRegistered (rank 0's
    node's address is a gang's MASTER_ADDR); None: placement's fallback (`CORRAL_MASTER_ADDR`).
    `rendezvous_ports`: the (low, high) ports placement may give gangs mastered here as
    MASTER_PORT; None: placement's default range.
    `spec_wait_seconds`: how long a reservation whose JobSubmitted has not arrived yet waits for it
    (redelivered by the bus) before its ranks are reported not started; longer than the events
    consumer's ack wait (30 s), which is how late a submission lost in a NATS failover comes back.
    """

    work_dir: Path
    runtime: AgentRuntime = "process"
    job_log_dir: Path | None = None
    checkpoint_root: Path | None = None
    heartbeat_seconds: float = 2.0
    stop_grace_seconds: float = 10.0
    kill_grace_seconds: float = 5.0
    python: str = sys.executable
    stop_workers_on_exit: bool = False  # a graceful stop leaves workers running unless this is set
    run_as: RunAs = RunAs.AGENT
    advertise_address: str | None = None
    rendezvous_ports: tuple[int, int] | None = None
    spec_wait_seconds: float = 45.0
    #: Node conditions (`corral.core.conditions`), measured every `conditions_seconds`: DiskPressure
    #: below this free share of a folder it writes (state, rank logs, checkpoints), MemoryPressure
    #: below this many MiB available.
    disk_pressure_below: float = 0.10
    memory_pressure_below_mib: float = 256.0
    conditions_seconds: float = 5.0
    #: A held condition clears only at or above its clear threshold (`Thresholds`) and once its
    #: measure has not been below the entry one for this long: a node at a threshold does not flap.
    pressure_hold_seconds: float = 10.0
    #: "node": consume `<ns>.events.node.<node>.>` (only this node's work); "broadcast": every job's
    #: events on `<ns>.events.<Type>` (a control plane whose relay does not send node work yet).
    work_subjects: str = "node"
    #: Watch the GPUs' health through NVML (`gpu_health`; an agent of one NVML node), reading them
    #: every `gpu_health_seconds`: a GPU gone bad is reported within a heartbeat.
    gpu_health: bool = False
    gpu_health_seconds: float = 1.0

    def __post_init__(self) -> None:
        if self.work_subjects not in WORK_SUBJECTS:
            raise ValueError(f"work_subjects must be one of {', '.join(WORK_SUBJECTS)}, got {self.work_subjects!r}")
        if self.runtime not in ("sim", "sim-timer", "process"):
            raise ValueError(f"runtime must be sim, sim-timer or process, got {self.runtime!r}")
        if self.heartbeat_seconds <= 0:
            raise ValueError(f"heartbeat_seconds must be > 0, got {self.heartbeat_seconds}")
        if self.stop_grace_seconds < 0 or self.kill_grace_seconds < 0:
            raise ValueError("stop_grace_seconds and kill_grace_seconds must be >= 0")
        if self.spec_wait_seconds <= 0:
            raise ValueError(f"spec_wait_seconds must be > 0, got {self.spec_wait_seconds}")
        if not 0 <= self.disk_pressure_below < 1:
            raise ValueError(f"disk_pressure_below is a share of the disk, 0 <= it < 1: got {self.disk_pressure_below}")
        if self.gpu_health_seconds <= 0:
            raise ValueError(f"gpu_health_seconds must be > 0, got {self.gpu_health_seconds}")
        if self.memory_pressure_below_mib < 0 or self.conditions_seconds <= 0 or self.pressure_hold_seconds < 0:
            raise ValueError("memory_pressure_below_mib and pressure_hold_seconds must be >= 0, "
                             "conditions_seconds > 0")
        if self.rendezvous_ports is not None:
            PortRange(low=self.rendezvous_ports[0], high=self.rendezvous_ports[1])  # raises a clear error
        if not isinstance(self.run_as, RunAs):
            object.__setattr__(self, "run_as", RunAs.parse(str(self.run_as), "run_as"))

    @property
    def logs(self) -> Path:
        return self.job_log_dir or self.work_dir / "logs"

    @property
    def checkpoints(self) -> Path:
        return self.checkpoint_root or self.work_dir / "checkpoints"


class NodeAgent:
    """One node: its inventory, its supervisor, and what it does with each event."""

    def __init__(self, inventory: NodeInventory, options: AgentOptions, publisher: ReportPublisher,
                 shipper: LogShipper | None = None, launcher: ForkServer | None = None) -> None:
        self.inventory = inventory
        self.node = inventory.node
        self.actor = f"node-agent/{self.node}"
        self.options = options
        self.reports = NodeReports(self.node, publisher)
        # Each rank's output also goes to the bus (`log_shipper`), when a shipper is given.
        # Its cursor files go in the attempt folders of the run folder (see `log_shipper`).
        run_dir = options.work_dir / self.node / "run"
        events: AgentEvents = self.reports if shipper is None else ShippingEvents(
            self.reports, shipper, self.node, options.logs, run_dir, earlier=options.work_dir / self.node / "logship")
        self.supervisor: Supervisor | TimerSupervisor = (
            TimerSupervisor(self.reports) if options.runtime == "sim-timer" else
            Supervisor(events, run_dir, kill_grace=options.kill_grace_seconds,
                       python=options.python, launcher=launcher))
        # Ranks run as their submitter only where there are processes to run and we may switch.
        self.switch_users = options.runtime != "sim-timer" and switches_users(options.run_as)
        self._heartbeats = 0
        #: the conditions last reported (None: none since the last registration)
        self.reported_conditions: tuple[NodeCondition, ...] | None = None
        #: the conditions in force, each with when its measure was last below its threshold
        self.held_conditions: dict[Condition, Held] = {}
        #: the unhealthy GPUs as the NVML watcher sees them (None: not watched), and as last
        #: reported (None: not since the last registration)
        self.gpu_problems: tuple[GpuProblem, ...] | None = None
        self.reported_health: tuple[GpuProblem, ...] | None = None

    # --- what the node says about itself --------------------------------------------------------

    def conditions(self) -> NodeConditionsChanged | None:
        """The node's conditions as measured now, when they differ from the last reported (or none
        was reported since the node registered); None: nothing to say."""
        folders = [self.options.work_dir / self.node / "run", self.options.logs, self.options.checkpoints]
        thresholds = Thresholds(self.options.disk_pressure_below, self.options.memory_pressure_below_mib,
                                hold_seconds=self.options.pressure_hold_seconds)
        self.held_conditions = transition(self.held_conditions, pressure.sample(folders), thresholds,
                                          time.monotonic())
        now = tuple(NodeCondition(type=kind.value, message=held.message)
                    for kind, held in sorted(self.held_conditions.items()))
        if self.reported_conditions is not None and \
                [c.type for c in now] == [c.type for c in self.reported_conditions]:
            return None
        self.reported_conditions = now
        return NodeConditionsChanged.new(stream=node_stream(self.node), actor=self.actor, correlation_id=self.node,
                                         node=self.node, conditions=list(now))

    def gpu_health(self) -> GpuHealthChanged | None:
        """The GPUs found unhealthy now, when that differs from the last report (or none was made
        since the node registered); None: nothing to say, or the GPUs are not watched."""
        now = self.gpu_problems
        if now is None or now == self.reported_health:
            return None
        self.reported_health = now
        return GpuHealthChanged.new(stream=node_stream(self.node), actor=self.actor, correlation_id=self.node,
                                    node=self.node, unhealthy=list(now))

    def registration(self) -> NodeRegistered:
        inv = self.inventory
        ports = self.options.rendezvous_ports
        return NodeRegistered.new(stream=node_stream(self.node), actor=self.actor, correlation_id=self.node,
                                  node=self.node, gpus=list(inv.gpus),
                                  nvlink_domains=[list(d) for d in inv.nvlink_domains],
                                  rack=inv.rack, zone=inv.zone, address=self.options.advertise_address,
                                  rendezvous_ports=PortRange(low=ports[0], high=ports[1]) if ports else None,
                                  cpus=inv.cpus, host_memory_gib=inv.host_memory_gib, datasets=dict(inv.datasets))

    def heartbeat(self, handled_position: int | None = None) -> NodeHeartbeat:
        self._heartbeats += 1
        # a gang that ended here stays listed until its exit report is published (it is on its way)
        running = {*self.supervisor.running_jobs(), *self.reports.unpublished_jobs()}
        return NodeHeartbeat.new(stream=node_stream(self.node), actor=self.actor, correlation_id=self.node,
                                 node=self.node, sequence=self._heartbeats, running_job_ids=sorted(running),
                                 handled_position=handled_position)

    # --- events ---------------------------------------------------------------------------------

    async def on_gang_reserved(self, event: GangReserved, spec: JobSpec | None, *, submitter: str | None = None,
                               allow_root: bool = False) -> None:
        """Start this node's ranks of the gang (idempotent per job and attempt).

        `submitter`: the user the log recorded on the job's JobSubmitted; `allow_root`: whether the
        job's queue lets it run as uid 0. Both matter only when ranks run as their submitter."""
        share = local_ranks(event, self.node)
        if share is None:
            return
        job, attempt = event.job_id, event.attempt
        current = self.supervisor.running_attempt(job)
        if current is not None and current > attempt:
            log.info("%s: ignoring GangReserved of %s attempt %d: attempt %d already runs", self.node, job,
                     event.attempt, current)
            return
        if current is not None and current < attempt:
            log.warning("%s: %s attempt %d still runs when attempt %d is reserved; stopping it", self.node,
                        job, current, event.attempt)
            await self.supervisor.stop(job, self.options.stop_grace_seconds)
        if spec is None:
            self._not_started(event, [r.rank for r in share.ranks],
                              "the node agent never saw this job's JobSubmitted, so it has no command")
            return
        user: WorkerUser | None = None
        if self.switch_users:
            found = resolve(submitter, queue=spec.queue, allow_root=allow_root, node=self.node)
            if isinstance(found, Refused):
                self._not_started(event, [r.rank for r in share.ranks], found.message, code=found.code)
                return
            user = found
        try:
            assignment = build_assignment(event, self.node, spec, runtime=self.options.runtime,
                                          python=self.options.python,
                                          checkpoint_root=self.options.checkpoints, log_dir=self.options.logs,
                                          user=user, datasets=self.inventory.datasets)
        except ValueError as exc:
            self._not_started(event, [r.rank for r in share.ranks], str(exc))
            return
        if assignment is None:
            return
        # Not waiting for the ranks: the next event (another job's start) is not held up by this
        # one's; the ranks' starts and exits are reported from the stepd's state.
        await self.supervisor.start(assignment, cause=event.event_id, wait=False)

    def _not_started(self, event: GangReserved, ranks: list[int], message: str, *, code: str = START_FAILED) -> None:
        log.error("%s: cannot start %s attempt %d: %s", self.node, event.job_id, event.attempt, message)
        for rank in ranks:
            self.reports.rank_not_started(event.job_id, rank, event.attempt, code, message, cause=event)

    def on_preempt(self, event: PreemptRequested) -> None:
        """Checkpoint signal now; SIGTERM, then SIGKILL at the event's deadline (in the background)."""
        job = event.victim_job_id
        if self.supervisor.running_attempt(job) is None:
            return
        grace = preempt_grace(event)
        log.info("%s: preempting %s for %s (signal %s, %.1fs grace)", self.node, job, event.for_job_id,
                 event.signal, grace)
        self.supervisor.send_preempt(job, grace, event.signal, cause=event.event_id)

    def on_stop(self, job_id: str, *, up_to_attempt: int | None, cause: Event) -> None:
        """Stop `job_id` here if its running attempt is <= `up_to_attempt` (contract numbering;
        None: any attempt). SIGTERM, SIGKILL after the stop grace (carried out by the stepd)."""
        current = self.supervisor.running_attempt(job_id)
        if current is None:
            return
        if up_to_attempt is not None and current > up_to_attempt:
            return
        log.info("%s: stopping %s attempt %d (%s)", self.node, job_id, current, cause.type)
        self.supervisor.send_stop(job_id, self.options.stop_grace_seconds, cause=cause.event_id)

    def on_over(self, job_id: str, *, up_to_attempt: int | None) -> None:
        """The log holds the end of `job_id`'s attempts up to `up_to_attempt` (None: the job
        ended): their run folders go once reported (`Supervisor.attempts_over`)."""
        if isinstance(self.supervisor, Supervisor):
            self.supervisor.attempts_over(job_id, up_to_attempt)

    async def adopt(self, ledger: ReservationLedger, reservations_known_since: float | None,
                    unacked: set[tuple[str, int]] | None = None) -> list[str]:
        """Follow the stepds an earlier agent process left; stop (and wait for) those the log does
        not keep on this node. `reservations_known_since`: a gang launched after this time would
        have its GangReserved in the history read (None: nothing can be concluded from absence).
        The run folders of attempts the log says are over go once reported; `unacked`: the
        reservations our consumer may still deliver (None: any may), whose removed attempts are
        remembered as launched here. Returns the jobs whose adopted gangs it keeps."""
        if isinstance(self.supervisor, Supervisor):
            adopted = await self.supervisor.adopt(
                lambda job, attempt: ledger.verdict(job, attempt, self.node) in (Verdict.ENDED, Verdict.RELEASED),
                redeliverable=None if unacked is None else lambda job, attempt: (job, attempt) in unacked)
        else:
            adopted = await self.supervisor.adopt()
        unwanted: list[str] = []
        kept: list[str] = []
        for gang in adopted:
            if not gang.running:
                continue
            verdict = ledger.verdict(gang.job_id, gang.attempt, self.node)
            complete = reservations_known_since is not None and gang.launched_at >= reservations_known_since
            if should_stop(verdict, history_complete=complete):
                log.warning("%s: adopted %s attempt %d is %s in the log; stopping it", self.node, gang.job_id,
                            gang.attempt, verdict.value)
                unwanted.append(gang.job_id)
            else:
                log.info("%s: adopted %s attempt %d (%s in the log)", self.node, gang.job_id,
                         gang.attempt, verdict.value)
                kept.append(gang.job_id)
        await asyncio.gather(*(self.supervisor.stop(job, self.options.kill_grace_seconds) for job in unwanted))
        return kept

    async def close(self) -> None:
        """Leave the gangs to their stepds (default), or stop them all (`stop_workers_on_exit`)."""
        if self.options.stop_workers_on_exit:
            await self.supervisor.close(self.options.stop_grace_seconds)
        await self.supervisor.detach()


class AgentHost:
    """The process: its agents, the job-spec cache, and the dispatch of consumed events."""

    def __init__(self, bus: Bus, agents: Sequence[NodeAgent], publisher: ReportPublisher,
                 work_subjects: str = "node") -> None:
        self.bus = bus
        self.work_subjects = work_subjects
        self.agents = {agent.node: agent for agent in agents}
        self.publisher = publisher
        self.specs: dict[str, JobSpec] = {}
        self.submitters: dict[str, str | None] = {}  # job -> the user its JobSubmitted records
        self.queues: dict[str, QueueSpec] = {}  # for `allow_root`
        # Read once, when the agents adopt what survived a restart (`adoption_done` closes it).
        self.ledger = ReservationLedger()
        self._ledger_open = True
        self.reservations_known_since: float | None = None
        #: the reservations (job, attempt) our durable may still deliver, read with the history
        #: (`load_history`; None: not read, any may): the removed attempts of the others are forgotten
        self.unacked: set[tuple[str, int]] | None = None
        self.ready = asyncio.Event()
        # The log position handled up to (heartbeats say it: `NodeHeartbeat.handled_position`).
        self._handled: int | None = None
        self._failed: set[int] = set()  # positions whose handling failed (redelivered later)
        # The newest version handled of each stream (the log's order; see `_in_log_order`).
        self._versions: OrderedDict[str, int] = OrderedDict()
        # job -> the nodes of this process a gang of it was started on (reserved or adopted): a
        # stop or a preemption goes to those agents only, not to every agent of the process (one
        # process hosts every simulated node). A job not held (never started here, or forgotten
        # for room) goes to every agent, each of which checks whether it runs the job.
        self._gang_nodes: OrderedDict[str, set[str]] = OrderedDict()

    def started_on(self, job_id: str, nodes: Iterable[str]) -> None:
        """Record that a gang of `job_id` may run on these nodes of this process."""
        held = self._gang_nodes.get(job_id)
        if held is None:
            held = self._gang_nodes[job_id] = set()
            while len(self._gang_nodes) > _GANGS_KEPT:
                self._gang_nodes.popitem(last=False)
        held.update(node for node in nodes if node in self.agents)

    def agents_of(self, job_id: str) -> list[NodeAgent]:
        """The agents that may run a gang of `job_id` (see `_gang_nodes`)."""
        nodes = self._gang_nodes.get(job_id)
        if nodes is None:
            return list(self.agents.values())
        return [self.agents[node] for node in sorted(nodes)]

    @property
    def handled_position(self) -> int | None:
        """Every consumed event up to this log position is handled: the highest handled, but below
        any whose handling failed and waits for its redelivery."""
        if self._handled is None or not self._failed:
            return self._handled
        return min(self._handled, min(self._failed) - 1)

    def _handled_up_to(self, position: int) -> None:
        self._failed.discard(position)
        self._handled = position if self._handled is None else max(self._handled, position)

    def remember(self, event: Event) -> None:
        """Keep the spec of every job that may still be placed; forget jobs that ended."""
        if self._ledger_open:
            self.ledger.fold(event)
        if isinstance(event, JobSubmitted):
            self.specs[event.job_id] = event.spec
            self.submitters[event.job_id] = event.user
            while len(self.specs) > _SPECS_KEPT:
                self.submitters.pop(next(iter(self.specs)), None)
                del self.specs[next(iter(self.specs))]
        elif isinstance(event, QueueConfigured):
            self.queues[event.queue.name] = event.queue
        elif isinstance(event, _ENDED):
            self.specs.pop(event.job_id, None)
            self.submitters.pop(event.job_id, None)
            for agent in self.agents_of(event.job_id):
                agent.reports.forget(event.job_id)

    def adoption_done(self) -> None:
        """The agents have adopted what survived a restart: nothing reads the reservation ledger
        again, so it is emptied and folds nothing more (the process's memory stays bounded)."""
        self._ledger_open = False
        self.ledger = ReservationLedger()

    async def load_history(self, durable: str, acked_through: int = 0) -> int:
        """Read what happened before this process's consumer existed with a throwaway consumer:
        the specs of jobs submitted (JobSubmitted minus ended jobs) and the ledger of reservations
        (what adoption checks); returns how many events were read.

        `acked_through` is the stream sequence up to which our durable will deliver nothing (its
        ack floor): those events are handled (by an earlier process, or never to be started by
        this one, adoption settling what runs), which sets `handled_position`.

        The throwaway consumer is named after `durable` (`history_consumer`): the agent's identity
        may create, read and delete only that one besides its durable (`corral.bus.auth.agent`).
        One left by a previous process (it expires after a minute) is deleted first, so the read
        starts at the stream's first message.

        Also sets `reservations_known_since`: if the stream never dropped a message, the reservation
        of every gang launched after its oldest message is in what was read; if it did (max age),
        only those launched well after its oldest message (an hour) are sure to be."""
        names = self.bus.names
        subjects = self.subjects(_HISTORY_TYPES)
        name = history_consumer(durable)
        config = ConsumerConfig(name=name, deliver_policy=DeliverPolicy.ALL,
                                ack_policy=AckPolicy.NONE, inactive_threshold=60.0, mem_storage=True)
        if len(subjects) == 1:  # in the create call's subject, where the identity's permission checks it
            config.filter_subject = subjects[0]
        else:
            config.filter_subjects = subjects
        stream = names.stream(EVENTS)
        info = await self.bus.js.stream_info(stream)
        complete = info.state.first_seq <= 1
        with contextlib.suppress(NotFoundError):
            await self.bus.js.delete_consumer(stream, name)
        await self.bus.js.add_consumer(stream, config)
        sub = await self.bus.js.pull_subscribe_bind(name, stream=stream)
        read = 0
        oldest: float | None = None
        unacked: set[tuple[str, int]] = set()
        try:
            remaining = int((await sub.consumer_info()).num_pending)
            while remaining > 0:
                for msg in await sub.fetch(min(remaining, _HISTORY_FETCH), timeout=5.0):
                    read += 1
                    if oldest is None:
                        oldest = msg.metadata.timestamp.timestamp()
                    remaining = int(msg.metadata.num_pending)
                    with contextlib.suppress(ContractError):
                        event, carried = _decoded(msg.subject, msg.data)
                        for known in (*carried, event):
                            self.remember(known)
                        if isinstance(event, GangReserved) and msg.metadata.sequence.stream > acked_through:
                            unacked.add((event.job_id, event.attempt))
                    if msg.metadata.sequence.stream <= acked_through:
                        with contextlib.suppress(TypeError, ValueError):
                            self._handled_up_to(int((msg.headers or {}).get(POSITION, "")))
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            with contextlib.suppress(Exception):
                await self.bus.js.delete_consumer(stream, name)
        self.unacked = unacked  # the whole history read: a reservation not in it is acked or gone
        if self._handled is None:
            self._handled = 0  # nothing before our durable's first delivery: handled up to nothing
        if oldest is not None:
            # A stream recreated after a gang's launch (JetStream storage lost) starts after it:
            # its oldest message is newer than the launch, and absence proves nothing.
            self.reservations_known_since = oldest if complete else oldest + _TRUST_ABSENCE_AFTER
        return read

    def subjects(self, broadcast_types: Sequence[str] = CONSUMED_TYPES) -> list[str]:
        """What the agents consume: each node's work subjects, or the broadcast `broadcast_types`."""
        if self.work_subjects == "broadcast":
            return [self.bus.names.events_subject(t) for t in broadcast_types]
        subjects = Subjects(self.bus.names.name)
        return [subjects.node_work_wildcard(node) for node in sorted(self.agents)]

    async def on_event(self, delivery: Delivery) -> None:
        await self.ready.wait()  # specs from before the consumer existed are loaded first
        try:
            position: int | None = int(delivery.headers.get(POSITION, ""))
        except ValueError:
            position = None
        try:
            await self._on_event(delivery)
        except BaseException:
            if position is not None:
                self._failed.add(position)
            raise
        if position is not None:
            self._handled_up_to(position)

    def _in_log_order(self, event: Event, delivery: Delivery) -> bool:
        """Whether `event` comes after everything handled of its stream, as the log orders it.

        Only service identities may publish events (`corral.bus.auth`), but an agent acts on what
        it receives by starting, signalling and killing processes: a message that did not come from
        the relay (no stream version) is refused, and one older than, or as old as, what it handled
        of that stream is a replay or a stale redelivery (a reservation delivered again after its
        release), ignored. Versions of a job's stream grow with the log; the agent sees only some
        of its events, so they are compared, never required to be consecutive."""
        try:
            version = int(delivery.headers.get(STREAM_VERSION, ""))
        except ValueError:
            raise Poison(f"{event.type} {event.event_id} on {delivery.subject} carries no {STREAM_VERSION} "
                         "header: not published by the log's relay") from None
        last = self._versions.get(event.stream)
        if last is not None and version <= last:
            log.warning("%s %s of %s (version %d) ignored: version %d of that stream was handled already",
                        event.type, event.event_id, event.stream, version, last)
            return False
        return True

    def _handled_version(self, event: Event, delivery: Delivery) -> None:
        with contextlib.suppress(ValueError):
            self._versions[event.stream] = int(delivery.headers.get(STREAM_VERSION, ""))
            self._versions.move_to_end(event.stream)
            while len(self._versions) > _VERSIONS_KEPT:
                self._versions.popitem(last=False)

    async def _on_event(self, delivery: Delivery) -> None:
        try:
            event, carried = _decoded(delivery.subject, delivery.data)
        except ContractError as exc:
            raise Poison(f"undecodable event on {delivery.subject}: {exc}") from exc
        for known in carried:  # the spec and queue an assignment brings: knowledge, in any order
            self.remember(known)
        if not self._in_log_order(event, delivery):
            if isinstance(event, JobSubmitted) and event.job_id not in self.specs:
                # Knowledge, not an action: a submission redelivered after later events of its
                # job (its first delivery lost in a NATS failover) is what a waiting reservation
                # needs. (The spec of a job that has ended meanwhile stays until the process ends.)
                self.remember(event)
            return
        if isinstance(event, GangReserved) and event.job_id not in self.specs and not carried:
            self._await_submission(event, delivery)
        await self._dispatch(event)
        self._handled_version(event, delivery)

    def _await_submission(self, event: GangReserved, delivery: Delivery) -> None:
        """A reservation for a job whose JobSubmitted this process has not seen: have it
        redelivered (`Retry`, `EVENTS_MAX_DELIVER` deliveries over `spec_wait_seconds`) while the
        submission may still come; on the last delivery it is dispatched without a spec, and its
        local ranks are reported not started."""
        local = [agent for agent in self.agents.values() if any(r.node == agent.node for r in event.ranks)]
        if not local or delivery.delivery_count >= EVENTS_MAX_DELIVER:
            return
        wait = local[0].options.spec_wait_seconds
        raise Retry(f"{event.job_id}: GangReserved before its JobSubmitted; waiting for the submission",
                    delay=wait / (EVENTS_MAX_DELIVER - 1))

    async def _dispatch(self, event: Event) -> None:
        self.remember(event)
        if isinstance(event, GangReserved):
            spec = self.specs.get(event.job_id)
            queue = self.queues.get(spec.queue) if spec is not None else None
            nodes = {r.node for r in event.ranks}
            self.started_on(event.job_id, nodes)
            for node in sorted(nodes):
                agent = self.agents.get(node)
                if agent is not None:
                    await agent.on_gang_reserved(event, spec, submitter=self.submitters.get(event.job_id),
                                                 allow_root=queue is not None and queue.allow_root)
        elif isinstance(event, PreemptRequested):
            for agent in self.agents_of(event.victim_job_id):
                agent.on_preempt(event)
        elif isinstance(event, GangReleased):
            for agent in self.agents_of(event.job_id):
                agent.on_stop(event.job_id, up_to_attempt=event.attempt, cause=event)
                agent.on_over(event.job_id, up_to_attempt=event.attempt)
        elif isinstance(event, JobRequeued):
            for agent in self.agents_of(event.job_id):
                agent.on_stop(event.job_id, up_to_attempt=event.attempt - 1, cause=event)
                agent.on_over(event.job_id, up_to_attempt=event.attempt - 1)
        elif isinstance(event, JobCancelled):
            for agent in self.agents_of(event.job_id):
                agent.on_stop(event.job_id, up_to_attempt=None, cause=event)
        elif isinstance(event, NodeLost) and event.node in self.agents:
            # Placement stopped hearing us (a partition, a stalled loop) and released our jobs
            # (their GangReleased stops them here); we are alive, so offer the node again.
            log.warning("%s: marked lost (%s); registering again", event.node, event.reason.message)
            self.publisher.send(self.agents[event.node].registration())
            self.agents[event.node].reported_conditions = None  # said again after the registration
            self.agents[event.node].reported_health = None
            self.report_gpu_health(self.agents[event.node])
        if isinstance(event, _ENDED):
            for agent in self.agents_of(event.job_id):
                agent.on_over(event.job_id, up_to_attempt=None)
            self._gang_nodes.pop(event.job_id, None)

    def report_gpu_health(self, agent: NodeAgent) -> None:
        """Send the agent's GPU health if it is news (see `NodeAgent.gpu_health`)."""
        report = agent.gpu_health()
        if report is None:
            return
        for p in report.unhealthy:
            log.warning("%s: GPU %d unhealthy: %s", agent.node, p.gpu, p.message)
        if not report.unhealthy:
            log.info("%s: every GPU is healthy", agent.node)
        self.publisher.send(report)


def _decoded(subject: str, data: bytes) -> tuple[Event, tuple[Event, ...]]:
    """The event a message is about, and what it carries besides (a NodeAssignment's submission and
    queue); ContractError for anything else."""
    if subject.endswith("." + ASSIGNMENT):
        assignment = decode_assignment(data)
        carried = tuple(e for e in (assignment.submission, assignment.queue) if e is not None)
        return assignment.reservation, carried
    return decode(data), ()


def preempt_grace(event: PreemptRequested) -> float:
    """The seconds a preempted gang has to checkpoint and stop, by the clock of the one that decided:
    its deadline less the moment it decided. Not against this node's clock: a node minutes ahead
    of the decider's SIGKILLed its gang at once, without a checkpoint; one minutes behind kept it
    past the deadline placement counts its overrun from."""
    return max(0.0, (event.deadline - event.occurred_at).total_seconds())


async def _heartbeats(bus: Bus, subjects: Subjects, host: AgentHost, every: float) -> None:
    while True:
        for agent in host.agents.values():
            try:
                await bus.nc.publish(subjects.heartbeat(agent.node), encode(agent.heartbeat(host.handled_position)))
            except (nats.errors.Error, OSError) as exc:
                log.warning("%s: heartbeat not sent: %s", agent.node, exc)
        await asyncio.sleep(every)


async def _conditions(host: AgentHost, every: float) -> None:
    """Each node's conditions, reported when they change (and first after its registration)."""
    while True:
        for agent in host.agents.values():
            try:
                report = await asyncio.to_thread(agent.conditions)
            except Exception:  # a measure that fails must not stop the others
                log.exception("%s: measuring its conditions failed", agent.node)
                continue
            if report is not None:
                for c in report.conditions:
                    log.warning("%s: %s: %s", agent.node, c.type, c.message)
                if not report.conditions:
                    log.info("%s: no condition holds", agent.node)
                host.publisher.send(report)
        await asyncio.sleep(every)


def watch_gpus(host: AgentHost, agent: NodeAgent, every: float) -> NvmlWatcher | None:
    """Watch the agent's GPUs through NVML (`gpu_health`) and report each change of the unhealthy
    ones; None (logged) where NVML cannot be watched."""
    loop = asyncio.get_running_loop()
    agent.gpu_problems = ()

    def changed(problems: tuple[Problem, ...]) -> None:
        said = tuple(GpuProblem(gpu=p.gpu, code=p.code, message=p.message, xid=p.xid)  # type: ignore[arg-type, unused-ignore]
                     for p in problems)

        def report() -> None:
            agent.gpu_problems = said
            host.report_gpu_health(agent)

        loop.call_soon_threadsafe(report)

    watcher = NvmlWatcher(changed, poll_seconds=every)
    try:
        watcher.start()
    except Exception as exc:  # pynvml raises NVMLError subclasses; a broken driver may raise others
        log.error("%s: GPU health is not watched: NVML did not start (%s)", agent.node, exc)
        return None
    host.report_gpu_health(agent)  # every GPU healthy until the watcher says otherwise
    return watcher


async def _open_bus(nats_url: str, namespace: str, credentials: str | None, ca: str | None) -> Bus:
    """A connection with the streams in place (an agent may not declare them: it waits for them)."""
    bus = await Bus.connect(nats_url, namespace, name=f"corral-node-agents-{namespace}", credentials=credentials,
                            ca=ca)
    try:
        await bus.ensure_streams()
    except StreamMissing as exc:
        await bus.close()
        raise Unavailable(f"no stream takes {exc.subject!r} yet: the control plane's services declare the "
                          "streams when they start") from exc
    except BaseException:
        await bus.close()
        raise
    return bus


async def run_agents(nats_url: str, namespace: str, inventories: Sequence[NodeInventory],
                     options: AgentOptions, stop: asyncio.Event, *,
                     on_ready: Callable[[AgentHost], None] | None = None, credentials: str | None = None,
                     ca: str | None = None) -> None:
    """Run one agent per inventory until `stop` is set, then shut down cleanly (see module doc).

    `on_ready` is called once the agents consume events and have queued their registrations.
    `credentials` / `ca`: the NATS identity file and CA (default: `$CORRAL_NATS_CREDENTIALS`,
    `$CORRAL_NATS_CA`; see `Bus.connect`).
    """
    if not inventories:
        raise ValueError("run_agents: no nodes to run; declare at least one node")
    names = [inv.node for inv in inventories]
    if len(set(names)) != len(names):
        raise ValueError(f"run_agents: node names repeat: {sorted(names)}")
    subjects = Subjects(namespace)
    # NATS, and the streams the services declare, are waited for as every service waits for its
    # dependencies (`corral.services.waiting`): an agent started before them, or without them for
    # a while, neither exits nor ignores a stop.
    opened = await when_up("node agents", "NATS", lambda: _open_bus(nats_url, namespace, credentials, ca), stop,
                           where=addresses(nats_url))
    if opened is None:
        return
    bus = opened
    publisher = ReportPublisher(bus, subjects)

    async def publish_log(subject: str, data: bytes, msg_id: str) -> None:
        await bus.publish(subject, data, msg_id, timeout=5.0)

    async def publish_logs(messages: Sequence[Outgoing]) -> None:
        await bus.publish_many(messages, timeout=5.0)

    shipper = (LogShipper(publish_log, namespace, publish_many=publish_logs) if options.runtime != "sim-timer"
               else None)
    # One stepd fork server for the process's agents (their stepds start from the same environment).
    # Gloo's sockets on the interface of the advertised address (see `interfaces`).
    base_env, gloo = with_gloo_interface(environment.mapping(), options.advertise_address)
    if gloo is not None:
        log.info("node agents: ranks' gloo sockets on %s, the interface of %s (GLOO_SOCKET_IFNAME)",
                 gloo, options.advertise_address)
    launcher = ForkServer(options.python, base_env) if options.runtime != "sim-timer" else None
    agents = [NodeAgent(inv, options, publisher, shipper, launcher) for inv in inventories]
    host = AgentHost(bus, agents, publisher, options.work_subjects)
    if shipper is not None:  # each rank's output goes to a subject naming its job's owner
        shipper.owner_of = host.submitters.get
    if options.runtime != "sim-timer":
        if switches_users(options.run_as):
            log.info("node agents: each job runs as its submitter's OS user (--run-as submitter)")
        elif options.run_as is RunAs.SUBMITTER:
            log.warning("node agents: not root, so every job runs as this agent's OS user (uid %d), whoever "
                        "submitted it; run the agent as root to run jobs as their submitters", os.geteuid())
        elif os.geteuid() == 0:
            log.warning("node agents: every job runs as root (--run-as agent); use --run-as submitter on a "
                        "node shared by several users")
    consumer = None
    watcher: NvmlWatcher | None = None
    beats: asyncio.Task[None] | None = None
    measures: asyncio.Task[None] | None = None
    health = start_beat(lambda: bool(bus.nc.is_connected))
    telemetry = AgentTelemetry(host.agents, lambda: host.handled_position, lambda: bool(bus.nc.is_connected))
    await telemetry.start()  # /metrics, /healthz, /readyz (CORRAL_METRICS_ADDR)
    try:
        publisher.start()
        if launcher is not None:  # warm while the agents adopt and register: the first job does not wait for it
            await launcher.start()
        durable = durable_name(names)
        consumer = await bus.consume(durable, host.subjects(), host.on_event,
                                     deliver_new_only=True, batch=64, max_deliver=EVENTS_MAX_DELIVER,
                                     inactive_threshold=IDLE_EXPIRY)
        telemetry.phase(Phase.REBUILDING)
        try:
            info = await bus.js.consumer_info(bus.names.stream(EVENTS), durable)
            read = await host.load_history(durable, acked_through=int(info.ack_floor.stream_seq or 0))
            log.info("node agents %s: consumer %s; %d job spec(s) known from %d past event(s)",
                     ", ".join(names), durable, len(host.specs), read)
        except Exception:
            log.exception("node agents: could not read past job specs; continuing with new ones only")
        try:
            # Before any event is handled and before the nodes register: placement must not place
            # on GPUs that workers it released still hold.
            kept = await asyncio.gather(*(agent.adopt(host.ledger, host.reservations_known_since, host.unacked)
                                          for agent in agents))
            for agent, jobs in zip(agents, kept, strict=True):
                for job in jobs:
                    host.started_on(job, (agent.node,))
        finally:
            host.adoption_done()
            host.ready.set()
        for agent in agents:
            publisher.send(agent.registration())
        if options.gpu_health:
            watcher = watch_gpus(host, agents[0], options.gpu_health_seconds)
        beats = asyncio.create_task(_heartbeats(bus, subjects, host, options.heartbeat_seconds),
                                    name="node-agent-heartbeats")
        measures = asyncio.create_task(_conditions(host, options.conditions_seconds), name="node-agent-conditions")
        telemetry.consuming([consumer])
        if on_ready is not None:
            on_ready(host)
        await stop.wait()
    finally:
        if watcher is not None:
            await asyncio.to_thread(watcher.stop)
        await telemetry.stop()
        host.ready.set()
        if consumer is not None:
            await consumer.stop()
        await asyncio.gather(*(agent.close() for agent in agents), return_exceptions=True)
        if launcher is not None:
            await launcher.close()
        if shipper is not None:
            await shipper.close(grace=2.0)
        if health is not None:
            health.cancel()
        for task in (beats, measures):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await publisher.flush(timeout=5.0)
        await publisher.stop()
        await bus.close()
