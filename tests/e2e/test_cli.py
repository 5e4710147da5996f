"""The `corral` command as a person (or a script) uses it, against a running stack.

Each command is run as a real subprocess with the cluster given by environment variables, and
checked in both forms: the table a person reads and the `--json` a script parses.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from corral.cli.commands.cluster import state_of
from corral.client import Client
from corral.projection import JobState
from corral.readmodel.codec import SCHEMA
from corral.stack.up import Stack
from tests.e2e.conftest import StackFactory, connect, with_queues


def cli_env(stack: Stack) -> dict[str, str]:
    ctx = stack.context
    assert ctx is not None
    return {**os.environ, "CORRAL_NATS_URL": ctx.nats_url, "CORRAL_POSTGRES_DSN": ctx.postgres_dsn,
            "CORRAL_NAMESPACE": ctx.namespace, "COLUMNS": "200", "CORRAL_CONTEXT": "/nonexistent",
            "CORRAL_LOG_DIR": ctx.log_dir or "", "PYTHONUNBUFFERED": "1"}


def corral(stack: Stack, *args: str, stdin: str | None = None, check: bool = True,
           program: str = "corral.cli.entry") -> subprocess.CompletedProcess[str]:
    """`corral ARGS` as the installed program runs it (`corral.cli.entry`: the hot job commands
    without typer), or through typer's app alone (`program="corral.cli.main"`)."""
    proc = subprocess.run([sys.executable, "-m", program, *args], input=stdin, text=True,
                          capture_output=True, env=cli_env(stack), timeout=150)
    if check and proc.returncode != 0:
        raise AssertionError(f"corral {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


_AGE = re.compile(r"(?<=[ \"])\d+[smhd](?=[ \"])")


def same_without_typer(stack: Stack, *args: str) -> None:
    """The fast path (`corral.cli.fast`) prints what typer's command prints, exit code included
    (a few tries: a pending job's priority and age move between two calls)."""
    for _ in range(3):
        fast, typed = (corral(stack, *args, check=False, program=p) for p in ("corral.cli.entry", "corral.cli.main"))
        # a job's age in a table ("5s", "3m") counts from each call's own clock: a loaded machine
        # puts whole seconds between the two processes
        answers = [(p.returncode, _AGE.sub("<age>", p.stdout), p.stderr) for p in (fast, typed)]
        if answers[0] == answers[1]:
            return
    raise AssertionError(f"corral {' '.join(args)}: without typer {answers[0]}, with typer {answers[1]}")


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(proc.stdout)


def write(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text)
    return str(path)


def job_yaml(name: str, queue: str, replicas: int, gpus: int, seconds: float, extra: str = "") -> str:
    return (f"name: {name}\nqueue: {queue}\nreplicas: {replicas}\ngpus_per_replica: {gpus}\n"
            f"runtime: sim\nduration_seconds: {seconds}\n{extra}")


async def wait_state(c: Client, job: str, *states: JobState, timeout: float = 60) -> None:
    await c.wait_for(lambda v: job in v.jobs and v.jobs[job].state in states, timeout)


async def wait_reason(c: Client, job: str, code: str, timeout: float = 60) -> None:
    await c.wait_for(lambda v: job in v.jobs and v.jobs[job].reason is not None
                     and v.jobs[job].reason.code == code, timeout)


async def test_commands_show_tables_and_json_for_a_running_cluster(make_stack: StackFactory, tmp_path: Path) -> None:
    stack = make_stack()
    c = await connect(stack)
    try:
        queues = write(tmp_path, "queues.yaml", "queues:\n  - {name: team-a, guaranteed_gpus: 16}\n"
                                                "  - {name: team-b, guaranteed_gpus: 16}\n")
        applied = as_json(corral(stack, "apply", queues, "--json"))
        assert applied["applied"] == ["team-a", "team-b"]
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 16}, {"name": "team-b", "guaranteed_gpus": 16}], 4)

        spec = write(tmp_path, "job.yaml", job_yaml("train", "team-a", 2, 4, 600))
        job = as_json(corral(stack, "submit", spec, "--json"))["id"]
        await wait_state(c, job, JobState.RUNNING)

        rows = as_json(corral(stack, "jobs", "--json"))
        mine = next(r for r in rows if r["id"] == job)
        assert mine["state"] == "RUNNING" and mine["gpus"] == 8 and mine["queue"] == "team-a"
        table = corral(stack, "jobs").stdout
        assert job in table and "RUNNING" in table and "QUEUE" in table

        shown = as_json(corral(stack, "show", job, "--json"))
        assert sum(len(r["gpus"]) for r in shown["ranks"]) == 8
        assert "placement" in corral(stack, "show", job).stdout
        for args in (("jobs",), ("jobs", "--json"), ("jobs", "-a"), ("show", job), ("show", "--json", job),
                     ("show", "j-none"), ("cancel", "j-none"), ("submit", str(tmp_path / "none.yaml"))):
            same_without_typer(stack, *args)

        nodes = as_json(corral(stack, "nodes", "--json"))
        held = [g for n in nodes for g, j in n["allocations"].items() if j == job]
        assert len(held) == 8 and sum(n["free"] for n in nodes) == 24
        assert "NVLink" in corral(stack, "nodes").stdout

        qs = {q["queue"]: q for q in as_json(corral(stack, "queues", "--json"))}
        assert qs["team-a"]["in_use"] == 8 and qs["team-b"]["in_use"] == 0
        assert "team-a" in corral(stack, "queues").stdout

        events = as_json(corral(stack, "events", "--job", job, "--json"))
        types = [e["type"] for e in events]
        for expected in ("JobSubmitted", "JobAdmitted", "QuotaReserved", "GangReserved", "JobRunning"):
            assert expected in types, types
        assert "GangReserved" in corral(stack, "events", "--job", job).stdout

        trail = as_json(corral(stack, "why", job, "--json"))
        assert [s["event"] for s in trail["trail"]][:2] == ["JobSubmitted", "JobAdmitted"]
        assert "placement" in {s["actor"] for s in trail["trail"]}
        assert "GangReserved" in corral(stack, "why", job).stdout

        logs = corral(stack, "logs", job, "--rank", "0").stdout
        assert "sim rank=0" in logs

        # --wait follows a job to its end; --follow streams the audit log as it grows.
        follower = subprocess.Popen([sys.executable, "-m", "corral.cli.main", "events", "--follow", "--limit", "1"],
                                    env=cli_env(stack), stdout=subprocess.PIPE, text=True)
        quick = write(tmp_path, "quick.yaml", job_yaml("quick", "team-b", 1, 1, 1))
        waited = corral(stack, "submit", quick, "--wait", "--until-done", "--timeout", "120").stdout
        assert "RUNNING" in waited and "COMPLETED" in waited
        assert follower.stdout is not None
        seen = ""
        deadline = time.monotonic() + 60
        while "JobCompleted" not in seen and time.monotonic() < deadline:
            seen += follower.stdout.readline()
        follower.kill()
        assert "JobCompleted" in seen

        cancelled = corral(stack, "cancel", job).stdout  # the fast path: the verdict, as typer's command says it
        assert f"Cancellation of {job} requested and recorded" in cancelled
        await wait_state(c, job, JobState.CANCELLED)
        await c.wait_for(lambda v: not v.jobs[job].holding, 30)
        assert job not in [r["id"] for r in as_json(corral(stack, "jobs", "--json"))]
        assert job in [r["id"] for r in as_json(corral(stack, "jobs", "--all", "--json"))]

        # The services keep the CLI's read model: a stored view of this code that reaches the log's
        # head, and the jobs that are over stored apart (what `jobs --all` just read).
        deadline, stored = time.monotonic() + 30, None
        while time.monotonic() < deadline:
            async with c.store.connection() as conn:
                stored = await conn.fetchval("SELECT position FROM view_snapshots WHERE schema = $1", SCHEMA)
                over = await conn.fetchval("SELECT count(*) FROM view_jobs WHERE schema = $1", SCHEMA)
            if stored == await c.store.head_position() and over:
                break
            await asyncio.sleep(0.5)
        else:
            raise AssertionError(f"no stored view at the log's head (stored at {stored})")
    finally:
        await c.close()


async def test_a_bad_spec_names_each_field_and_publishes_nothing(make_stack: StackFactory, tmp_path: Path) -> None:
    stack = make_stack(cluster="1x8:H100")
    c = await connect(stack)
    try:
        bad = write(tmp_path, "bad.yaml", "name: x\nqueue: default\nreplicas: 0\ngpus_per_replica: 0.5\n"
                                          "topology: {gang: galaxy}\nruntime: sim\nduration_seconds: 5\n")
        proc = corral(stack, "submit", bad, check=False)
        assert proc.returncode == 1
        for field in ("replicas", "gpus_per_replica", "topology.gang"):
            assert field in proc.stderr
        assert "hint" in proc.stderr
        assert await c.events(types=["JobSubmitted"]) == []
        valid = corral(stack, "validate", bad, check=False)
        assert valid.returncode == 1 and "topology.gang" in valid.stderr
    finally:
        await c.close()


def test_a_dead_cluster_is_one_clear_line_and_exit_3(tmp_path: Path) -> None:
    env = {**os.environ, "CORRAL_CONTEXT": "/nonexistent", "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    env.pop("CORRAL_NATS_URL", None)
    env.pop("CORRAL_POSTGRES_DSN", None)
    proc = subprocess.run([sys.executable, "-m", "corral.cli.main", "--nats", "nats://127.0.0.1:1",
                           "--postgres", "postgresql://postgres@127.0.0.1:1/corral", "jobs"],
                          text=True, capture_output=True, env=env, timeout=60, cwd=tmp_path)
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr and "is `corral up` running?" in proc.stderr
    nothing = subprocess.run([sys.executable, "-m", "corral.cli.main", "jobs"], text=True, capture_output=True,
                             env=env, timeout=60, cwd=tmp_path)
    assert nothing.returncode == 3 and "corral up" in nothing.stderr


async def test_why_names_the_blocker_with_numbers(make_stack: StackFactory, tmp_path: Path) -> None:
    stack = make_stack()
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 16}, {"name": "team-b", "guaranteed_gpus": 16},
                              {"name": "small", "guaranteed_gpus": 0, "max_gpus": 8},
                              {"name": "batch", "guaranteed_gpus": 0}], nodes=4)

        def submit(name: str, queue: str, replicas: int, gpus: int, extra: str = "") -> str:
            path = write(tmp_path, f"{name}.yaml", job_yaml(name, queue, replicas, gpus, 600, extra))
            return str(as_json(corral(stack, "submit", path, "--json"))["id"])

        # Quota: queue `small` may hold 8 GPUs at most; a second 8-GPU job waits on that ceiling.
        s1 = submit("s1", "small", 1, 8, "estimated_runtime_seconds: 600\n")
        await wait_state(c, s1, JobState.RUNNING)
        s2 = submit("s2", "small", 1, 8)
        await wait_reason(c, s2, "MAX_GPUS_EXCEEDED")
        why = as_json(corral(stack, "why", s2, "--json"))
        assert why["blocker"]["code"] == "MAX_GPUS_EXCEEDED" and "8" in why["blocker"]["message"]
        assert s1 in why["blocker"]["unblock"]
        assert "MAX_GPUS_EXCEEDED" in corral(stack, "why", s2).stdout

        # Gang size: 16 more GPUs are taken; a 4x8 gang needs 32 with 16 free.
        a1 = submit("a1", "team-a", 2, 8, "estimated_runtime_seconds: 900\n")
        await wait_state(c, a1, JobState.RUNNING)
        gang = submit("gang", "team-b", 4, 8)
        await wait_reason(c, gang, "GANG_DOES_NOT_FIT")
        why = as_json(corral(stack, "why", gang, "--json"))
        assert "32" in why["blocker"]["message"] or "4x8" in why["blocker"]["message"]
        assert "frees" in why["blocker"]["unblock"]

        # Reservation: the gang at the head holds a reservation; a small job that would borrow the
        # reserved GPUs (its queue `batch` guarantees nothing) and has no estimate waits behind it.
        small = submit("tiny", "batch", 1, 4)
        await wait_reason(c, small, "RESERVED_FOR")
        why = as_json(corral(stack, "why", small, "--json"))
        assert gang in why["blocker"]["message"]

        # Topology: 8 ranks inside one NVLink domain, while every node has a GPU taken (same queue as
        # `tiny` and the same priority: nothing to reclaim, no preemption on a tie).
        corral(stack, "cancel", gang)
        await wait_state(c, gang, JobState.CANCELLED)
        await wait_state(c, small, JobState.RUNNING)
        nv = submit("nv", "batch", 8, 1, "topology: {replica: nvlink, gang: nvlink}\n")
        await c.wait_for(lambda v: nv in v.jobs and v.jobs[nv].reason is not None
                         and v.jobs[nv].state is JobState.PENDING, 60)
        why = as_json(corral(stack, "why", nv, "--json"))
        assert "nvlink" in (why["blocker"]["message"] + (why["blocker"]["unblock"] or "")).lower(), why["blocker"]
    finally:
        await c.close()


async def test_replay_until_a_moment_matches_the_state_seen_live_then(make_stack: StackFactory) -> None:
    stack = make_stack(cluster="2x8:H100")
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 16}], nodes=2)
        from corral.contracts.jobspec import validate_job_spec

        def spec(gpus: int, seconds: float) -> Any:
            return validate_job_spec({"name": "r", "queue": "team-a", "gpus_per_replica": gpus,
                                      "runtime": "sim", "duration_seconds": seconds})

        moments: list[tuple[datetime, dict[str, Any]]] = []

        async def snapshot() -> None:
            await asyncio.sleep(0.3)  # let in-flight appends land; the moment is taken after them
            view = await c.view()
            moments.append((datetime.now(UTC), state_of(view)))
            await asyncio.sleep(0.05)

        j1 = await c.submit(spec(8, 600))
        await wait_state(c, j1, JobState.RUNNING)
        await snapshot()
        j2 = await c.submit(spec(8, 2))
        await wait_state(c, j2, JobState.COMPLETED)
        await snapshot()
        await c.cancel(j1)
        await c.wait_for(lambda v: not v.jobs[j1].holding, 30)
        await snapshot()
        for at, live in moments:
            replayed = as_json(corral(stack, "replay", "--until", at.isoformat(), "--json"))
            assert replayed["jobs"] == live["jobs"], at
            assert replayed["nodes"] == live["nodes"], at
        now = as_json(corral(stack, "replay", "--until", "now", "--json"))
        assert now["jobs"] == state_of(await c.view())["jobs"]
        assert "Cluster as of" in corral(stack, "replay", "--until", "now").stdout

        # What-if on this history: the recorded submissions replayed by the simulator.
        out = Path(stack.options.data_dir) / "whatif.json"
        table = corral(stack, "sim", "--from-log", "--policy", "fifo", "--json", str(out)).stdout
        assert "avg JCT" in table
        replayed_jobs = json.loads(out.read_text())["jobs"]
        assert sorted(j["id"] for j in replayed_jobs) == sorted([j1, j2])
    finally:
        await c.close()
