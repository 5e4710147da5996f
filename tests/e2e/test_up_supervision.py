"""`corral up` keeps the system running and stops it cleanly.

Ctrl-C must not fail the running jobs (`FAILED WORKER_FAILED: rank 0 was killed; no restarts
left`), and placement places nothing during the shutdown; a dead Postgres or nats-server is
restarted (no zombies; no "postmaster.pid already exists"); a crashing service is restarted with
a backoff; a second `corral up` in the same folder says so instead of a Postgres log dump.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.client import Client
from corral.contracts.jobspec import validate_job_spec
from corral.projection import JobState
from corral.stack.context import Context
from corral.stack.servers import PostgresServer, process_state
from tests.e2e.conftest import handled
from tests.e2e.test_up import start_up


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A directory outside pytest's basetemp: pytest resets `pytest-of-<user>` to mode 0700 when
    another session starts, and the embedded Postgres (run as its own user under root) must
    traverse to its data directory for the whole test."""
    path = Path(tempfile.mkdtemp(prefix="corral-up-test-"))
    path.chmod(0o755)
    yield path
    kill_left_workers(path)
    shutil.rmtree(path, ignore_errors=True)


def kill_left_workers(under: Path) -> None:
    """`corral up` leaves workers running when it stops (the next one adopts them): a test's stepds
    and ranks, found by the data directory in their command line or environment, end with it."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            seen = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:
            continue
        if str(under).encode() in seen and int(proc.name) != os.getpid():
            with contextlib.suppress(OSError):
                os.kill(int(proc.name), signal.SIGKILL)


def context_of(status: dict[str, Any]) -> Context:
    """The context `corral up` saved: it carries the admin's NATS credentials (no anonymous client)."""
    return Context.load(Path(status["data_dir"]) / "context.json")


def pid_of(status: dict[str, Any], name: str) -> int:
    return next(int(p["pid"]) for p in [*status["processes"], *status.get("servers", [])] if p["name"] == name)


def interrupt(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=90)
    return proc.returncode, err


def test_a_second_up_in_the_same_folder_says_already_running(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, _, _ = start_up(data, tmp_path, "--runtime", "sim")
    try:
        env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path), "COLUMNS": "200"}
        second = subprocess.run([sys.executable, "-m", "corral.cli.main", "up", "--data-dir", str(data)],
                                capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
        assert second.returncode != 0
        assert f"Already running (pid {proc.pid})" in second.stderr, second.stderr
        assert "postmaster" not in second.stderr and "LOG:" not in second.stderr
    finally:
        code, _ = interrupt(proc)
        assert code == 0


class Said:
    """What `corral up` writes to stderr, read as it comes (`interrupt` reads it only at the end)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        stdout, stderr = proc.stdout, proc.stderr
        assert stdout is not None and stderr is not None
        self.proc, self.lines = proc, list[str]()
        self._reader = threading.Thread(target=lambda: self.lines.extend(iter(stderr.readline, "")), daemon=True)
        self._reader.start()
        threading.Thread(target=stdout.read, daemon=True).start()  # nothing more is expected there; never block on it

    def count(self, prefix: str) -> int:
        return sum(1 for line in list(self.lines) if line.startswith(prefix))

    def interrupt(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(90)
        self._reader.join(10)
        return self.proc.returncode, "".join(self.lines)


def test_up_restarts_dead_servers_and_a_crash_looping_service_with_backoff(tmp_path: Path) -> None:
    proc, status, _ = start_up(tmp_path / "data", tmp_path, "--runtime", "sim")
    said = Said(proc)
    ctx = context_of(status)
    try:
        for server in ("postgres", "nats"):
            os.kill(pid_of(status, server), signal.SIGKILL)

        async def admitted_again() -> None:
            deadline = time.monotonic() + 60
            while True:
                try:
                    async with await Client.connect(ctx, timeout=2.0) as c:
                        job = await c.submit(validate_job_spec({"name": "after", "queue": "default", "runtime": "sim",
                                                                "duration_seconds": 1}))
                        assert await c.verdict(job, 30) is not None
                        return
                except (OSError, TimeoutError, ConnectionError, AssertionError):
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)
                except Exception as exc:  # asyncpg / nats errors while the servers come back
                    if time.monotonic() > deadline or not type(exc).__module__.startswith(("nats", "asyncpg")):
                        raise
                    await asyncio.sleep(0.5)

        asyncio.run(admitted_again())

        # placement may have crashed (and been restarted) during the outage: kill the current one
        placement = _recorded_pid(tmp_path / "data", "placement") or pid_of(status, "placement")
        kills = 0
        while kills < 4:  # a crash loop: killed each time it is back
            exits = said.count("placement exited")
            with contextlib.suppress(ProcessLookupError):  # it may have crashed on its own meanwhile
                os.kill(placement, signal.SIGKILL)
                kills += 1
            deadline = time.monotonic() + 30
            if kills == 4:  # the last restart is not waited for: its delay is in "placement exited ... in Ns"
                while said.count("placement exited") == exits:
                    assert time.monotonic() < deadline, "placement's death was not noticed"
                    time.sleep(0.05)
                break
            while (fresh := _recorded_pid(tmp_path / "data", "placement")) in (None, placement):
                assert time.monotonic() < deadline, "placement was not restarted"
                time.sleep(0.05)
            assert fresh is not None
            placement = fresh
    finally:
        code, err = said.interrupt()
    assert code == 0, err
    assert "postgres exited" in err and "postgres restarted" in err, err
    assert "nats exited" in err and "nats restarted" in err, err
    delays = [float(line.rsplit(" in ", 1)[1].rstrip("s")) for line in err.splitlines()
              if line.startswith("placement exited")]
    assert len(delays) >= 4 and all(b == min(30.0, 2 * a) for a, b in itertools.pairwise(delays)), err


def _recorded_pid(data: Path, name: str) -> int | None:
    """The pid `corral up` recorded for `name` (it rewrites pids.json on every restart)."""
    try:
        return int(json.loads((data / "pids.json").read_text())[name]["pid"])
    except (OSError, ValueError, KeyError):
        return None


async def run_long_job(ctx: Context) -> str:
    """A 600 s job holding a whole node, once it runs."""
    async with await Client.connect(ctx) as c:
        job = await c.submit(validate_job_spec({"name": "long", "queue": "default", "runtime": "sim",
                                                "duration_seconds": 600, "gpus_per_replica": 8}))
        await c.wait_for(lambda v: job in v.jobs and v.jobs[job].state is JobState.RUNNING, 60)
        return job


def test_ctrl_c_stops_deciders_first_and_leaves_jobs_as_they_are(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, status, _ = start_up(data, tmp_path, "--runtime", "sim")
    ctx = context_of(status)

    try:
        job = asyncio.run(run_long_job(ctx))
    finally:
        code, err = interrupt(proc)
    assert code == 0, err
    stopped = [line.removeprefix("stopped ") for line in err.splitlines() if line.startswith("stopped ")]
    assert stopped.index("node-agents") > max(stopped.index(n) for n in ("placement", "placement-standby",
                                                                          "preemption", "quota", "admission"))
    assert stopped[-2:] == ["nats", "postgres"], stopped

    # The log as the shutdown left it, read with Postgres alone (no service may act on it first).
    postgres = PostgresServer(data / "postgres").start()
    try:
        async def as_left() -> Any:
            ctx = Context(nats_url="nats://127.0.0.1:1", postgres_dsn=postgres.dsn, namespace=status["namespace"])
            async with await Client.connect(ctx, bus=False) as c:
                return (await c.view()).jobs[job]

        left = asyncio.run(as_left())
    finally:
        postgres.stop()
    assert left.state is JobState.RUNNING and left.holding, left


def test_the_next_up_continues_the_jobs_of_a_ctrl_c(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, status, _ = start_up(data, tmp_path, "--runtime", "sim")
    ctx = context_of(status)

    try:
        job = asyncio.run(run_long_job(ctx))
    finally:
        interrupt(proc)
    proc, status, _ = start_up(data, tmp_path, "--runtime", "sim")
    ctx = context_of(status)

    async def continued() -> None:
        async with await Client.connect(ctx) as c:
            # The next up's agents adopt the job's stepd; then every report (one the stop made, one
            # the adopting agent made) is handled once its consumers are done.
            agents_log = data / "logs" / "node-agents.log"
            deadline = time.monotonic() + 60
            while f"adopted {job} attempt" not in agents_log.read_text(errors="replace"):
                assert time.monotonic() < deadline, "the next up's agents adopted nothing"
                await asyncio.sleep(0.2)
            await handled(c.bus)
            view = await c.view()
            assert view.jobs[job].state is JobState.RUNNING, view.jobs[job]

    try:
        asyncio.run(continued())
    finally:
        interrupt(proc)


def test_an_up_killed_with_kill_9_leaves_nothing_the_next_up_trips_on(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, status, _ = start_up(data, tmp_path, "--runtime", "sim")
    left = {p["name"]: int(p["pid"]) for p in [*status["processes"], *status["servers"]]}
    proc.kill()  # its children (own sessions) keep running: servers on the data directory included
    proc.wait(10)
    assert all(process_state(pid) not in (None, "Z") for pid in left.values())
    proc, status, _ = start_up(data, tmp_path, "--runtime", "sim")
    try:
        gone = {name: process_state(pid) for name, pid in left.items()}
        assert all(state in (None, "Z") for state in gone.values()), gone
        assert len(status["nodes"]) == 4
    finally:
        code, err = interrupt(proc)
    assert code == 0, err
