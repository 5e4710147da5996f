"""The files through which a node agent and a job's stepd talk: one folder per job attempt.

Why files: the stepd (`stepd.py`, one process per gang attempt on a node) must outlive the agent
(a `kill -9`, an upgrade). What it knows has to be readable by whichever agent process comes next,
so it is written down, not held in a socket: `state.json` is the truth about the ranks (pids,
start and exit times, exit codes and why, checkpoints), one JSON record per line, a whole state
each: every change appends a record to the file the claim created (`append_state`), and the last
complete line is the state (`read_state`). An append is an in-place write; a replace (tmp +
rename) makes a new inode, which costs this kind of filesystem tenths of a millisecond, several
times per gang. A file past `STATE_COMPACT_AT` is replaced by its newest record alone. The agent
reads it (polling its inode, mtime and size) and reports from it; the agent's commands (preempt,
stop) go the other way in `commands.json`, an append-only list, each also
followed by SIGUSR2 to wake the stepd.

    <run_dir>/<job>.attempt-<N>/     (a nested <run_dir>/<job>/attempt-<N>/ is read as well)
        launch.json     the agent: the Assignment, the causing event, grace; written before spawning
        state.json      the stepd (the ONE writer while it lives): records appended, the last complete
                        line the state; claimed by a hard link to launch.json's inode once that
                        holds the first state (`claim_state`), so an agent that finds launch.json
                        alone can claim the folder as abandoned
        commands.json   the agent: [{"op": "preempt"|"stop", ...}], never reordered
        reported        the agent: every report of this attempt was published (nothing to redo)
        stepd.log       the stepd's own output, made only when it has something to say
        rank-<r>.control  each rank's control file (checkpoint reports, see `control`)

The folder goes (`remove_attempt`) once it is reported and its ranks here all exited 0 or the log
holds the attempt's end (the job ended, the attempt was released or requeued past; see
`Supervisor.attempts_over`).

No fsync: the files need to survive the agent process, not the machine; a machine that goes down
takes its ranks with it, and placement's NodeLost covers that. Stdlib only: the stepd imports this.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal as signal_module
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .assignment import Assignment, MountBind, RankAssignment
from .run_as import WorkerUser

STATE_VERSION = 2  # 1: attempts counted from 1 (read back as attempt - 1)
STATE_COMPACT_AT = 64 * 1024  # bytes of state.json past which the next record replaces the file

LAUNCH = "launch.json"
STATE = "state.json"
COMMANDS = "commands.json"
REPORTED = "reported"
STEPD_LOG = "stepd.log"
WAKE_SIGNAL = signal_module.SIGUSR2

# state["phase"]
STARTING, RUNNING, ENDED, ABANDONED = "starting", "running", "ended", "abandoned"


ATTEMPT_SUFFIX = ".attempt-"


def attempt_dir(run_dir: Path, job_id: str, attempt: int) -> Path:
    """`<run_dir>/<job>.attempt-<N>`: one folder per attempt, right in the run folder (a folder
    per job above it would be one more inode per job, which this kind of filesystem makes dear)."""
    return run_dir / f"{job_id}{ATTEMPT_SUFFIX}{attempt}"


def nested_attempt_dir(run_dir: Path, job_id: str, attempt: int) -> Path:
    """`<run_dir>/<job>/attempt-<N>`, where agents kept an attempt inside a folder of its job:
    read (adopted, its log cursors followed), never made."""
    return run_dir / job_id / f"attempt-{attempt}"


def attempt_folders(run_dir: Path) -> list[tuple[str, int, Path]]:
    """(job, attempt, folder) of every attempt folder in `run_dir`, of either layout, by their
    names (a folder's launch.json says whether it was launched)."""
    found: list[tuple[str, int, Path]] = []
    try:
        entries = list(os.scandir(run_dir))
    except OSError:
        return found
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        job, _, number = entry.name.rpartition(ATTEMPT_SUFFIX)
        if job and number.isdigit() and os.path.lexists(os.path.join(entry.path, LAUNCH)):
            found.append((job, int(number), Path(entry.path)))
            continue
        try:  # a job's folder of the nested layout (or a flat attempt the agent left before its launch)
            inner = list(os.scandir(entry.path))
        except OSError:
            continue
        for sub in inner:
            number = sub.name.removeprefix("attempt-")
            if sub.name.startswith("attempt-") and number.isdigit() and sub.is_dir(follow_symlinks=False):
                found.append((entry.name, int(number), Path(sub.path)))
    return found


#: An attempt folder's mode once every report of it is published: closed to others (no rank of it
#: runs any more) and sticky, a bit no mkdir sets from a umask: a marker without a file (each new
#: name costs the disk an inode).
REPORTED_MODE = 0o1700


def mark_reported(folder: Path) -> None:
    os.chmod(folder, REPORTED_MODE)


def is_reported(folder: Path) -> bool:
    """Whether the attempt in `folder` is reported: its mode, or a `reported` file in it (a marker too)."""
    try:
        if os.stat(folder).st_mode & 0o7777 == REPORTED_MODE:
            return True
    except OSError:
        return False
    return os.path.exists(os.path.join(folder, REPORTED))


def remove_attempt(folder: Path) -> None:
    """Remove an attempt's folder and what it holds (nothing in it is needed any more: see
    `Supervisor.attempts_over`). What cannot be removed stays, to be tried again at adoption.

    A gang that went well leaves launch.json and its second name state.json alone: those names
    go, then the folder; a folder holding more (commands, a stepd.log, control files) is walked."""
    path = os.fspath(folder)
    try:
        for name in (STATE, LAUNCH):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(path, name))
        os.rmdir(path)
    except FileNotFoundError:
        return
    except OSError:
        shutil.rmtree(path, ignore_errors=True)


def control_path(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank}.control"


# --- JSON files ---------------------------------------------------------------------------------

def read_json(path: Path) -> Any:
    """The content of `path`, or None when it is missing or not (yet) valid JSON."""
    try:
        return json.loads(read_file(path))
    except (OSError, ValueError):
        return None


def read_file(path: str | Path) -> bytes:
    """The bytes of `path` (OSError when it cannot be read): a file object's buffering, tty check
    and seeks are calls this reader of small whole files does without."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _write_private(path: Path, text: str) -> None:
    """Write `path` readable by the agent's user only: launch.json holds the job's env, and a job
    run as its submitter (see `run_as`) must not read another job's (it can enter the folder)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        data = text.encode()
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)


def write_json(path: Path, content: Any) -> None:
    """Replace `path` atomically: a reader sees the old or the new content, never a mix."""
    tmp = _tmp(path)
    try:
        _write_private(tmp, json.dumps(content, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):  # a part written before the disk filled
            tmp.unlink()
        raise


def write_new_json(path: Path, content: Any) -> None:
    """Write a file that nothing reads before it is complete, in place (no tmp file renamed over
    it: each new name costs the disk an inode). For launch.json: written before its stepd starts,
    and one cut short (the agent died writing it) reads as not launched, so it is launched again."""
    try:
        _write_private(path, json.dumps(content, sort_keys=True) + "\n")
    except OSError:
        with contextlib.suppress(OSError):  # a part written before the disk filled
            path.unlink()
        raise


def create_json(path: Path, content: Any) -> bool:
    """Create `path` atomically unless it exists (a hard link refuses to overwrite): True if created."""
    tmp = _tmp(path)
    try:
        _write_private(tmp, json.dumps(content, sort_keys=True) + "\n")
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def claim_state(folder: Path, content: Any) -> bool:
    """Claim an attempt for its stepd: True if claimed, False if the agent abandoned it first.

    `content`, the first state, is appended to launch.json, whose inode then takes the name
    state.json too (a hard link: refused where the name exists, so the claim and the agent's
    `abandon` exclude each other, and a reader of state.json finds a whole state in it from the
    start). One inode for the two files: a new inode costs this kind of filesystem tenths of a
    millisecond. The launch stays the file's first line (`read_launch`); a state is a later line
    (`read_state`); a replace of state.json (`STATE_COMPACT_AT`) leaves launch.json as it was."""
    launch = folder / LAUNCH
    append_record(launch, content, compact_at=NEVER_COMPACT)
    try:
        os.link(launch, folder / STATE)
    except FileExistsError:
        return False
    return True


NEVER_COMPACT = 1 << 62


def append_state(path: Path, content: Any) -> None:
    """Append one state record (a line) to `path` (see `append_record`)."""
    append_record(path, content, compact_at=STATE_COMPACT_AT)


def append_record(path: Path, content: Any, *, compact_at: int, create: bool = True) -> None:
    """Append one JSON record (a line) to `path`, made mode 0600 if missing (FileNotFoundError
    instead when not `create`); past `compact_at` bytes, replace the file by this record alone
    (`write_json`). A record the disk took only in part is cut off again; one that could not be (a
    tail with no newline) is ended before the next, so each record is one line."""
    data = json.dumps(content, sort_keys=True).encode() + b"\n"
    flags = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size + len(data) > compact_at:
            write_json(path, content)
            return
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        try:
            written = os.write(fd, data)
        except OSError:
            written = -1
        if written != len(data):
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise OSError(errno.ENOSPC, f"{path}: the record was not written")
    finally:
        os.close(fd)


def _is_state(record: dict[str, Any]) -> bool:
    return "phase" in record


def last_record(raw: bytes, valid: Callable[[dict[str, Any]], bool] = _is_state) -> dict[str, Any] | None:
    """The newest record in a file of records (`append_record`): its last complete line that is
    a `valid` one (a line cut short by a full disk or a crash is not), or the whole file when it
    holds no newline (one record, as a whole-file write leaves it)."""
    lines = raw.split(b"\n")
    for line in reversed(lines[:-1] or lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and valid(record):
            return record
    return None


def file_version(path: str | Path) -> tuple[int, int, int] | None:
    """What changes when `path` is replaced or rewritten (inode, mtime, size); None if missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


# --- process identity ---------------------------------------------------------------------------

def process_start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (clock ticks since boot, /proc/<pid>/stat field 22), or
    None when the process does not exist, is a zombie, or there is no /proc. A pid alone can be
    reused after its process ended; (pid, start time) names one process for the machine's uptime."""
    try:
        raw = read_file(f"/proc/{pid}/stat")
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()
    if len(fields) < 20 or fields[0] == b"Z":
        return None
    return fields[19].decode()


_HAVE_PROC = os.path.exists("/proc/self/stat")


def is_alive(pid: int | None, start_time: str | None) -> bool:
    """Whether the process `pid` that started at `start_time` still runs (not a reused pid).

    Without /proc (not Linux) the start time cannot be read back; existence is all we can check."""
    if not pid or pid <= 0:
        return False
    if _HAVE_PROC:
        now = process_start_time(pid)
        return now is not None and (start_time is None or now == start_time)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: int) -> None:
    """Signal a rank's process group; a group that is already gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def signal_group_members(pgid: int, sig: int, *, spare: int) -> None:
    """Signal every process of group `pgid` but `spare` (found in /proc; none without it)."""
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit() or int(entry) == spare:
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry), sig)


# --- the Assignment as JSON ----------------------------------------------------------------------

def assignment_to_json(a: Assignment) -> dict[str, Any]:
    return {
        "job_id": a.job_id, "attempt": a.attempt, "world_size": a.world_size, "node_rank": a.node_rank,
        "master_addr": a.master_addr, "master_port": a.master_port,
        "ranks": [{"rank": r.rank, "local_rank": r.local_rank, "gpus": list(r.gpus)} for r in a.ranks],
        "command": list(a.command), "checkpoint_dir": str(a.checkpoint_dir), "log_dir": str(a.log_dir),
        "env": dict(a.env), "resume_from": str(a.resume_from) if a.resume_from else None,
        "checkpoint_signal": a.checkpoint_signal, "max_restarts": a.max_restarts, "restarts": a.restarts,
        "workdir": str(a.workdir) if a.workdir else None,
        "user": a.user.to_json() if a.user else None, "group_world_size": a.group_world_size,
        "runtime": a.runtime, "image": a.image, "cpus": a.cpus, "memory_gib": a.memory_gib,
        "mounts": [{"host": m.host, "target": m.target, "read_only": m.read_only} for m in a.mounts],
        "checkpoint_dir_from_spec": a.checkpoint_dir_from_spec,
    }


def assignment_from_json(d: dict[str, Any]) -> Assignment:
    return Assignment(
        job_id=d["job_id"], attempt=int(d["attempt"]), world_size=int(d["world_size"]),
        node_rank=int(d["node_rank"]), master_addr=d["master_addr"], master_port=int(d["master_port"]),
        ranks=tuple(RankAssignment(int(r["rank"]), int(r["local_rank"]), tuple(int(g) for g in r["gpus"]))
                    for r in d["ranks"]),
        command=tuple(d["command"]), checkpoint_dir=Path(d["checkpoint_dir"]), log_dir=Path(d["log_dir"]),
        env=dict(d.get("env") or {}), resume_from=Path(d["resume_from"]) if d.get("resume_from") else None,
        checkpoint_signal=d.get("checkpoint_signal") or "SIGUSR1", max_restarts=int(d.get("max_restarts", 0)),
        restarts=int(d.get("restarts", 0)), workdir=Path(d["workdir"]) if d.get("workdir") else None,
        user=WorkerUser.from_json(d["user"]) if d.get("user") else None,
        # files written before it was recorded: at least enough nodes for this one's rank
        group_world_size=int(d.get("group_world_size", int(d["node_rank"]) + 1)),
        # files written before runtimes: a process, no image, no mounts
        runtime=d.get("runtime") or "process", image=d.get("image"),
        mounts=tuple(MountBind(str(m["host"]), str(m["target"]), bool(m.get("read_only", True)))
                     for m in d.get("mounts") or ()),
        cpus=float(d["cpus"]) if d.get("cpus") is not None else None,
        memory_gib=float(d["memory_gib"]) if d.get("memory_gib") is not None else None,
        checkpoint_dir_from_spec=bool(d.get("checkpoint_dir_from_spec", False)),
    )


@dataclass(frozen=True)
class Launch:
    """launch.json: what the stepd runs and how."""

    assignment: Assignment
    cause: str | None  # event id of the GangReserved that launched it (causation of the reports)
    kill_grace: float  # SIGTERM -> SIGKILL for the peers of a crashed rank
    launched_at: float  # wall clock

    def to_json(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "assignment": assignment_to_json(self.assignment), "cause": self.cause,
                "kill_grace": self.kill_grace, "launched_at": self.launched_at}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Launch:
        assignment = assignment_from_json(d["assignment"])
        if d.get("version", 1) == 1:  # an agent of before counted attempts from 1
            assignment = replace(assignment, attempt=assignment.attempt - 1)
        return cls(assignment=assignment, cause=d.get("cause"),
                   kill_grace=float(d.get("kill_grace", 5.0)), launched_at=float(d.get("launched_at", 0.0)))


def read_launch(folder: Path) -> Launch | None:
    """launch.json's launch: its first line (the stepd's states may follow it, see `claim_state`),
    or the whole file where that is not one (an agent of before that indented it)."""
    try:
        data = read_file(os.path.join(folder, LAUNCH))
    except OSError:
        return None
    raw: Any = None
    for text in (data.split(b"\n", 1)[0], data):
        try:
            raw = json.loads(text)
            break
        except ValueError:
            continue
    if not isinstance(raw, dict):
        return None
    try:
        return Launch.from_json(raw)
    except (KeyError, TypeError, ValueError):
        return None


def read_state(folder: Path) -> dict[str, Any] | None:
    return read_state_file(folder / STATE)


def read_state_file(path: str | Path) -> dict[str, Any] | None:
    """The state `path` (a state.json) holds, or None when it is missing or holds none yet."""
    try:
        raw = read_file(path)
    except OSError:
        return None
    return last_record(raw)


def read_commands(folder: Path) -> list[dict[str, Any]]:
    return read_commands_file(os.path.join(folder, COMMANDS))


def read_commands_file(path: str) -> list[dict[str, Any]]:
    """The commands in `path` (a commands.json); none when it is missing or not whole."""
    try:
        raw = json.loads(read_file(path))
    except (OSError, ValueError):
        return []
    return [c for c in raw if isinstance(c, dict)] if isinstance(raw, list) else []


def abandon(folder: Path, job_id: str, attempt: int, message: str) -> bool:
    """Claim a folder whose stepd never wrote its state: True if claimed (no rank will ever run)."""
    return create_json(folder / STATE, {"version": STATE_VERSION, "job_id": job_id, "attempt": attempt,
                                        "phase": ABANDONED, "message": message, "ranks": {}, "checkpoints": []})
