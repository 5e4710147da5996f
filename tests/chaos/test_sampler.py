"""The chaos run's GPU sampler (bench/chaos.py) sees worker processes through /proc and reports two
jobs' processes on one GPU; checked with two real processes that look like workers."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"


def _chaos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("corral_bench_chaos", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _fake_worker(nodes: Path, node: str, job: str, gpus: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CORRAL_JOB_ID": job, "CUDA_VISIBLE_DEVICES": gpus,
           "CORRAL_CONTROL": str(nodes / node / "run" / job / "attempt-1" / "rank-0.control")}
    # it lives until it is killed: no clock
    return subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"], env=env)


def test_the_sampler_finds_two_jobs_on_one_gpu(tmp_path: Path) -> None:
    chaos = _chaos()
    nodes = tmp_path / "nodes"
    procs = [_fake_worker(nodes, "node-3", "job-a", "0,1"), _fake_worker(nodes, "node-3", "job-b", "1,2"),
             _fake_worker(nodes, "node-4", "job-c", "1")]
    try:
        deadline = time.monotonic() + 10
        while len(chaos.live_workers(nodes)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        seen = {(w.job_id, w.node, w.gpus) for w in chaos.live_workers(nodes)}
        assert seen == {("job-a", "node-3", (0, 1)), ("job-b", "node-3", (1, 2)), ("job-c", "node-4", (1,))}
        sampler = chaos.Sampler(nodes, interval=0.05)
        import threading

        thread = threading.Thread(target=sampler.run)
        thread.start()
        time.sleep(0.3)
        sampler.stop()
        thread.join(5)
        assert [(i["node"], i["gpu"], i["jobs"]) for i in sampler.incidents.values()] == [
            ("node-3", 1, ["job-a", "job-b"])]
        assert chaos.live_workers(tmp_path / "elsewhere") == []
    finally:
        for p in procs:
            p.kill()
            p.wait()
