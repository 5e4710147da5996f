"""What one event costs on the bus: CPU per message published and per message delivered.

Why: the live stack's CPU per job is spread over every process (bench/e2e.py), and what is left
is per message: a job makes 12 events, the relay publishes each, and each is delivered to three
to five services, which decode, fold and acknowledge it. This measures the bus's own part of a
message, with nothing done by the handler, on the same nats-server, TLS and consumer settings
as the services (`corral.services.run_loop`: batch 256, events_linger 20 ms, an ack per message,
the last of a batch confirmed): what any change to `corral.bus` moves.

Prints CPU per message (microseconds) for: publishing (the relay's chained batches of `--batch`,
each message acknowledged, `Bus.publish_many`, and only the last, `Bus.publish_acked_by_last`
as the relay does once it keeps up), delivering to one consumer (fetch, `Delivery`, handler call,
ack), and nats-server's part of both; and the same per job at 12 events and ~4 deliveries per
event.

Run: .venv/bin/python bench/bus.py [--messages 20000] [--batch 64] [--consumers 3] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from live import machine_line, tree_cpu

from corral.bus import Bus, Delivery, Outgoing, relay
from corral.stack import tls
from corral.stack.servers import NatsServer

#: a JobAdmitted-sized payload and the headers the relay sets on every event
PAYLOAD = b'{"type":"JobAdmitted","event_id":"' + b"0" * 36 + b'","stream":"job-0123456789abcdef",' + b"x" * 260 + b"}"
EVENTS_PER_JOB = 12
DELIVERIES_PER_EVENT = 4


def _headers(index: int) -> dict[str, str]:
    """What `corral.bus.relay.event_headers` sets (the relay's Nats-Msg-Id comes on top)."""
    return {relay.STREAM: f"job-{index // 12:016x}", relay.STREAM_VERSION: str(index % 12 + 1),
            relay.POSITION: str(index + 1), relay.CORRELATION_ID: f"job-{index // 12:016x}"}


async def measure(nats_url: str, ca: str, server_pid: int, messages: int, batch: int,
                  consumers: int) -> dict[str, float]:
    bus = await Bus.connect(nats_url, "bench", ca=ca)
    try:
        await bus.ensure_streams()
        subject = bus.names.events_subject("JobAdmitted")
        cpu0, server0 = time.process_time(), tree_cpu(server_pid)
        wall0 = time.perf_counter()
        for start in range(0, messages, batch):
            await bus.publish_many(relay.chained([
                Outgoing(subject=subject, data=PAYLOAD, msg_id=f"m{i}", headers=_headers(i))
                for i in range(start, min(start + batch, messages))]))
        publish_cpu, publish_server = time.process_time() - cpu0, tree_cpu(server_pid) - server0
        publish_wall = time.perf_counter() - wall0

        # the relay's batches once it is keeping up: chained, only the last acknowledged
        cpu0, server0 = time.process_time(), tree_cpu(server_pid)
        for start in range(0, messages, batch):
            await bus.publish_acked_by_last(relay.chained([
                Outgoing(subject=subject, data=PAYLOAD, msg_id=f"l{i}", headers=_headers(i))
                for i in range(start, min(start + batch, messages))]))
        last_cpu, last_server = time.process_time() - cpu0, tree_cpu(server_pid) - server0

        done = asyncio.Event()
        seen = [0]

        async def handler(delivery: Delivery) -> None:
            seen[0] += 1
            if seen[0] == 2 * messages * consumers:
                done.set()

        cpu0, server0 = time.process_time(), tree_cpu(server_pid)
        wall0 = time.perf_counter()
        running = [await bus.consume(f"bench-{n}", [subject], handler, batch=256, linger=0.02)
                   for n in range(consumers)]
        await asyncio.wait_for(done.wait(), timeout=max(60.0, messages * consumers / 500))
        deliver_cpu, deliver_server = time.process_time() - cpu0, tree_cpu(server_pid) - server0
        deliver_wall = time.perf_counter() - wall0
        for consumer in running:
            await consumer.stop()
    finally:
        await bus.close()
    deliveries = 2 * messages * consumers
    return {
        "last_us": 1e6 * last_cpu / messages, "last_server_us": 1e6 * last_server / messages,
        "publish_us": 1e6 * publish_cpu / messages, "publish_server_us": 1e6 * publish_server / messages,
        "publish_per_s": messages / publish_wall,
        "deliver_us": 1e6 * deliver_cpu / deliveries, "deliver_server_us": 1e6 * deliver_server / deliveries,
        "deliver_per_s": deliveries / deliver_wall,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=64, help="messages per publish_many (the relay's batch)")
    parser.add_argument("--consumers", type=int, default=3, help="durable consumers reading every message")
    parser.add_argument("--smoke", action="store_true", help="a few hundred messages: checks the bench runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.messages, args.consumers = 300, 2
    root = Path(tempfile.mkdtemp(prefix="corral-bench-bus-"))
    files = tls.generate(root / "tls")
    server = NatsServer(data_dir=root / "nats", tls=files.server_block()).start()
    try:
        assert server.proc is not None
        figures = asyncio.run(measure(server.url, str(files.ca), server.proc.pid, args.messages, args.batch,
                                      args.consumers))
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"machine: {machine_line()}")
    print(f"command: {' '.join([os.path.relpath(sys.argv[0])] + (argv if argv is not None else sys.argv[1:]))}")
    print(f"{args.messages} messages of {len(PAYLOAD)} bytes over TLS, published in batches of {args.batch}, "
          f"read by {args.consumers} consumers (batch 256, linger 20 ms, ack each, confirm the last)\n")
    print(f"  {'':<10} {'client us/msg':>14} {'nats-server us/msg':>19} {'msgs/s':>9}")
    print(f"  {'publish':<10} {figures['publish_us']:>14.1f} {figures['publish_server_us']:>19.1f} "
          f"{figures['publish_per_s']:>9.0f}")
    print(f"  {'by last':<10} {figures['last_us']:>14.1f} {figures['last_server_us']:>19.1f}")
    print(f"  {'deliver':<10} {figures['deliver_us']:>14.1f} {figures['deliver_server_us']:>19.1f} "
          f"{figures['deliver_per_s']:>9.0f}")
    per_job = EVENTS_PER_JOB * ((figures["last_us"] + figures["last_server_us"])
                                + DELIVERIES_PER_EVENT * (figures["deliver_us"] + figures["deliver_server_us"]))
    print(f"\nper job ({EVENTS_PER_JOB} events, {DELIVERIES_PER_EVENT} deliveries each): {per_job / 1000:.2f} ms "
          "of CPU on the bus alone (handlers doing nothing)")
    if args.smoke:
        print("(--smoke: too few messages for the figures to mean anything; nats-server's CPU is read in "
              "10 ms ticks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
