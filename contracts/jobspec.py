"""JobSpec: the one job-spec schema for `corral submit`, simulator workloads and JobSubmitted.

Why one schema: a spec that validates for `corral validate` must be exactly what admission
accepts from a pipeline on the wire and what the simulator replays, so what we measure is what
runs. Field names are the scheduling model's (issue "Scheduling core").
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import msgspec

from corral.contracts.problems import Problem, SpecError
from corral.contracts.validation import convert_collecting, parse_document
from corral.contracts.worker import (
    CHECKPOINT_SIGNALS,
    MOUNT_TARGET_HINT,
    RESERVED_ENV,
    checkpoint_signal_problem,
    mount_target_problem,
)

__all__ = [
    "CONTAINER_RUNTIMES",
    "MAX_PRIORITY",
    "PRIORITY_CLASSES",
    "TOPOLOGY_LEVELS",
    "Checkpoint",
    "GpuRequest",
    "JobSpec",
    "Mount",
    "Priority",
    "RestartPolicy",
    "Topology",
    "load_job_spec",
    "parse_duration",
    "validate_job_spec",
]

MAX_REPLICAS = 65_536
MAX_GPUS_PER_REPLICA = 1024

PriorityClass = Literal["low", "normal", "high", "urgent"]
PRIORITY_CLASSES: dict[str, int] = {"low": 100, "normal": 500, "high": 900, "urgent": 1000}
#: Priorities are integers in 0..MAX_PRIORITY: unbounded ones let one user outrank everyone by
#: typing more digits (and a queue's `max_priority` caps them further).
MAX_PRIORITY = 10_000
Priority = Annotated[int, msgspec.Meta(ge=0, le=MAX_PRIORITY,
                                       description=f"0 (lowest) to {MAX_PRIORITY} (highest)")]
PRIORITY_HINT = (f"use an integer from 0 to {MAX_PRIORITY} or one of low (100), normal (500), high (900), "
                 "urgent (1000)")

ReplicaLevel = Literal["nvlink", "node"]
TopologyLevel = Literal["nvlink", "node", "rack", "zone"]
#: Tightest first; the core compares levels by this order.
TOPOLOGY_LEVELS: tuple[str, ...] = ("nvlink", "node", "rack", "zone")

Name = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
                                   description="1-63 letters, digits, '.', '_' or '-'")]
UserName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$",
                                       description="user name or e-mail address")]
QueuePath = Annotated[str, msgspec.Meta(
    pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*(/[A-Za-z0-9][A-Za-z0-9_-]*)*$",
    description="queue path in the queue tree, e.g. research/nlp")]
Seconds = Annotated[float, msgspec.Meta(ge=0, description="seconds")]
EnvName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Signal = Annotated[str, msgspec.Meta(pattern=r"^SIG[A-Z0-9]+$", description="signal name, e.g. SIGUSR1")]
#: A checkpoint signal: any signal name decodes (a recorded spec always does); the schema lists the
#: ones a new submission may name (`JobSpec.start_problems` refuses the others).
RecordedSignal = Annotated[str, msgspec.Meta(pattern=r"^SIG[A-Z0-9]+$", description="signal name, e.g. SIGUSR1",
                                             extra_json_schema={"enum": sorted(CHECKPOINT_SIGNALS)})]
AbsolutePath = Annotated[str, msgspec.Meta(pattern=r"^/[^\x00]*$", max_length=4096,
                                           description="an absolute path, e.g. /data/imagenet")]
MountSource = Annotated[str, msgspec.Meta(
    pattern=r"^(/[^\x00]*|[A-Za-z0-9][A-Za-z0-9._-]{0,62})$", max_length=4096,
    description="an absolute host path, or the name of a dataset of the cluster file")]
Image = Annotated[str, msgspec.Meta(min_length=1, max_length=1024, pattern=r"^[^\s]+$",
                                    description="a container image: registry/name:tag, a local name, "
                                                "or an Apptainer .sif path")]
Duration = Annotated[str, msgspec.Meta(
    pattern=r"^\s*(\d+(\.\d+)?\s*[smhd]\s*)+$|^(\d+-)?\d{1,2}:\d{2}(:\d{2})?$",
    description="a duration: 90s, 30m, 2h, 1d, 1h30m, or Slurm's [D-]HH:MM[:SS]")]

Runtime = Literal["process", "sim", "sandbox", "podman", "docker", "apptainer"]
#: Runtimes that run the job inside a container image (`image` is required).
CONTAINER_RUNTIMES: frozenset[str] = frozenset({"podman", "docker", "apptainer"})
#: Runtimes that can bind `mounts` (the plain process runtime sees the host as it is).
MOUNTING_RUNTIMES: frozenset[str] = CONTAINER_RUNTIMES | {"sandbox"}
#: Characters a mount path may not hold, per runtime: `--volume SRC:DST:ro` (podman, docker) and
#: `--bind SRC:DST,...` (apptainer) split on them, so such a mount could never be started.
MOUNT_SEPARATORS: dict[str, str] = {"podman": ":", "docker": ":", "apptainer": ":,"}

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_UNIT_TERM = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")


def parse_duration(value: float | int | str) -> float:
    """Seconds of a duration: a number of seconds, `90s`/`30m`/`2h`/`1d`/`1h30m`, or `[D-]HH:MM[:SS]`."""
    if isinstance(value, (int, float)):
        return float(value)
    text = value.strip()
    if ":" in text:
        days, _, clock = text.rpartition("-")
        parts = [int(p) for p in clock.split(":")]
        hours, minutes, seconds = ([*parts, 0])[:3]
        return float(int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds)
    return sum(float(n) * _UNITS[u] for n, u in _UNIT_TERM.findall(text))


class GpuRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which GPUs qualify: a model name (exact, e.g. H100) and/or a minimum memory per GPU."""

    model: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    min_memory_gib: Annotated[float, msgspec.Meta(gt=0)] | None = None

    FIELD_HINTS: ClassVar[dict[str, str]] = {
        "model": "a GPU model name such as H100 or A100",
        "min_memory_gib": "memory per GPU in GiB, e.g. 80",
    }


class Topology(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Hard limits (`replica`, `gang`) and a soft wish (`prefer`) on where the GPUs may be."""

    replica: ReplicaLevel = "node"
    gang: TopologyLevel | None = None
    prefer: TopologyLevel | None = None

    FIELD_HINTS: ClassVar[dict[str, str]] = {
        "replica": "use one of nvlink, node",
        "gang": "use one of nvlink, node, rack, zone",
        "prefer": "use one of nvlink, node, rack, zone",
    }


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How a preempted job is told to save its work (like Slurm's `--signal`), and how long it gets."""

    signal: RecordedSignal = "SIGUSR1"
    grace_seconds: Seconds = 30.0
    #: Where the job's checkpoints go (`CORRAL_CHECKPOINT_DIR`, exactly this folder); None: the
    #: cluster's shared checkpoint folder (cluster file `checkpoint_dir`) or the agent's, `/<job id>`.
    dir: AbsolutePath | None = None

    FIELD_HINTS: ClassVar[dict[str, str]] = {
        "signal": "a signal the job catches to checkpoint, one of " + ", ".join(CHECKPOINT_SIGNALS)
                  + " (SIGKILL and SIGSTOP cannot be caught)",
        "grace_seconds": "seconds the job may take to checkpoint, e.g. 30",
        "dir": "an absolute folder every node of the job can reach (shared storage), e.g. /shared/ckpt/run1",
    }


class Mount(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A host folder or a named dataset, seen by the job at `target` (read-only unless said).

    `source` is an absolute host path, or the name of a dataset of the cluster file (which maps it
    to a path on each node that has it, or on a shared filesystem)."""

    source: MountSource
    target: AbsolutePath
    read_only: bool = True

    FIELD_HINTS: ClassVar[dict[str, str]] = {
        "source": "an absolute host path such as /data/imagenet, or a dataset name of the cluster file",
        "target": "the absolute path the job sees, e.g. /data",
        "read_only": "true (the default) or false to let the job write there",
    }

    @property
    def dataset(self) -> str | None:
        """The dataset name, or None when `source` is a host path."""
        return None if self.source.startswith("/") else self.source


class RestartPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    max_restarts: Annotated[int, msgspec.Meta(ge=0)] = 0

    FIELD_HINTS: ClassVar[dict[str, str]] = {"max_restarts": "a whole number >= 0"}


class JobSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a user asks for. GPUs are whole: `replicas` x `gpus_per_replica` integers.

    `priority` accepts an integer from 0 to 10000 or a class name (low=100, normal=500,
    high=900, urgent=1000) and is always an int after construction or decoding.
    """

    name: Name
    queue: QueuePath
    user: UserName | None = None
    if TYPE_CHECKING:  # after __post_init__ the value is always an int
        priority: int = 500
    else:
        priority: Priority | PriorityClass = 500
    replicas: Annotated[int, msgspec.Meta(ge=1, le=MAX_REPLICAS, description="gang size")] = 1
    gpus_per_replica: Annotated[int, msgspec.Meta(ge=1, le=MAX_GPUS_PER_REPLICA,
                                                  description="whole GPUs per replica")] = 1
    gpu: GpuRequest | None = None
    topology: Topology = msgspec.field(default_factory=Topology)
    preemptible: bool = True
    checkpoint: Checkpoint = msgspec.field(default_factory=Checkpoint)
    min_runtime_seconds: Seconds = 0.0
    estimated_runtime_seconds: Annotated[float, msgspec.Meta(gt=0)] | None = None
    restart: RestartPolicy = msgspec.field(default_factory=RestartPolicy)
    command: Annotated[list[str], msgspec.Meta(min_length=1)] | None = None
    env: dict[EnvName, str] = msgspec.field(default_factory=dict)
    runtime: Runtime = "process"
    image: Image | None = None
    mounts: list[Mount] = msgspec.field(default_factory=list)
    workdir: AbsolutePath | None = None
    if TYPE_CHECKING:  # after __post_init__ the value is always seconds (a float) or None
        time_limit: float | None = None
    else:
        time_limit: Annotated[float, msgspec.Meta(gt=0)] | Duration | None = None
    cpus_per_replica: Annotated[float, msgspec.Meta(gt=0, le=4096)] | None = None
    memory_gib_per_replica: Annotated[float, msgspec.Meta(gt=0, le=65536)] | None = None
    duration_seconds: Seconds | None = None
    submission_id: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | None = None

    FIELD_HINTS: ClassVar[dict[str, str]] = {
        "name": "1-63 letters, digits, '.', '_' or '-', starting with a letter or digit",
        "queue": "a queue path such as research/nlp (see `corral apply queues.yaml`)",
        "user": "a user name of letters, digits, '.', '_', '@', '+' or '-'",
        "priority": PRIORITY_HINT,
        "replicas": f"the gang size: a whole number from 1 to {MAX_REPLICAS}",
        "gpus_per_replica": f"GPUs are whole: use an integer from 1 to {MAX_GPUS_PER_REPLICA} "
                            "(Corral does not share a GPU)",
        "topology": "a mapping with replica, gang and/or prefer",
        "preemptible": "true or false",
        "min_runtime_seconds": "seconds after start during which the job is never preempted",
        "estimated_runtime_seconds": "a positive number of seconds (used for backfill)",
        "command": "a list of strings, e.g. [python, train.py]",
        "env": "a mapping of VARIABLE: \"value\"; quote values so they stay strings",
        "runtime": "use one of process, sandbox, podman, docker, apptainer, sim",
        "image": "a container image such as docker.io/pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime",
        "mounts": "a list of {source, target, read_only}",
        "workdir": "the absolute folder the job starts in (`corral submit` fills in yours when left out)",
        "time_limit": "a duration such as 3600, 90s, 30m, 2h, 1h30m or 1-00:00:00",
        "cpus_per_replica": "CPU cores per replica, e.g. 8",
        "memory_gib_per_replica": "host memory per replica in GiB, e.g. 64",
        "duration_seconds": "seconds the sim runtime sleeps, e.g. 3600",
        "submission_id": "a client-chosen id (<= 200 characters) used to drop duplicate submissions: "
                         "your own; another user's equal id is another job",
    }

    def __post_init__(self) -> None:
        if isinstance(self.priority, str):
            msgspec.structs.force_setattr(self, "priority", PRIORITY_CLASSES[self.priority])
        if isinstance(self.time_limit, str):
            msgspec.structs.force_setattr(self, "time_limit", parse_duration(self.time_limit))
        problems = self.sense_problems()
        if problems:
            raise SpecError(problems)

    def sense_problems(self) -> list[Problem]:
        """Cross-field rules that a schema cannot say."""
        found: list[Problem] = []
        if self.runtime in ("process", "sandbox") and self.command is None:
            found.append(Problem(path="command", message=f"required when runtime is `{self.runtime}`",
                                 hint="add command: [python, train.py], or set runtime: sim"))
        if self.runtime in CONTAINER_RUNTIMES and self.image is None:
            found.append(Problem(path="image", message=f"required when runtime is `{self.runtime}`",
                                 hint="add image: docker.io/pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime "
                                      "(a .sif file for apptainer)"))
        if self.image is not None and self.runtime not in CONTAINER_RUNTIMES:
            found.append(Problem(path="image", message=f"runtime `{self.runtime}` runs no image",
                                 hint="set runtime: podman, docker or apptainer, or remove image"))
        if self.mounts and self.runtime not in MOUNTING_RUNTIMES:
            found.append(Problem(path="mounts", message=f"runtime `{self.runtime}` cannot mount folders",
                                 hint="set runtime: sandbox (or podman, docker, apptainer), or remove mounts"))
        found.extend(self._mount_problems())
        if self.time_limit is not None and self.time_limit <= 0:
            found.append(Problem(path="time_limit", message="must be longer than 0 seconds",
                                 hint="e.g. time_limit: 2h"))
        if self.runtime == "sim" and self.duration_seconds is None:
            found.append(Problem(path="duration_seconds", message="required when runtime is `sim`",
                                 hint="add duration_seconds: 3600 (how long the simulated job runs)"))
        return found

    def _mount_problems(self) -> list[Problem]:
        found: list[Problem] = []
        seen: dict[str, int] = {}
        for i, mount in enumerate(self.mounts):
            target = mount.target.rstrip("/") or "/"
            if target == "/" or ".." in target.split("/"):
                found.append(Problem(path=f"mounts[{i}].target", message=f"cannot mount at `{mount.target}`",
                                     hint="use a folder below /, without `..`, e.g. /data"))
            elif target in seen:
                found.append(Problem(path=f"mounts[{i}].target", message=f"`{target}` is also mounts[{seen[target]}]",
                                     hint="give each mount its own target"))
            seen.setdefault(target, i)
        return found

    def start_problems(self) -> list[Problem]:
        """What the node agent would refuse to start (the agent checks the same sets, from
        `corral.contracts.worker`): an env name it sets itself, a signal the job cannot be told to
        checkpoint with, a NUL character no process can be given, a mount path a container runtime
        splits, a mount target that would hide a system folder, an empty program name.

        Asked of a new submission (`validate_job_spec`, admission's verdict), never on decode: a
        spec the log recorded before a rule existed must still decode, fold and replay."""
        command = self.command
        found: list[Problem] = []
        signal_problem = checkpoint_signal_problem(self.checkpoint.signal)
        if signal_problem is not None:
            found.append(Problem(path="checkpoint.signal", message=signal_problem,
                                 hint=Checkpoint.FIELD_HINTS["signal"]))
        if command and not command[0].strip() and self.runtime != "sim":
            found.append(Problem(path="command[0]", message="the program to run is empty",
                                 hint="name the program first, e.g. command: [python, train.py]"))
        for name in sorted(RESERVED_ENV & self.env.keys()):
            found.append(Problem(path=f"env.{name}", message=f"`{name}` is set by Corral for every rank",
                                 hint=f"remove {name} from env: Corral sets it to the GPUs, rank or "
                                      "checkpoint folder it gives each rank (the README lists them)"))
        for name, value in sorted(self.env.items()):
            if "\x00" in value:
                found.append(Problem(path=f"env.{name}", message="the value holds a NUL character",
                                     hint="a process environment cannot hold NUL (\\0); remove it"))
        for i, arg in enumerate(self.command or ()):
            if "\x00" in arg:
                found.append(Problem(path=f"command[{i}]", message="the argument holds a NUL character",
                                     hint="a program's arguments cannot hold NUL (\\0); remove it"))
        bad = MOUNT_SEPARATORS.get(self.runtime, "")
        for i, mount in enumerate(self.mounts):
            hides = mount_target_problem(mount.target)
            if hides is not None:
                found.append(Problem(path=f"mounts[{i}].target", message=hides, hint=MOUNT_TARGET_HINT))
            for part in ("source", "target"):
                path = getattr(mount, part)
                if any(c in path for c in bad):
                    shown = " or ".join(f"`{c}`" for c in bad)
                    found.append(Problem(path=f"mounts[{i}].{part}", message=f"runtime `{self.runtime}` cannot mount "
                                         f"a path with {shown} in it", hint="rename or link the folder to a path "
                                         f"without {shown}, or use runtime: sandbox"))
        return found

    @property
    def total_gpus(self) -> int:
        return self.replicas * self.gpus_per_replica


def validate_job_spec(obj: Any) -> JobSpec:
    """A JobSpec for a new submission from parsed YAML/JSON, or SpecError listing every problem with
    path and hint (the contract's, then what the node agent would refuse: `JobSpec.start_problems`)."""
    if not isinstance(obj, dict):
        raise SpecError([Problem(path="", message=f"a job spec is a mapping, got {type(obj).__name__}",
                                 hint="start the file with `name: ...` and `queue: ...`")])
    spec = convert_collecting(obj, JobSpec)
    problems = spec.start_problems()
    if problems:
        raise SpecError(problems)
    return spec


def load_job_spec(text: str, fmt: Literal["yaml", "json"] | None = None) -> JobSpec:
    """Parse and validate a job spec file's text; `fmt=None` sniffs JSON vs YAML."""
    return validate_job_spec(parse_document(text, fmt))
