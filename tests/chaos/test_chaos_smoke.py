"""The short chaos run (bench/chaos.py --smoke, about 2 minutes): 16x8 simulated GPUs under kill -9,
SIGSTOP, nats-server and Postgres restarts; then `corral audit verify` passes, no accepted job is
lost or stuck, and no GPU ever had two jobs' processes. The long run is `bench/chaos.py --minutes 20`.

A fixed seed keeps the fault schedule and the jobs the same from run to run; only timing varies.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"


def test_chaos_smoke_keeps_every_promise(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    res = subprocess.run([sys.executable, str(BENCH), "--smoke", "--seed", "11", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert out.exists(), res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads(out.read_text())
    summary = {k: result[k] for k in ("seed", "faults_injected", "accepted_jobs", "final_states", "lost", "stuck",
                                      "gpu_double_use", "audit_ok")}
    assert result["accepted_jobs"] > 0, summary
    assert result["audit_ok"], (summary, result["audit"].get("violations_by_invariant"),
                                result["audit"].get("first_violation"), result["audit"].get("error"))
    assert result["lost"] == 0, (summary, result["lost_jobs"])
    assert result["stuck"] == 0, (summary, result["stuck_jobs"])
    assert result["gpu_double_use"] == 0, (summary, result["gpu_double_use_incidents"])
