"""Which OS user a job's ranks run as, and what that user needs to find on disk.

Why: a rank run as the agent's own OS user (root on a real node) makes `user` only a label: any
submitter's command could read /etc/shadow, another job's checkpoints, the agent's credentials.
Slurm runs each job as the submitting user's uid/gid (slurmstepd switches before exec); Corral does
the same when its agent runs as root.

The submitting user is the one the log records on the job's JobSubmitted (admission sets it from
the NATS identity that published the request, never from the spec). On a node agent running as
root with `--run-as submitter` (the default of `corral agent`), each rank
runs as the OS account of that name: its uid, primary gid and supplementary groups, with HOME,
USER, LOGNAME and SHELL set for it. The job is refused (a WorkerExited naming the user and the
fix, never a crash) when the job names no user, when the name has no OS account on the node, or
when the account is uid 0 and the job's queue does not say `allow_root: true`.

`--run-as agent` (what `corral up`, a single-box development stack, uses) and any agent that is
not root (a developer's laptop: it cannot switch users) run every rank as the agent's own user,
as before. Stdlib only: the stepd imports this.
"""

from __future__ import annotations

import enum
import os
import pwd
import stat
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUN_AS_ENV = "CORRAL_AGENT_RUN_AS"


class RunAs(enum.StrEnum):
    """Whose OS account a job's ranks run as (`--run-as`, env CORRAL_AGENT_RUN_AS)."""

    SUBMITTER = "submitter"  # the submitting user's, when the agent is root (Slurm's model)
    AGENT = "agent"  # the agent's own: a single-user box (`corral up`), or an agent that is not root

    @classmethod
    def parse(cls, raw: str, where: str = RUN_AS_ENV) -> RunAs:
        try:
            return cls(raw.strip().lower())
        except ValueError:
            raise ValueError(f"{where}={raw!r}: give one of {', '.join(m.value for m in cls)}") from None


class RefusalCode(enum.StrEnum):
    """The WorkerExited reason code of a job this node will not run as its submitter."""

    NO_SUBMITTER = "NO_SUBMITTER"  # the job's JobSubmitted names no user
    NO_OS_ACCOUNT = "NO_OS_ACCOUNT"  # the user has no account on this node
    ROOT_NOT_ALLOWED = "ROOT_NOT_ALLOWED"  # the account is uid 0 and the queue does not allow root


@dataclass(frozen=True)
class Refused:
    code: RefusalCode
    message: str


@dataclass(frozen=True)
class WorkerUser:
    """An OS account the ranks of one job run as."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    shell: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "uid": self.uid, "gid": self.gid, "groups": list(self.groups),
                "home": self.home, "shell": self.shell}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> WorkerUser:
        return cls(name=str(d["name"]), uid=int(d["uid"]), gid=int(d["gid"]),
                   groups=tuple(int(g) for g in d.get("groups") or ()), home=str(d.get("home") or "/"),
                   shell=str(d.get("shell") or ""))

    def env(self) -> dict[str, str]:
        """The variables a login of this user would have (they replace the agent's)."""
        env = {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}
        if self.shell:
            env["SHELL"] = self.shell
        return env

    def cwd(self) -> str:
        """Where a rank of a job without `workdir` starts: the user's home if it is a directory."""
        return self.home if self.home and os.path.isdir(self.home) else "/"


def switches_users(run_as: RunAs, euid: int | None = None) -> bool:
    """Whether ranks run as their submitter: asked for, and the agent is root (else it cannot)."""
    return run_as is RunAs.SUBMITTER and (os.geteuid() if euid is None else euid) == 0


def resolve(user: str | None, *, queue: str, allow_root: bool, node: str,
            lookup: Callable[[str], pwd.struct_passwd] = pwd.getpwnam,
            grouplist: Callable[[str, int], list[int]] = os.getgrouplist) -> WorkerUser | Refused:
    """The account the ranks of a job submitted by `user` to `queue` run as on `node`, or why not."""
    if not user:
        return Refused(RefusalCode.NO_SUBMITTER, (
            f"the job names no submitting user, and this node runs each job as its submitter's OS user "
            f"(--run-as submitter): submit it through a NATS identity (`corral submit`), or run the agent "
            f"of {node} with --run-as agent"))
    try:
        account = lookup(user)
    except (KeyError, ValueError):
        return Refused(RefusalCode.NO_OS_ACCOUNT, (
            f"user `{user}` has no OS account on {node}, and this node runs each job as its submitter's OS "
            f"user (--run-as submitter): create the account on every node (`useradd {user}`, or from your "
            f"directory service), or run the agent with --run-as agent (every job as the agent's user)"))
    if account.pw_uid == 0 and not allow_root:
        return Refused(RefusalCode.ROOT_NOT_ALLOWED, (
            f"user `{user}` is uid 0 (root) on {node} and queue `{queue}` does not allow jobs to run as "
            f"root: submit as an unprivileged user, or set `allow_root: true` on queue `{queue}` "
            "(`corral apply`)"))
    try:
        groups = grouplist(account.pw_name, account.pw_gid)
    except OSError:
        groups = [account.pw_gid]
    ordered = tuple(dict.fromkeys([account.pw_gid, *groups]))
    return WorkerUser(name=account.pw_name, uid=account.pw_uid, gid=account.pw_gid, groups=ordered,
                      home=account.pw_dir, shell=account.pw_shell)


# --- what the user needs on disk ------------------------------------------------------------------

def _may(st: os.stat_result, user: WorkerUser, bit_owner: int, bit_group: int, bit_other: int) -> bool:
    if user.uid == 0:
        return True
    if st.st_uid == user.uid:
        return bool(st.st_mode & bit_owner)
    if st.st_gid in user.groups:
        return bool(st.st_mode & bit_group)
    return bool(st.st_mode & bit_other)


def unsearchable(path: Path, user: WorkerUser, *, itself: bool = False) -> Path | None:
    """The first directory on the way to `path` (and `path` itself if `itself`) that `user` may not
    search (mode bits; ACLs are not read), or None. `os.access` cannot answer: it asks as the agent."""
    absolute = Path(os.path.abspath(path))
    for parent in [*reversed(absolute.parents), *([absolute] if itself else [])]:
        try:
            st = os.stat(parent)
        except OSError:
            return parent
        if not _may(st, user, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH):
            return parent
    return None


def reach_problem(paths: Iterable[Path], user: WorkerUser, workdir: Path | None = None) -> str | None:
    """A message naming a directory that keeps `user` from the job's files (or its `workdir`), or None."""
    for path in paths:
        blocked = unsearchable(path, user)
        if blocked is not None:
            return (f"user `{user.name}` (uid {user.uid}) cannot reach {path}: {blocked} is not searchable by it; "
                    f"make the agent's --state-dir, --checkpoint-dir and their parents searchable "
                    f"(chmod o+x {blocked}) or choose directories outside private ones")
    if workdir is not None:
        blocked = unsearchable(workdir, user, itself=True)
        if blocked is not None:
            return (f"user `{user.name}` (uid {user.uid}) cannot enter the job's workdir {workdir}: {blocked} "
                    "is not searchable by it; give a workdir that user may enter")
    return None


def own_dir(path: Path, user: WorkerUser, mode: int = 0o700) -> None:
    """Create `path` (and missing parents, as the agent) and give the last component to `user`.

    Never through a symlink: `path` must be a real directory (a job's directory is named after its
    id inside a directory only the agent writes, so no user can plant one there)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=mode)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{path} is not a directory (a symlink?); not giving it to user `{user.name}`")
    if (st.st_uid, st.st_gid) != (user.uid, user.gid):
        os.chown(path, user.uid, user.gid, follow_symlinks=False)
    os.chmod(path, mode)  # a directory, checked above; its parent only the agent writes


def make_dir_as(path: Path, user: WorkerUser) -> None:
    """Make `path` exist as `user` would make it (`mkdir -p` run as that user); take nothing.

    A spec's `checkpoint.dir` is any absolute path, and `own_dir` (for folders the agent names under
    its own checkpoint root) would give an existing folder to the submitter: `checkpoint: {dir:
    /etc}` would make /etc theirs. A folder the job names is made with the job's own rights, or the
    start fails saying so."""
    try:
        done = subprocess.run(["mkdir", "-p", "--", str(path)], user=user.uid, group=user.gid,
                              extra_groups=list(user.groups), capture_output=True, text=True, timeout=30,
                              cwd="/")
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PermissionError(f"checkpoint.dir {path}: could not be made as user `{user.name}`: {exc}") from exc
    if done.returncode != 0:
        raise PermissionError(f"checkpoint.dir {path}: user `{user.name}` (uid {user.uid}) cannot make it "
                              f"({done.stderr.strip() or f'mkdir exited {done.returncode}'}); name a folder that "
                              "user may write, or leave checkpoint.dir out to use the cluster's")


def own_file(path: Path, user: WorkerUser, mode: int = 0o600) -> None:
    """Create `path` if missing (never following a symlink) and make it `user`'s."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PermissionError(f"{path} is not a regular file; not giving it to user `{user.name}`")
        os.fchown(fd, user.uid, user.gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


#: Variables of the agent's environment a rank never inherits when it runs as another user: the
#: agent's bus and database credentials (docker-compose puts passwords in the URLs).
SECRET_ENV = ("CORRAL_NATS_URL", "CORRAL_NATS_CREDENTIALS", "CORRAL_POSTGRES_DSN", "CORRAL_CREDENTIALS",
              "PGPASSWORD", "DATABASE_URL")
_SECRET_WORDS = ("PASSWORD", "SECRET", "TOKEN", "CREDENTIAL")


def is_secret(name: str) -> bool:
    upper = name.upper()
    return name in SECRET_ENV or any(w in upper for w in _SECRET_WORDS)


def user_base_env(base_env: Mapping[str, str], user: WorkerUser) -> dict[str, str]:
    """The agent's environment as a base for a rank run as `user`: without the agent's secrets, with
    the user's HOME/USER/LOGNAME/SHELL (and nothing of the agent's session that names its home)."""
    env = {k: v for k, v in base_env.items() if not is_secret(k)
           and k not in ("XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "MAIL",
                         "PYTHONUSERBASE", "SUDO_USER", "SUDO_UID", "SUDO_GID", "SUDO_COMMAND")}
    env.update(user.env())
    return env
