"""The folded view as bytes, and the name of the code that folded it.

Why: a stored view is only as good as the fold that made it. Change a handler of
`corral.projection`, the lifecycle's table or an event's contract, and a view stored by the old
code says something the new code would never have folded; decode it with the new types and it
may not even parse. So every stored view is keyed by `SCHEMA`, a hash of the source of every
module its content depends on (the projection, the lifecycle, the contracts, this codec): a
process reads only views stored by the same code, and new code simply starts a new one (until
the projector has written it, the CLI folds the log from the start).

What is encoded (msgpack, typed by msgspec, so a decode validates): the cluster without its jobs
(`BaseView`: every node, queue and held rendezvous port, the queue tree's versions, the position
folded, and which jobs over still hold GPUs or quota) in one small blob, and each job (`JobView`),
active or over, in a row of its own with the columns a listing filters and sorts on (`job_columns`):
a question about one job or one page of jobs reads those rows only, never the whole backlog. Stream
versions and submission ids are not kept: a reader folds the log from the stored position in log
order, where neither is needed. `HotView` (the base with every active job) is what the local
gateway sends a person for a view.
"""

from __future__ import annotations

import copy
import hashlib
import os
from datetime import datetime
from importlib.util import find_spec
from typing import Any

import msgspec

from corral.contracts import events as ev
from corral.contracts.envelope import Event
from corral.contracts.queues import QueueSpec
from corral.projection import ClusterView, JobView, NodeView

#: The modules whose code decides what a stored view holds (the contracts package is added whole).
_SOURCES = ("corral.projection", "corral.lifecycle", "corral.readmodel.codec")


def _schema() -> str:
    digest = hashlib.sha256()
    files = [find_spec(name).origin for name in _SOURCES]  # type: ignore[union-attr]
    contracts = os.path.dirname(ev.__file__)
    files += sorted(os.path.join(folder, name) for folder, _, names in os.walk(contracts)
                    for name in names if name.endswith((".py", ".so", ".json")))
    for path in files:  # (strings, not Paths: this runs at every CLI call's import)
        with open(path, "rb") as f:  # type: ignore[arg-type]
            digest.update(os.path.basename(path).encode() + b"\0" + f.read() + b"\0")  # type: ignore[arg-type]
    return digest.hexdigest()[:32]


#: The projection schema of this code: stored views of any other schema are never read.
SCHEMA = _schema()


class BaseView(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The stored view without its jobs (each job is a row: `encode_job`). `held`: the jobs that are
    over but still hold GPUs or quota (active all the same; the other active jobs are those whose
    state is not terminal). `fenced`: the jobs with a released attempt whose GPUs are still held
    (`ClusterView.fenced_jobs`), all that a view of the nodes needs of the jobs (`read_nodes`)."""

    position: int
    last_event_at: datetime | None
    nodes: list[NodeView]
    queues: list[QueueSpec]
    ports: dict[str, dict[int, tuple[str, int]]]
    tree_versions: list[ev.QueueTreeApplied] = msgspec.field(default_factory=list)
    policy: str = "corral"
    held: list[str] = msgspec.field(default_factory=list)
    fenced: list[str] = msgspec.field(default_factory=list)


class HotView(BaseView, kw_only=True):
    """What a question about the cluster now needs: everything but the jobs that are over."""

    jobs: list[JobView] = msgspec.field(default_factory=list)


_ENCODER = msgspec.msgpack.Encoder()
_DECODERS: dict[type, msgspec.msgpack.Decoder[Any]] = {}


def _decoder(kind: type) -> msgspec.msgpack.Decoder[Any]:
    """`kind`'s decoder, built on first use: building JobView's resolves the annotations of every
    type it holds (~25 ms), which a command that decodes no job (`corral submit`) does not pay."""
    decoder = _DECODERS.get(kind)
    if decoder is None:
        decoder = _DECODERS[kind] = msgspec.msgpack.Decoder(kind)
    return decoder


def _without_caches(job: JobView) -> JobView:
    """Drop the per-object translations (`core_job` & co.): rebuilt on demand, never stored."""
    job._core_job = job._core_placement = job._core_pending = None
    for fence in job.fences.values():
        fence._core_placement = None
    return job


def _fields(view: ClusterView) -> dict[str, object]:
    for node in view.nodes.values():
        node._core_node = None
    return {"position": view.position, "last_event_at": view.last_event_at, "nodes": list(view.nodes.values()),
            "queues": list(view.queues.values()), "ports": view.ports, "tree_versions": view.tree_versions,
            "policy": view.policy, "held": sorted(j for j, job in view.active.items() if job.state.terminal),
            "fenced": sorted(j.job_id for j in view.fenced_jobs())}


def encode_base(view: ClusterView) -> bytes:
    """`view` without its jobs (see `BaseView`)."""
    return _ENCODER.encode(BaseView(**_fields(view)))  # type: ignore[arg-type]


def decode_base(data: bytes) -> tuple[ClusterView, BaseView]:
    """A `ClusterView` with no jobs, and the stored view it was made of (its `held` and `fenced`
    jobs); msgspec.ValidationError if it does not parse."""
    base: BaseView = _decoder(BaseView).decode(data)
    return (ClusterView(nodes={n.name: n for n in base.nodes}, queues={q.name: q for q in base.queues},
                        ports=base.ports, position=base.position, last_event_at=base.last_event_at,
                        tree_versions=base.tree_versions, policy=base.policy), base)


def encode_hot(view: ClusterView) -> bytes:
    """The active part of `view` in one blob (see `HotView`): what the gateway sends."""
    jobs = [_hidden(_without_caches(j)) for j in view.active.values()]
    return _ENCODER.encode(HotView(**_fields(view), jobs=jobs))  # type: ignore[arg-type]


def decode_hot(data: bytes) -> ClusterView:
    """A `ClusterView` holding what `encode_hot` stored; msgspec.ValidationError if it does not parse."""
    hot: HotView = _decoder(HotView).decode(data)
    jobs = {j.job_id: j for j in hot.jobs}
    return ClusterView(jobs=jobs, nodes={n.name: n for n in hot.nodes}, queues={q.name: q for q in hot.queues},
                       active=dict(jobs), ports=hot.ports, position=hot.position, last_event_at=hot.last_event_at,
                       tree_versions=hot.tree_versions, policy=hot.policy)


def job_columns(job: JobView) -> tuple[str, datetime | None, str | None, str | None]:
    """What a job's row is filtered and ordered on: (state, submitted_at, queue, user); a job
    whose submission is not folded has no queue (`JobView.queue` says "?")."""
    return job.state.value, job.submitted_at, job.spec.queue if job.spec is not None else None, job.user


#: What a stored view holds in place of each env value of a job's spec.
ENV_HIDDEN = "(hidden)"


def _hidden(job: JobView) -> JobView:
    """`job` with its spec's env values hidden (a copy when there are any)."""
    if job.spec is not None and job.spec.env and any(v != ENV_HIDDEN for v in job.spec.env.values()):
        hidden = msgspec.structs.replace(job.spec, env=dict.fromkeys(job.spec.env, ENV_HIDDEN))
        job = copy.copy(job)
        job.spec = hidden
    return job


def encode_job(job: JobView) -> bytes:
    """`job` as stored, its spec's env values hidden: people read the read model with their own
    logins, and a job's env values are its owner's, the admins' and its nodes' only (the names
    stay; `corral show` takes the owner's values from the job's JobSubmitted)."""
    return _ENCODER.encode(_hidden(_without_caches(job)))


def decode_job(data: bytes) -> JobView:
    job: JobView = _decoder(JobView).decode(data)
    return job


def touched_jobs(event: Event) -> tuple[str, ...]:
    """The jobs whose `JobView` folding `event` may change (`ClusterView.apply`'s handlers)."""
    return tuple(j for j in (getattr(event, "job_id", None), getattr(event, "victim_job_id", None))
                 if isinstance(j, str))
