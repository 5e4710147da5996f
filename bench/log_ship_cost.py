"""What shipping a rank's output costs the node agent, per rank: `python bench/log_ship_cost.py`.

Drives the real `LogShipper` against a nats-server over TLS (as `corral up` runs it): rounds of
`--at-once` ranks that start together, write a header and a line, are looked at once while they
run (one chunk each) and end together with one more line (the final chunk), as the ranks of a
node's gangs do under the shared state poller. The rank files and attempt folders are made before
the CPU is counted (the supervisor's and the ranks' part). Prints per rank the CPU of this process (the
agent's part: reading, chunking, publishing, the cursor saves) and of nats-server, with the chunks
published in batches (`Bus.publish_many`) and each alone (`Bus.publish`), alternating `--rounds`
times. CPU from getrusage and /proc/<pid>/stat, so a loaded machine shows up as spread.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench.machine_probe import probe_line
from corral.bus import Bus, Outgoing
from corral.services.node_agent.reporting.log_chunks import ShipLimits
from corral.services.node_agent.reporting.log_shipper import LogShipper, RankKey
from corral.stack import tls
from corral.stack.servers import NatsServer

TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """utime + stime of one process (nats-server), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def one_mode(bus: Bus, root: Path, server_pid: int, ranks: int, at_once: int, batched: bool,
                   tag: str) -> tuple[float, float]:
    async def publish(subject: str, data: bytes, msg_id: str) -> None:
        await bus.publish(subject, data, msg_id, timeout=5.0)

    async def publish_many(messages: Sequence[Outgoing]) -> None:
        await bus.publish_many(messages, timeout=5.0)

    poll = 0.2
    shipper = LogShipper(publish, bus.names.name, publish_many=publish_many if batched else None,
                         limits=ShipLimits(), poll=poll)
    groups = []
    for start in range(0, ranks, at_once):  # the files and attempt folders (the supervisor's part) first
        keys = [RankKey(f"{tag}{n}", 0, "node-0", 0) for n in range(start, min(ranks, start + at_once))]
        paths = {}
        for key in keys:
            path = root / "logs" / key.job_id / "rank-0.log"
            path.parent.mkdir(parents=True)
            (root / "state" / f"{key.job_id}.attempt-0").mkdir(parents=True)
            path.write_bytes(f"==== corral job {key.job_id} attempt 0 rank 0 node_rank 0 started now ====\n"
                             "step 1\n".encode())
            paths[key] = path
        groups.append(paths)
    cpu = server = 0.0
    for paths in groups:
        cpu0, server0 = time.process_time(), process_cpu(server_pid)
        for key, path in paths.items():
            shipper.follow(key, path, root / "state")
        await asyncio.sleep(poll * 1.5)  # each rank's first look: one chunk
        cpu, server = cpu + time.process_time() - cpu0, server + process_cpu(server_pid) - server0
        for path in paths.values():
            with path.open("ab") as f:
                f.write(b"done\n==== exited with code 0 ====\n")
        cpu0, server0 = time.process_time(), process_cpu(server_pid)
        done = await asyncio.gather(*(shipper.drain(key, path, root / "state", 10.0) for key, path in paths.items()))
        cpu, server = cpu + time.process_time() - cpu0, server + process_cpu(server_pid) - server0
        assert all(done), "a rank's last chunk was not published"
    await shipper.close()
    return 1e3 * cpu / ranks, 1e3 * server / ranks


async def measure(url: str, ca: str, server_pid: int, args: argparse.Namespace, root: Path) -> None:
    bus = await Bus.connect(url, "bench", ca=ca)
    try:
        await bus.ensure_streams()
        print(f"{'mode':<10} {'agent ms/rank':>14} {'nats-server ms/rank':>20}")
        for r in range(args.rounds):
            for batched in (False, True):
                tag = f"r{r}{'b' if batched else 'a'}-"
                agent, server = await one_mode(bus, root / tag, server_pid, args.ranks, args.at_once, batched, tag)
                print(f"{'batched' if batched else 'alone':<10} {agent:>14.3f} {server:>20.3f}", flush=True)
    finally:
        await bus.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=400, help="ranks per mode and round")
    parser.add_argument("--at-once", type=int, default=40, help="ranks that start and end together")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="a tiny run (seconds) checking the script end to end")
    args = parser.parse_args(argv)
    if args.smoke:
        args.ranks, args.at_once, args.rounds = 8, 4, 1
    print(probe_line())
    root = Path(tempfile.mkdtemp(prefix="corral-bench-logship-"))
    files = tls.generate(root / "tls")
    server = NatsServer(data_dir=root / "nats", tls=files.server_block()).start()
    try:
        assert server.proc is not None
        asyncio.run(measure(server.url, str(files.ca), server.proc.pid, args, root))
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
