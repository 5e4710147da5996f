"""Worker runtimes: one Assignment, the exact command line of each runtime, the same worker
environment; datasets resolved per node; the spec's workdir, checkpoint dir and limits carried."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.contracts.envelope import job_stream
from corral.contracts.events import GangReserved, RankPlacement
from corral.contracts.jobspec import Checkpoint, JobSpec, Mount
from corral.services.node_agent.process.assignment import Assignment, MountBind, RankAssignment, build_rank_env
from corral.services.node_agent.process.run_as import WorkerUser
from corral.services.node_agent.process.runtimes import (
    USER_FLAG_RUNTIMES,
    ApptainerRuntime,
    DockerRuntime,
    Host,
    PodmanRuntime,
    ProcessRuntime,
    SandboxRuntime,
    runtime_for,
)
from corral.services.node_agent.process.step_files import assignment_from_json, assignment_to_json
from corral.services.node_agent.reservation import build_assignment

CONTROL = Path("/var/lib/corral/run/j/attempt-0/rank-1.control")
RANK = RankAssignment(rank=1, local_rank=0, gpus=(4, 5))


def assignment(**extra: object) -> Assignment:
    base: dict[str, object] = dict(
        job_id="j", attempt=0, world_size=2, node_rank=0, master_addr="10.0.0.1", master_port=29500,
        ranks=(RANK,), command=("python", "train.py"), checkpoint_dir=Path("/shared/ckpt/j"),
        log_dir=Path("/var/log/corral"), env={"MY_FLAG": "1"}, workdir=Path("/work/run"),
        mounts=(MountBind("/nvme/imagenet", "/data"), MountBind("/scratch/j", "/out", read_only=False)),
        image="registry.local/train:1", cpus=8.0, memory_gib=64.0)
    base.update(extra)
    return Assignment(**base)


def env_of(a: Assignment) -> dict[str, str]:
    return build_rank_env(a, RANK, CONTROL, {"PATH": "/usr/bin", "HOME": "/root", "SECRET_X": "s"}, interpreter_bin="")


FAKE_HOST = Host(exists=lambda p: p in {"/dev/nvidia4", "/dev/nvidia5", "/dev/nvidia0", "/dev/nvidiactl"},
                 root_entries=lambda: ["/bin", "/dev", "/etc", "/proc", "/tmp", "/usr"],
                 readlink=lambda p: "usr/bin" if p == "/bin" else None)


def test_process_runs_the_command_in_the_workdir_with_the_worker_env() -> None:
    a = assignment(runtime="process", image=None, mounts=())
    launch = ProcessRuntime().launch(a, RANK, env_of(a), CONTROL)
    assert launch.argv == ["python", "train.py"] and launch.cwd == "/work/run"
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "4,5" and launch.env["RANK"] == "1"


def test_sandbox_command_line() -> None:
    a = assignment(runtime="sandbox", image=None)
    launch = SandboxRuntime(host=FAKE_HOST).launch(a, RANK, env_of(a), CONTROL)
    assert launch.argv == [
        "bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
        "--symlink", "usr/bin", "/bin", "--ro-bind", "/etc", "/etc", "--ro-bind", "/usr", "/usr",
        "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
        "--dev-bind", "/dev/nvidia4", "/dev/nvidia4", "--dev-bind", "/dev/nvidia5", "/dev/nvidia5",
        "--dev-bind", "/dev/nvidiactl", "/dev/nvidiactl",
        "--ro-bind", "/nvme/imagenet", "/data", "--bind", "/scratch/j", "/out",
        "--bind", "/shared/ckpt/j", "/shared/ckpt/j", "--bind", str(CONTROL), str(CONTROL),
        "--remount-ro", "/", "--chdir", "/work/run", "--", "python", "train.py"]
    assert "/dev/nvidia0" not in launch.argv  # another job's GPU
    assert launch.spare_leader and launch.needs == (Path("/nvme/imagenet"), Path("/scratch/j"))
    assert (launch.env["CUDA_VISIBLE_DEVICES"], launch.env["NVIDIA_VISIBLE_DEVICES"]) == ("0,1", "4,5")


def test_podman_command_line_uses_cdi_and_passes_env_by_name() -> None:
    alice = WorkerUser(name="alice", uid=1000, gid=1000, groups=(), home="/home/alice", shell="/bin/sh")
    a = assignment(runtime="podman", user=alice)
    launch = PodmanRuntime().launch(a, RANK, env_of(a), CONTROL)
    env_flags = [launch.argv[i + 1] for i, arg in enumerate(launch.argv) if arg == "--env"]
    head = launch.argv[:launch.argv.index("--env")]
    assert head == [
        "podman", "run", "--rm", "--name", "corral-j-0-1", "--network", "host", "--ipc", "host", "--init",
        "--security-opt", "no-new-privileges", "--cap-drop", "ALL",
        "--device", "nvidia.com/gpu=4", "--device", "nvidia.com/gpu=5",
        "--volume", "/nvme/imagenet:/data:ro", "--volume", "/scratch/j:/out",
        "--volume", "/shared/ckpt/j:/shared/ckpt/j", "--volume", f"{CONTROL}:{CONTROL}",
        "--workdir", "/work/run", "--cpus", "8", "--memory", "65536m", "--user", "1000:1000"]
    assert launch.argv[-3:] == ["registry.local/train:1", "python", "train.py"]
    assert {"RANK", "MASTER_ADDR", "CORRAL_CONTROL", "MY_FLAG", "CUDA_VISIBLE_DEVICES"} <= set(env_flags)
    assert "PATH" not in env_flags and "SECRET_X" not in env_flags and "HOME" not in env_flags
    assert all("=" not in name for name in env_flags)  # values stay out of the argv
    assert launch.env["MY_FLAG"] == "1" and launch.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert launch.kill_argv == ["podman", "rm", "--force", "corral-j-0-1"]
    assert launch.exists_argv == ["podman", "container", "inspect", "--format", "{{.Id}}", "corral-j-0-1"]


def test_docker_asks_for_the_gpus_with_the_quoted_device_list() -> None:
    a = assignment(runtime="docker", command=())
    launch = DockerRuntime().launch(a, RANK, env_of(a), CONTROL)
    i = launch.argv.index("--gpus")
    assert launch.argv[i + 1] == '"device=4,5"'
    assert launch.argv[-1] == "registry.local/train:1"  # no command: the image's entrypoint
    assert launch.argv[:3] == ["docker", "run", "--rm"]
    assert "no-new-privileges" in launch.argv and launch.argv[launch.argv.index("--cap-drop") + 1] == "ALL"


def test_only_docker_and_podman_switch_to_the_submitter_themselves() -> None:
    """The review found apptainer in the list of runtimes the stepd starts as the agent (root):
    apptainer has no --user; it runs the container as whoever starts it."""
    assert set(USER_FLAG_RUNTIMES) == {"docker", "podman"}
    alice = WorkerUser(name="alice", uid=1000, gid=1000, groups=(), home="/home/alice", shell="/bin/sh")
    for runtime in (PodmanRuntime(), DockerRuntime()):
        a = assignment(runtime=runtime.name, user=alice)
        assert "--user" in runtime.launch(a, RANK, env_of(a), CONTROL).argv


def test_apptainer_command_line() -> None:
    a = assignment(runtime="apptainer", image="/images/train.sif")
    launch = ApptainerRuntime().launch(a, RANK, env_of(a), CONTROL)
    assert launch.argv == [
        "apptainer", "exec", "--nv", "--cleanenv", "--bind", "/nvme/imagenet:/data:ro", "--bind", "/scratch/j:/out",
        "--bind", "/shared/ckpt/j:/shared/ckpt/j", "--bind", f"{CONTROL}:{CONTROL}", "--pwd", "/work/run",
        "/images/train.sif", "python", "train.py"]
    assert launch.env["APPTAINERENV_RANK"] == "1" and launch.env["APPTAINERENV_CUDA_VISIBLE_DEVICES"] == "4,5"
    assert "APPTAINERENV_SECRET_X" not in launch.env


@pytest.mark.parametrize("name", ["process", "sandbox", "podman", "docker", "apptainer"])
def test_every_runtime_gives_the_same_worker_variables(name: str) -> None:
    a = assignment(runtime=name)
    env = runtime_for(name).launch(a, RANK, env_of(a), CONTROL).env
    values = {k.removeprefix("APPTAINERENV_"): v for k, v in env.items()}
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CORRAL_CHECKPOINT_DIR", "CORRAL_CONTROL",
                "CORRAL_CHECKPOINT_SIGNAL", "CORRAL_JOB_ID", "MY_FLAG"):
        assert values[key] == env_of(a)[key], key
    with pytest.raises(ValueError, match="unknown worker runtime"):
        runtime_for("kubernetes")


def test_an_assignment_with_runtime_fields_survives_launch_json() -> None:
    a = assignment(runtime="podman")
    assert assignment_from_json(assignment_to_json(a)) == a


def gang() -> GangReserved:
    return GangReserved.new(stream=job_stream("j"), actor="placement", job_id="j",
                            ranks=[RankPlacement(rank=0, node="a", gpus=[0])], world_size=1,
                            master_addr="10.0.0.1", master_port=29500)


def test_datasets_resolve_to_this_nodes_path_and_a_missing_one_names_the_fix(tmp_path: Path) -> None:
    spec = JobSpec(name="j", queue="q", runtime="sandbox", command=["x"], workdir="/w",
                   mounts=[Mount(source="imagenet", target="/data"), Mount(source="/host/out", target="/out",
                                                                              read_only=False)],
                   cpus_per_replica=4)
    a = build_assignment(gang(), "a", spec, runtime="process", python="py", checkpoint_root=tmp_path,
                         log_dir=tmp_path, datasets={"imagenet": "/nvme/imagenet"})
    assert a is not None and a.runtime == "sandbox" and a.workdir == Path("/w") and a.cpus == 4
    assert a.mounts == (MountBind("/nvme/imagenet", "/data"), MountBind("/host/out", "/out", read_only=False))
    with pytest.raises(ValueError, match=r"dataset `imagenet` is not declared on node a \(it has: c4\)"):
        build_assignment(gang(), "a", spec, runtime="process", python="py", checkpoint_root=tmp_path,
                         log_dir=tmp_path, datasets={"c4": "/c4"})


def test_the_specs_checkpoint_dir_wins_and_a_simulating_agent_runs_a_plain_process(tmp_path: Path) -> None:
    spec = JobSpec(name="j", queue="q", runtime="sandbox", command=["x"], checkpoint=Checkpoint(dir="/shared/run1"),
                   estimated_runtime_seconds=5)
    a = build_assignment(gang(), "a", spec, runtime="process", python="py", checkpoint_root=tmp_path, log_dir=tmp_path)
    assert a is not None and a.checkpoint_dir == Path("/shared/run1")
    sim = build_assignment(gang(), "a", spec, runtime="sim", python="py", checkpoint_root=tmp_path, log_dir=tmp_path)
    assert sim is not None and (sim.runtime, sim.mounts, sim.image) == ("process", (), None)


@pytest.mark.parametrize("name", ["podman", "docker", "sandbox"])
def test_gpus_from_a_device_folder_are_its_device_files(name: str) -> None:
    """`CORRAL_GPU_DEVICES`: the rank's own GPU files, and the driver's the folder has, at /dev."""
    a = assignment(runtime=name, image=None if name == "sandbox" else "img")
    have = {"/fake/dev/nvidia4", "/fake/dev/nvidia5", "/fake/dev/nvidia0", "/fake/dev/nvidiactl"}
    if name == "sandbox":
        runtime = SandboxRuntime(host=Host(exists=have.__contains__, root_entries=lambda: ["/usr"]),
                                 devices="/fake/dev")
        argv = runtime.launch(a, RANK, env_of(a), CONTROL).argv
        pairs = [(argv[i + 1], argv[i + 2]) for i, arg in enumerate(argv) if arg == "--dev-bind"]
    else:
        runtime = (PodmanRuntime if name == "podman" else DockerRuntime)(devices="/fake/dev",
                                                                        exists=have.__contains__)
        argv = runtime.launch(a, RANK, env_of(a), CONTROL).argv
        pairs = [(argv[i + 1].split(":")[0], argv[i + 1].split(":")[1]) for i, arg in enumerate(argv)
                 if arg == "--device"]
        assert "--gpus" not in argv
    assert pairs == [("/fake/dev/nvidia4", "/dev/nvidia4"), ("/fake/dev/nvidia5", "/dev/nvidia5"),
                     ("/fake/dev/nvidiactl", "/dev/nvidiactl")]
    assert type(runtime_for(name, "/fake/dev")) is type(runtime)


@pytest.mark.parametrize("runtime", [PodmanRuntime(), DockerRuntime(), ApptainerRuntime()])
def test_a_container_gets_the_agents_gloo_interface_on_the_host_network(runtime: object) -> None:
    """The agent names the interface of its advertised address for gloo (`node_agent.host.interfaces`);
    a container on the host's network has the same interfaces, and its image's host name resolves
    no better than the host's."""
    a = assignment(runtime=runtime.name)  # type: ignore[attr-defined]
    env = build_rank_env(a, RANK, CONTROL, {"PATH": "/usr/bin", "GLOO_SOCKET_IFNAME": "eth1"}, interpreter_bin="")
    launch = runtime.launch(a, RANK, env, CONTROL)  # type: ignore[attr-defined]
    assert launch.env.get("GLOO_SOCKET_IFNAME") == "eth1" or \
        launch.env.get("APPTAINERENV_GLOO_SOCKET_IFNAME") == "eth1", launch
    assert "PATH" not in [launch.argv[i + 1] for i, arg in enumerate(launch.argv) if arg == "--env"]
