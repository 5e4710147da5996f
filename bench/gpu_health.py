"""How soon a GPU gone bad is reported: the node agent's NVML watcher on the fake libnvidia-ml.so.1.

The target: within one heartbeat (2 s by default), so that placement stops placing on the GPU
before the next heartbeat could have told it anything. The watcher (services/node_agent/host/gpu_health.py)
runs as in the agent, in a process of its own that loads the fake (tests/fakenvml, built here with
the machine's C compiler) through pynvml's own search; faults are written into the fake's file in
turn (double-bit ECC errors and a GPU fallen off the bus, each cleared again, and two critical
XIDs, which stay), and each is timed from the file's replacement to the watcher's
callback (its clock and ours are the same host's). The agent publishes the report from that
callback; the e2e test (tests/e2e/test_gpu_health.py) prints the whole way to the log.

Run: .venv/bin/python bench/gpu_health.py [--faults 60] [--poll 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from live import machine_line, percentile  # noqa: E402

from tests.fakenvml import FakeGpu, FakeNvml, build  # noqa: E402

WATCH = """
import json, sys, time
from corral.services.node_agent.host.gpu_health import NvmlWatcher
def said(problems):
    print(json.dumps({"at": time.time(), "unhealthy": [[p.gpu, p.code] for p in problems]}), flush=True)
w = NvmlWatcher(said, poll_seconds=float(sys.argv[1]))
w.start()
print(json.dumps({"started": True}), flush=True)
sys.stdin.readline()
w.stop()
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=60, help="faults injected, in turn (default 60)")
    parser.add_argument("--poll", type=float, default=1.0, help="the watcher's poll period, s (default 1.0, the "
                        "agent's with its default 2 s heartbeat)")
    parser.add_argument("--smoke", action="store_true", help="the test suite's size (3 faults): checks the script")
    args = parser.parse_args()
    if args.smoke:
        args.faults = 3
    print(f"machine: {machine_line()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="corral-bench-nvml-") as tmp:
        fake = FakeNvml(build(Path(tmp) / "lib"), Path(tmp) / "nvml.conf")
        fake.write([FakeGpu() for _ in range(8)])
        proc = subprocess.Popen([sys.executable, "-c", WATCH, str(args.poll)], env={**os.environ, **fake.env()},
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        lines: queue.Queue[dict[str, object]] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(json.loads(line)) for line in proc.stdout or ()],
                         daemon=True).start()
        try:
            lines.get(timeout=60)
            latencies: dict[str, list[float]] = {"XID": [], "ECC_DOUBLE_BIT": [], "GPU_LOST": []}
            xids = 0
            for n in range(args.faults):
                # an XID stays (its GPU's gravest problem from then on): one each on GPUs 6 and 7;
                # the ECC errors and the losses, which clear, go round GPUs 0-5
                kind = ("ECC_DOUBLE_BIT", "GPU_LOST", "XID")[n % 3]
                if kind == "XID" and xids == 2:
                    kind = ("ECC_DOUBLE_BIT", "GPU_LOST")[n % 2]
                gpu = 6 + xids if kind == "XID" else n % 6
                xids += kind == "XID"
                for inject in (True, False):
                    if not inject and kind == "XID":
                        break
                    began = time.time()
                    if kind == "XID":
                        fake.add_xid(gpu, 79)
                    elif kind == "ECC_DOUBLE_BIT":
                        fake.change(gpu, ecc_dbe=1 if inject else 0)
                    else:
                        fake.change(gpu, lost=inject)
                    said = lines.get(timeout=30)
                    if inject:
                        latencies[kind].append(float(said["at"]) - began)  # type: ignore[arg-type]
                time.sleep(0.05)
        finally:
            if proc.stdin:
                proc.stdin.close()
            proc.wait(10)
    every = sorted(x for xs in latencies.values() for x in xs)
    print(f"{len(every)} faults, poll {args.poll:g} s: fault -> report p50 {percentile(every, 50) * 1000:.0f} ms, "
          f"p90 {percentile(every, 90) * 1000:.0f} ms, max {every[-1] * 1000:.0f} ms (target: one heartbeat, 2 s)")
    for kind, xs in latencies.items():
        if xs:
            xs.sort()
            print(f"  {kind:<15} {len(xs):>3} faults  p50 {percentile(xs, 50) * 1000:.0f} ms  "
                  f"max {xs[-1] * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
