"""How a rank's process is started: one `WorkerRuntime` per spec `runtime`, all from one Assignment.

Why: a plain process in the agent's environment, folder and user has no image, no data mounts
and every GPU of the node in reach. Teams package jobs as container
images (pyxis/enroot, Apptainer, Kubernetes) and mount datasets; a shared node must keep one job
away from another's files and GPUs.

So the stepd asks the job's runtime for a `Launch` (the argv, the environment, the folder) and
starts that. Whatever the runtime, the rank gets the same worker
environment (`assignment.build_rank_env`: torchrun's variables and `CORRAL_*`), its checkpoint
folder and control file at the same paths, the checkpoint signal and the exit-code protocol (0,
85 = checkpointed):

- `process`: the command itself, in the spec's `workdir` (the submitter's uid when the agent runs
  as root, see `run_as`). No isolation.
- `sandbox`: bubblewrap. The host's root folders bound read-only on a fresh root (read-only too),
  each mount bound at its target (read-only unless `read_only: false`; a target below a read-only
  host folder gets a read-only tmpfs over that folder with its host entries bound back,
  `sandbox_layout`), the checkpoint folder and
  control file writable, a private /tmp, /proc and /dev, a PID namespace, and only the allocated
  GPUs' device nodes (`/dev/nvidia<N>`, plus the driver's control nodes). Inside, the GPUs are
  numbered from 0 (`CUDA_VISIBLE_DEVICES=0..n-1`, as Slurm does with ConstrainDevices and as
  containers do); `NVIDIA_VISIBLE_DEVICES` keeps the host indices.
  bwrap's own monitor process dies of any signal but SIGKILL, taking the job with it, so soft
  signals (checkpoint, SIGTERM) go to every process of the rank's group *except* bwrap
  (`Launch.spare_leader`); bwrap passes the job's exit code through.
- `podman` (CDI: `--device nvidia.com/gpu=N`), `docker` (`--gpus "device=N,M"`): `run --rm` of the
  spec's `image` with the host network and IPC namespace (rendezvous, NCCL shared memory), the
  same binds, `--workdir`, `--cpus`/`--memory` from the spec, the submitter's uid:gid, and the
  environment passed by name (`-e NAME`: values stay out of `ps`). The client forwards signals to
  the container (`--sig-proxy`, the default) and exits with its code; a SIGKILL of the client
  would leave the container running, so `Launch.kill_argv` removes it by name.
- `apptainer`: `exec --nv --cleanenv` with `--bind` and `--pwd`; the environment goes through
  `APPTAINERENV_<NAME>`. Apptainer shows every GPU of the node (`--nv`), so `CUDA_VISIBLE_DEVICES`
  keeps the host indices, as for `process`.

Pure functions of their inputs (the one look at the disk, which device nodes and root folders
exist, is a parameter), so the command lines are unit-tested exactly. Stdlib only: the stepd
imports this.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from corral.contracts.worker import RESERVED_ENV

from ..host.interfaces import GLOO_IFNAME
from .assignment import Assignment, RankAssignment
from .sandbox_layout import Host, Layer, bind_args

__all__ = [
    "CONTAINER_RUNTIMES",
    "GPU_DEVICES_ENV",
    "RUNTIMES",
    "USER_FLAG_RUNTIMES",
    "ApptainerRuntime",
    "DockerRuntime",
    "Host",
    "Launch",
    "PodmanRuntime",
    "ProcessRuntime",
    "SandboxRuntime",
    "WorkerRuntime",
    "runtime_for",
]

CONTAINER_RUNTIMES = ("podman", "docker", "apptainer")
#: Container clients that run as the agent and start the container as the submitter (`--user`).
#: apptainer is not one: it runs the container as whoever runs it, so under run-as it is started
#: as the submitter like a process (it was started as the agent, root: a submitter's
#: `runtime: apptainer` ran as root on the node).
USER_FLAG_RUNTIMES = ("podman", "docker")
#: The driver's device nodes every GPU job needs besides its own `nvidia<N>`.
NVIDIA_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
GPU_DEVICES_ENV = "CORRAL_GPU_DEVICES"
"""The agent's setting (an environment variable its stepds inherit): the folder holding the node's
GPU device files (`nvidia<N>`, `nvidiactl`, ...), given to sandboxes and, as `--device`, to
podman and docker containers in place of the NVIDIA Container Toolkit (CDI, `--gpus`): for
images that carry their own driver libraries, and for tests with fake device files. Unset: /dev
for the sandbox, the toolkit for containers."""
#: Root folders the sandbox makes its own (private) instead of binding the host's.
SANDBOX_PRIVATE = frozenset({"/proc", "/dev", "/tmp"})


@dataclass(frozen=True)
class Launch:
    """What the stepd starts for one rank. `spare_leader`: soft signals skip the group leader (the
    runtime's own monitor process); `kill_argv`: run after a SIGKILL, to remove what the leader's
    death leaves behind (a container); `exists_argv`: exits 0 while that is still there (the rank
    is not over, and its GPUs not free, until it is gone)."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None = None
    spare_leader: bool = False
    kill_argv: list[str] | None = None
    exists_argv: list[str] | None = None
    needs: tuple[Path, ...] = field(default=())  # host paths that must exist before the start


class WorkerRuntime(Protocol):
    """Turns one rank of an Assignment, with its complete worker environment, into a Launch."""

    @property
    def name(self) -> str: ...

    def launch(self, a: Assignment, rank: RankAssignment, env: Mapping[str, str], control: Path) -> Launch: ...


def _gpu_env(env: Mapping[str, str], rank: RankAssignment) -> dict[str, str]:
    """Inside an isolated runtime the rank's GPUs are 0..n-1; the host's indices stay visible."""
    return {**env, "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(rank.gpus)))}


def _binds(a: Assignment, control: Path) -> list[tuple[str, str, bool]]:
    """(host, target, read_only) of every mount, then the checkpoint folder and control file."""
    binds = [(m.host, m.target, m.read_only) for m in a.mounts]
    binds.append((str(a.checkpoint_dir), str(a.checkpoint_dir), False))
    binds.append((str(control), str(control), False))
    return binds


def _command(a: Assignment) -> list[str]:
    return list(a.command)


@dataclass(frozen=True)
class ProcessRuntime:
    name: str = "process"

    def launch(self, a: Assignment, rank: RankAssignment, env: Mapping[str, str], control: Path) -> Launch:
        return Launch(argv=_command(a), env=dict(env), cwd=str(a.workdir) if a.workdir else None)


@dataclass(frozen=True)
class SandboxRuntime:
    bwrap: str = "bwrap"
    host: Host = field(default_factory=Host)
    name: str = "sandbox"
    devices: str = "/dev"  # where the node's GPU device files are

    def launch(self, a: Assignment, rank: RankAssignment, env: Mapping[str, str], control: Path) -> Launch:
        base: list[Layer] = []
        for entry in self.host.root_entries():
            if entry in SANDBOX_PRIVATE:
                continue
            target = self.host.readlink(entry)
            base.append(Layer(entry, ("--symlink", target, entry)) if target is not None
                        else Layer(entry, ("--ro-bind", entry, entry), "bind", entry))
        base += [Layer("/dev", ("--dev", "/dev"), "tmpfs"), Layer("/proc", ("--proc", "/proc")),
                 Layer("/tmp", ("--tmpfs", "/tmp"), "tmpfs")]
        for node in _gpu_nodes(rank):
            if self.host.exists(f"{self.devices}/{node}"):
                base.append(Layer(f"/dev/{node}", ("--dev-bind", f"{self.devices}/{node}", f"/dev/{node}")))
        argv = [self.bwrap, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                *bind_args(base, _binds(a, control), self.host), "--remount-ro", "/"]
        if a.workdir is not None:
            argv += ["--chdir", str(a.workdir)]
        argv += ["--", *_command(a)]
        return Launch(argv=argv, env=_gpu_env(env, rank), spare_leader=True,
                      needs=tuple(Path(m.host) for m in a.mounts))


def _gpu_nodes(rank: RankAssignment) -> list[str]:
    """The device file names a rank's GPUs need: its own `nvidia<N>`, then the driver's."""
    return [*(f"nvidia{g}" for g in rank.gpus), *NVIDIA_CONTROL_NODES]


def _container_name(a: Assignment, rank: RankAssignment) -> str:
    return f"corral-{a.job_id}-{a.attempt}-{rank.rank}".lower()


@dataclass(frozen=True)
class _OciRuntime:
    """podman and docker take the same `run` options but for how GPUs are asked for."""

    program: str
    name: str
    devices: str | None = None  # GPUs as these device files (`--device`), not through the toolkit
    exists: Callable[[str], bool] = os.path.exists

    def gpu_args(self, gpus: tuple[int, ...]) -> list[str]:
        raise NotImplementedError

    def device_args(self, rank: RankAssignment) -> list[str]:
        if self.devices is None:
            return self.gpu_args(rank.gpus)
        nodes = [*(f"nvidia{g}" for g in rank.gpus),  # the driver's nodes where the node has them
                 *(n for n in NVIDIA_CONTROL_NODES if self.exists(f"{self.devices}/{n}"))]
        return [arg for n in nodes for arg in ("--device", f"{self.devices}/{n}:/dev/{n}")]

    def launch(self, a: Assignment, rank: RankAssignment, env: Mapping[str, str], control: Path) -> Launch:
        if a.image is None:
            raise ValueError(f"job {a.job_id}: runtime {self.name} needs an image; add image: to the spec")
        name = _container_name(a, rank)
        argv = [self.program, "run", "--rm", "--name", name, "--network", "host", "--ipc", "host", "--init",
                # an image's setuid binary or file capabilities must not make its user root (under a
                # rootful engine, root on every bind-mounted host path)
                "--security-opt", "no-new-privileges", "--cap-drop", "ALL"]
        argv += self.device_args(rank) if rank.gpus else []
        for host, target, read_only in _binds(a, control):
            argv += ["--volume", f"{host}:{target}" + (":ro" if read_only else "")]
        if a.workdir is not None:
            argv += ["--workdir", str(a.workdir)]
        if a.cpus is not None:
            argv += ["--cpus", f"{a.cpus:g}"]
        if a.memory_gib is not None:
            argv += ["--memory", f"{int(a.memory_gib * 1024)}m"]
        if a.user is not None:
            argv += ["--user", f"{a.user.uid}:{a.user.gid}"]
        inner = _container_env(a, env, rank)
        for key in sorted(inner):
            argv += ["--env", key]
        argv += [a.image, *_command(a)] if a.command else [a.image]
        return Launch(argv=argv, env={**_client_env(env), **inner}, kill_argv=[self.program, "rm", "--force", name],
                      exists_argv=[self.program, "container", "inspect", "--format", "{{.Id}}", name],
                      needs=tuple(Path(m.host) for m in a.mounts))


#: The agent's own variables a container keeps: output as it happens, and the interface of the
#: node's advertised address for gloo (`interfaces`: the container is on the host's network).
AGENT_DEFAULTS = frozenset({"PYTHONUNBUFFERED", GLOO_IFNAME})


def _container_env(a: Assignment, env: Mapping[str, str], rank: RankAssignment) -> dict[str, str]:
    """What the job sees in a container: the worker variables and the job's env, never the agent's
    (the image has its own PATH, HOME, ...)."""
    keep = RESERVED_ENV | set(a.env) | AGENT_DEFAULTS
    return {k: v for k, v in _gpu_env(env, rank).items() if k in keep}


def _client_env(env: Mapping[str, str]) -> dict[str, str]:
    """What the container client itself needs from the agent's environment."""
    return {k: v for k, v in env.items() if k in ("PATH", "HOME", "USER", "LOGNAME", "XDG_RUNTIME_DIR",
                                                    "CONTAINER_HOST", "DOCKER_HOST", "DOCKER_CONFIG",
                                                    "CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF",
                                                    "CONTAINERS_REGISTRIES_CONF")}


@dataclass(frozen=True)
class PodmanRuntime(_OciRuntime):
    program: str = "podman"
    name: str = "podman"
    devices: str | None = None

    def gpu_args(self, gpus: tuple[int, ...]) -> list[str]:
        return [arg for g in gpus for arg in ("--device", f"nvidia.com/gpu={g}")]


@dataclass(frozen=True)
class DockerRuntime(_OciRuntime):
    program: str = "docker"
    name: str = "docker"
    devices: str | None = None

    def gpu_args(self, gpus: tuple[int, ...]) -> list[str]:
        return ["--gpus", '"device=' + ",".join(str(g) for g in gpus) + '"']


@dataclass(frozen=True)
class ApptainerRuntime:
    program: str = "apptainer"
    name: str = "apptainer"

    def launch(self, a: Assignment, rank: RankAssignment, env: Mapping[str, str], control: Path) -> Launch:
        if a.image is None:
            raise ValueError(f"job {a.job_id}: runtime apptainer needs an image; add image: to the spec")
        argv = [self.program, "exec", "--nv", "--cleanenv"]
        for host, target, read_only in _binds(a, control):
            argv += ["--bind", f"{host}:{target}" + (":ro" if read_only else "")]
        if a.workdir is not None:
            argv += ["--pwd", str(a.workdir)]
        argv += [a.image, *_command(a)] if a.command else [a.image]
        keep = RESERVED_ENV | set(a.env) | AGENT_DEFAULTS
        inner = {f"APPTAINERENV_{k}": v for k, v in env.items() if k in keep}
        return Launch(argv=argv, env={**_client_env(env), **inner}, needs=tuple(Path(m.host) for m in a.mounts))


RUNTIMES: dict[str, Callable[[str | None], WorkerRuntime]] = {
    "process": lambda devices: ProcessRuntime(),
    "sandbox": lambda devices: SandboxRuntime(devices=devices or "/dev"),
    "podman": lambda devices: PodmanRuntime(devices=devices),
    "docker": lambda devices: DockerRuntime(devices=devices),
    "apptainer": lambda devices: ApptainerRuntime(),
}


def runtime_for(name: str, gpu_devices: str | None = None) -> WorkerRuntime:
    """The runtime of an Assignment's `runtime` (ValueError naming the known ones); `gpu_devices`:
    the node's GPU device folder (`GPU_DEVICES_ENV`), None for the default."""
    try:
        factory = RUNTIMES[name]
    except KeyError:
        raise ValueError(f"unknown worker runtime {name!r}: use one of {', '.join(RUNTIMES)}") from None
    return factory(gpu_devices)
