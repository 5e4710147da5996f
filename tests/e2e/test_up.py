"""`corral up` as a newcomer runs it: from nothing, with its own servers, and again on the same data."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from corral.client import Client
from corral.contracts.jobspec import validate_job_spec
from corral.stack.context import Context
from tests.metrics_text import get


def start_up(data_dir: Path, home: Path, *extra: str) -> tuple[subprocess.Popen[str], dict[str, Any], float]:
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home), "COLUMNS": "200"}
    for var in ("CORRAL_NATS_URL", "CORRAL_POSTGRES_DSN", "CORRAL_NAMESPACE", "CORRAL_CONTEXT"):
        env.pop(var, None)
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "corral.cli.main", "up", "--data-dir", str(data_dir), "--json",
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=home)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.rstrip() == "}":
            break
    if not lines or lines[-1].rstrip() != "}":
        proc.kill()
        errors = proc.stderr.read() if proc.stderr else ""
        raise AssertionError(f"corral up printed no status:\n{''.join(lines)}\n{errors}")
    return proc, json.loads("".join(lines)), time.monotonic() - began


def stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGINT)
    return proc.wait(60)


def test_up_starts_from_nothing_registers_nodes_and_a_restart_keeps_state(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, status, seconds = start_up(data, tmp_path)
    try:
        print(f"corral up on a fresh data dir was ready in {seconds:.1f}s (reported {status['started_in_seconds']}s)")
        assert [n["name"] for n in status["nodes"]] == ["node-0", "node-1", "node-2", "node-3"]
        assert all(n["gpus"] == 8 and n["model"] == "H100" for n in status["nodes"])
        assert {p["name"] for p in status["processes"]} >= {"admission", "quota", "placement", "preemption",
                                                             "node-agents"}
        saved = json.loads((data / "context.json").read_text())
        assert not (tmp_path / "corral" / "context.json").exists(), "no account-wide context"
        assert saved["nats_url"] == status["nats"]
        # the saved context carries the admin's NATS credentials (an anonymous client cannot connect)
        ctx = Context.load(data / "context.json")
        assert (ctx.nats_url, ctx.postgres_dsn) == (status["nats"], status["postgres"])
        # ... and the CA its NATS is verified with (TLS on by default, corral.stack.tls)
        assert ctx.nats_url.startswith("tls://") and ctx.nats_ca == status["nats_ca"] == str(data / "tls" / "ca.pem")
        ca = (data / "tls" / "ca.pem").read_bytes()
        # every process's /metrics, /healthz, /readyz: printed, in the context, as Prometheus targets
        endpoints = {p["name"]: p["metrics"] for p in status["processes"]}
        assert ctx.metrics == endpoints and all(url.startswith("http://127.0.0.1:") for url in endpoints.values())
        targets = json.loads((data / "telemetry" / "targets.json").read_text())
        assert sorted(t["targets"][0] for t in targets) == sorted(u.removeprefix("http://") for u in endpoints.values())
        assert get(endpoints["admission"] + "/healthz")[0] == 200

        async def submit() -> str:
            async with await Client.connect(ctx) as c:
                job = await c.submit(validate_job_spec({"name": "keep", "queue": "default", "runtime": "sim",
                                                        "duration_seconds": 1, "gpus_per_replica": 2}))
                await c.wait_for(lambda v: job in v.jobs and v.jobs[job].state.terminal, 60)
                return job

        job = asyncio.run(submit())
    finally:
        assert stop(proc) == 0

    proc, status, _ = start_up(data, tmp_path)
    try:
        assert len(status["nodes"]) == 4
        # the saved context carries the admin's NATS credentials (an anonymous client cannot connect)
        ctx = Context.load(data / "context.json")
        assert (ctx.nats_url, ctx.postgres_dsn) == (status["nats"], status["postgres"])
        assert (data / "tls" / "ca.pem").read_bytes() == ca, "a restart keeps the CA (copied CAs stay valid)"
        # a port another process took between the stop and the restart is said to have moved
        moved = {name.removeprefix("metrics:") for name in status["ports_moved"]}
        kept = {n: u for n, u in endpoints.items() if n not in moved}
        assert {n: u for n, u in ctx.metrics.items() if n not in moved} == kept, \
            "a restart keeps the endpoints' ports (when still free)"
        assert all(endpoints[n] != ctx.metrics[n] for n in moved if n in endpoints)

        async def check() -> None:
            async with await Client.connect(ctx) as c:
                view = await c.view()
                assert view.jobs[job].state.value == "COMPLETED"
                registrations = await c.events(types=["NodeRegistered"])
                assert len(registrations) == 4, "a restart re-registers nothing that did not change"

        asyncio.run(check())
    finally:
        assert stop(proc) == 0
