"""A Slurm cluster on this host, in a temporary folder, from Debian's packages: the peer to compare with.

slurmctld and one `slurmd -N nodeN` per node (Debian builds Slurm with multiple-slurmd support),
each node declaring `gpus` GPUs as character devices (`mknod <dir>/nvidiaN c 1 3`, i.e. /dev/null's
numbers) listed with `File=` in gres.conf, so Slurm allocates and fences GPUs as on a real node;
its own munged on a socket in the folder. Every daemon runs in the foreground as a child of the
benchmark (their CPU is counted, see `proc_account`) and is stopped with the folder removed.

The scheduler settings are Slurm's high-throughput tuning (its "High Throughput Computing"
guide), the ones the comparison with Corral uses; `--slurm-defaults` drops them.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from proc_account import Reaper

TUNED = "batch_sched_delay=0,sched_min_interval=10000,default_queue_depth=200,bf_continue,bf_interval=10"
PROGRAMS = ("slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "srun", "munged")
INSTALL_HINT = "apt-get install -y slurm-wlm munge"


def missing_programs(path: str | None = None) -> list[str]:
    """The programs this needs that are not on `path` (default: PATH, /usr/sbin and /sbin)."""
    path = path if path is not None else os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [p for p in PROGRAMS if shutil.which(p, path=path) is None]


def free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def slurm_conf(root: Path, nodes: int, gpus: int, cpus: int, ports: list[int], user: str,
               scheduler_parameters: str | None) -> str:
    """slurm.conf for `nodes` nodes on this host, each on its own slurmd port (ports[0] is slurmctld's)."""
    lines = [
        "ClusterName=peer",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={ports[0]}",
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge/munge.sock",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/spool/slurmd.%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd.%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",  # the declared CPUs, not this host's two
        "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "MaxJobCount=100000",
        "MinJobAge=600",
    ]
    if scheduler_parameters:
        lines.append(f"SchedulerParameters={scheduler_parameters}")
    for n in range(1, nodes + 1):
        lines.append(f"NodeName=node{n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={ports[n]} "
                     f"CPUs={cpus} RealMemory=4000 Gres=gpu:{gpus} State=UNKNOWN")
    lines.append(f"PartitionName=gpu Nodes=node[1-{nodes}] Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


@dataclass
class SlurmCluster:
    """The daemons of a local Slurm; `env` is what its client commands need (SLURM_CONF)."""

    root: Path
    nodes: int
    reaper: Reaper
    procs: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    keep: bool = False

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.root / "slurm.conf")}

    def pids(self) -> dict[int, str]:
        """Each daemon's pid and name (the slurmds as "slurmd", together)."""
        return {p.pid: name.split(":")[0] for name, p in self.procs.items()}

    def command(self, *argv: str, timeout: float = 60.0) -> str:
        code, out, err = self.reaper.run(argv, timeout, env=self.env)
        if code != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {code}: {err.strip() or out.strip()}")
        return out

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        _kill_leftovers(self.root)
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)


def _kill_leftovers(root: Path) -> None:
    """slurmstepds (and their jobs) still running from this folder's cluster: SIGKILL them."""
    mark = str(root).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if b"slurmstepd" in cmdline and mark in environ:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except ProcessLookupError:
                pass


def _gpu_files(folder: Path, gpus: int) -> None:
    """nvidia0..N-1 as character devices 1:3 (as /dev/null) when allowed (root), else plain files."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(gpus):
        path = folder / f"nvidia{i}"
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            path.touch()


def start(nodes: int, gpus: int, reaper: Reaper, *, cpus: int = 8, tuned: bool = True,
          data_dir: Path | None = None, timeout: float = 60.0) -> SlurmCluster:
    """munged, slurmctld and `nodes` slurmds, started and waited for until every node is idle."""
    root = (data_dir or Path(tempfile.mkdtemp(prefix="corral-peer-slurm-"))).resolve()
    for sub in ("state", "log", "munge"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # munged wants every folder above its socket reachable and none writable by others
    (root / "munge").chmod(0o700)
    for n in range(1, nodes + 1):
        (root / "spool" / f"node{n}").mkdir(parents=True, exist_ok=True)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    _gpu_files(root / "dev", gpus)
    ports = free_ports(nodes + 1)
    user = getpass.getuser()
    (root / "slurm.conf").write_text(slurm_conf(root, nodes, gpus, cpus, ports, user, TUNED if tuned else None))
    (root / "gres.conf").write_text(f"Name=gpu File={root}/dev/nvidia[0-{gpus - 1}]\n")
    cluster = SlurmCluster(root, nodes, reaper, keep=data_dir is not None)
    env = cluster.env
    sbin = "/usr/sbin:/sbin:" + env.get("PATH", "")
    env["PATH"] = sbin

    def daemon(name: str, argv: list[str]) -> None:
        out = (root / "log" / f"{name.replace(':', '-')}.out").open("w")
        cluster.procs[name] = reaper.spawn(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                           stdin=subprocess.DEVNULL)
        out.close()

    try:
        daemon("munged", ["munged", "--foreground", "--force", f"--socket={root}/munge/munge.sock",
                          f"--key-file={key}", f"--log-file={root}/log/munged.log",
                          f"--pid-file={root}/munge/munged.pid", f"--seed-file={root}/munge/seed"])
        _wait_for(lambda: (root / "munge" / "munge.sock").exists(), timeout, "munged's socket", root)
        conf = str(root / "slurm.conf")
        daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", conf])
        for n in range(1, nodes + 1):
            daemon(f"slurmd:node{n}", ["slurmd", "-D", "-N", f"node{n}", "-f", conf])
        _wait_for(lambda: _all_idle(cluster), timeout, "every node idle in sinfo", root)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _all_idle(cluster: SlurmCluster) -> bool:
    for name, proc in cluster.procs.items():
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited {proc.returncode}: see {cluster.root}/log/")
    try:
        states = cluster.command("sinfo", "-h", "-N", "-o", "%t", timeout=10).split()
    except RuntimeError:
        return False
    return len(states) == cluster.nodes and all(s == "idle" for s in states)


def _wait_for(check: object, timeout: float, what: str, root: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise TimeoutError(f"Slurm: no {what} within {timeout:.0f}s (logs in {root}/log/)")
