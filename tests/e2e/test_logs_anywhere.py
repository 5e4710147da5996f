"""`corral logs` from a machine that did not run the job: the node agents publish rank output to
the bus.

The CLI runs in a folder of its own with only the cluster's NATS address: no context, no Postgres
DSN, no log directory, so the rank files of the agents cannot be what it prints. One stack serves
every check: a running rank's lines streamed with `--follow`, the two attempts of a job that
crashed once kept apart, and a forged message on the log stream skipped with a note.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nats

from corral.contracts.logs import log_subject
from corral.projection import JobState
from corral.stack.up import Stack
from tests.e2e.conftest import StackFactory, connect, with_queues


def _env(stack: Stack) -> dict[str, str]:
    ctx = stack.context
    assert ctx is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    return {**env, "CORRAL_NATS_URL": ctx.nats_url, "CORRAL_NAMESPACE": ctx.namespace,
            "CORRAL_CONTEXT": "/nonexistent", "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}


def _logs(stack: Stack, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corral.cli.main", "logs", *args], cwd=cwd, env=_env(stack),
                          text=True, capture_output=True, timeout=60)


def _entries(stack: Stack, cwd: Path, job: str, *args: str) -> list[dict[str, Any]]:
    proc = _logs(stack, cwd, job, "--json", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    entries: list[dict[str, Any]] = json.loads(proc.stdout)
    return entries


def _lines(entries: list[dict[str, Any]]) -> list[str]:
    return [line for entry in entries for line in entry["lines"]]


def _spec(name: str, seconds: float, replicas: int = 1, extra: str = "") -> str:
    return (f'{{"name": "{name}", "queue": "team-a", "replicas": {replicas}, "gpus_per_replica": 1, '
            f'"runtime": "sim", "duration_seconds": {seconds}{extra}}}')


async def test_logs_stream_from_a_folder_without_the_files_and_keep_attempts_apart(
        make_stack: StackFactory, tmp_path: Path) -> None:
    stack = make_stack(cluster="2x4:H100")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    c = await connect(stack)
    follower: subprocess.Popen[str] | None = None
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 8}], nodes=2)
        from corral.cli.jobs import read_spec

        long_file = tmp_path / "long.json"
        long_file.write_text(_spec("long", 60, replicas=2))
        crash_file = tmp_path / "crash.json"
        crash_file.write_text(_spec("crash", 1.0, extra=', "restart": {"max_restarts": 1}, '
                                                        '"env": {"CORRAL_SIM_ARGS": "--fail-at-step 3"}'))
        long_job = await c.submit(read_spec(str(long_file)))
        crash_job = await c.submit(read_spec(str(crash_file)))

        # --follow streams a running rank's lines as they are written (10 a second).
        follower = subprocess.Popen([sys.executable, "-m", "corral.cli.main", "logs", long_job, "--rank", "1",
                                     "--follow"], cwd=elsewhere, env=_env(stack), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        assert follower.stdout is not None
        steps: list[tuple[float, int]] = []  # (when it arrived, its step)
        deadline = time.monotonic() + 30
        while (not steps or steps[-1][0] - steps[0][0] < 1.5) and time.monotonic() < deadline:
            line = follower.stdout.readline()
            if line.startswith("sim rank=1 step="):
                steps.append((time.monotonic(), int(line.split("=")[-1])))
        # the history first, then lines as they are written (10 a second) for more than a second
        assert steps and steps[-1][0] - steps[0][0] >= 1.5, steps
        numbers = [n for _, n in steps]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))  # every line, in order
        follower.terminate()
        follower.wait(10)

        # The job that crashed at step 3 and ran again: each attempt's lines apart.
        await c.wait_for(lambda v: crash_job in v.jobs and v.jobs[crash_job].state is JobState.COMPLETED, 30)
        deadline = time.monotonic() + 10
        entries = _entries(stack, elsewhere, crash_job, "--attempt", "0")
        first = _lines(entries)
        second = _lines(_entries(stack, elsewhere, crash_job, "--attempt", "1"))
        while not any("done" in x for x in second) and time.monotonic() < deadline:
            time.sleep(0.3)  # the last chunk may land a moment after the job completed
            second = _lines(_entries(stack, elsewhere, crash_job, "--attempt", "1"))
        assert any("attempt=0 start" in x for x in first) and any("crashing at step=3" in x for x in first)
        assert not any("attempt=1" in x for x in first), first
        assert any("attempt=1 start" in x for x in second) and any("done step=10" in x for x in second)
        assert not any("crashing" in x for x in second), second
        assert first[0].startswith(f"==== corral job {crash_job} attempt 0 rank 0")
        # A forged message on the log stream (here: a superuser's; agents cannot, see
        # test_security) is skipped with a note, and the job's real lines still show.
        assert stack.context is not None
        bus = await nats.connect(stack.context.nats_url)
        try:
            js = bus.jetstream()
            await js.publish(log_subject(stack.context.namespace, crash_job, 0, entries[0]["node"], 0), b"not a chunk")
        finally:
            await bus.close()
        shown = _logs(stack, elsewhere, crash_job)
        assert shown.returncode == 0 and "crashing at step=3" in shown.stdout
        assert "attempt 0 · rank 0" in shown.stdout and "attempt 1 · rank 0" in shown.stdout
        assert "skipped a message on the log stream" in shown.stderr and "not JSON" in shown.stderr

        missing = _logs(stack, elsewhere, "no-such-job")
        assert missing.returncode == 1 and "no logs for job 'no-such-job'" in missing.stderr
        assert not (elsewhere / ".corral").exists()
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()
        await c.close()
