"""What a message JetStream acknowledged survives with the dev stack's nats-server settings.

`NatsServer.sync_interval` is 1 s, not `always` (which fsynced every message on its own and made
the bus the cluster's ceiling, see its docstring): the claim checked here is that a nats-server
killed with SIGKILL right after acknowledging a burst keeps every message it acknowledged, in
both the events stream (a copy of the log) and the inbox (requests nobody else holds).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from corral.bus import Bus
from corral.bus.bus import Outgoing
from corral.bus.naming import EVENTS, INBOX
from corral.stack.servers import NatsServer


async def _publish_burst(url: str, batches: int, size: int) -> dict[str, int]:
    bus = await Bus.connect(url, namespace="corral")
    try:
        await bus.ensure_streams()
        acked: dict[str, int] = {}
        for b in range(batches):
            sent = await bus.publish_many([
                Outgoing(bus.names.events_subject("JobSubmitted"), b"x" * 600, f"e-{b}-{i}", {})
                for i in range(size)])
            acked[EVENTS] = sent[-1].sequence
            sent = await bus.publish_many([
                Outgoing(bus.names.inbox_subject("JobSubmitted"), b"y" * 600, f"i-{b}-{i}", {})
                for i in range(size // 4)])
            acked[INBOX] = sent[-1].sequence
        return acked
    finally:
        await bus.nc.close()  # no drain: the server is killed next


async def _last_sequences(url: str) -> dict[str, int]:
    bus = await Bus.connect(url, namespace="corral")
    try:
        return {kind: (await bus.js.stream_info(bus.names.stream(kind))).state.last_seq for kind in (EVENTS, INBOX)}
    finally:
        await bus.close()


def test_a_nats_server_killed_with_sigkill_keeps_every_message_it_acknowledged(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats").start()
    try:
        acked = asyncio.run(_publish_burst(server.url, batches=20, size=200))
        assert server.proc is not None
        server.proc.send_signal(signal.SIGKILL)  # at once: well within the 1 s between fsyncs
        server.proc.wait(10)
        server.proc = None
        server = NatsServer(tmp_path / "nats", port=server.port).start()
        assert asyncio.run(_last_sequences(server.url)) == acked == {EVENTS: 4000, INBOX: 1000}
    finally:
        server.stop()
