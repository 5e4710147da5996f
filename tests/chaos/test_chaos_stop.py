"""A chaos run that is stopped (SIGTERM, as `timeout` sends) stops everything it started.

Why: a `bench/chaos.py --minutes 5` cut short by `timeout 900` must not leave its nats-server, its
Postgres, the node agents or a worker's step daemon running, on ports and in a temporary directory
nobody looks at again: SIGTERM goes through the run's clean-up as Ctrl-C does.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"


def _chaos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("corral_bench_chaos_stop", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def running_under(root: Path) -> list[str]:
    """Command lines of the processes that name `root` (the run's temporary directory) in their
    command line or environment: the services name it only in theirs (TMPDIR, the log directory)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = (Path("/proc") / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = (Path("/proc") / pid / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(root) in cmd or str(root) in env:
            out.append(f"{pid}: {cmd[:160]}")
    return out


def test_a_chaos_run_stopped_with_sigterm_leaves_nothing_running() -> None:
    # a short directory: Postgres's socket path must fit in 107 bytes (pytest's tmp_path does not)
    tmp_path = Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp"))
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, str(BENCH), "--smoke", "--seed", "5"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("corral-chaos-*/stack/pids.json")):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the chaos run did not start its stack: {proc.communicate()[0][-2000:]}")
            time.sleep(0.5)
        while not any("corral.services.placement" in line for line in running_under(tmp_path)):
            if proc.poll() is not None or time.monotonic() > deadline:  # the services are up: stop it now
                raise AssertionError(f"the chaos run did not start its services: {proc.communicate()[0][-2000:]}")
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 10
    while (left := running_under(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for line in left:  # never leave them behind, even when the assertion fails
        os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)
    assert not left, "\n".join(left) + "\n" + out[-2000:]
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_the_stack_is_stopped_even_when_the_interrupt_leaves_the_run_pending(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The CI's run of the test above: the SIGTERM's KeyboardInterrupt was raised inside a NATS
    client's task, asyncio.run ended with the run's own task still pending ("Task was destroyed
    but it is pending!"), its clean-up never ran, and nats-server and Postgres stayed up. Whatever
    asyncio leaves undone, main stops the stack."""
    chaos = _chaos()
    stopped: list[bool] = []

    interrupting: list[asyncio.Task[None]] = []

    async def interrupted(*args: object) -> dict[str, object]:
        async def connect() -> None:
            raise KeyboardInterrupt  # as a signal handler raises it inside a task's step
        interrupting.append(asyncio.get_running_loop().create_task(connect()))
        await asyncio.Event().wait()  # the run's task: never finishes, never sees the interrupt
        return {}

    monkeypatch.setattr(chaos, "run", interrupted)
    monkeypatch.setattr(chaos.Chaos, "stop", lambda self: stopped.append(True))
    monkeypatch.setattr(chaos.tempfile, "mkdtemp", lambda prefix: str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        chaos.main(["--smoke", "--seed", "1"])
    assert stopped, "the stack was not stopped"
    # Retrieved here: else asyncio logs "Task exception was never retrieved" and the whole
    # traceback when the task is collected, a false alarm in every run of the suite.
    assert isinstance(interrupting[0].exception(), KeyboardInterrupt)
