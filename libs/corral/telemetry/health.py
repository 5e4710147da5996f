"""`/healthz` and `/readyz`: is the process alive, and is what it holds the log's truth yet?

Why: a process that runs is not a process that can be trusted to decide. A restarted service
first folds the whole log (seconds to minutes on a long history), then drains what its durable
consumers kept for it; a placement standby waits for the lease and decides nothing. A probe that
only sees the process (or the health file, `corral.health`) would trust a service still
rebuilding. Readiness says it in the service's own terms:

- `phase`: starting -> standby (waiting for the service's lease) -> rebuilding (folding the log)
  -> consuming (its consumers run) ; stopping at the end;
- `nats`: the connection is up;
- `consumers`: each durable's backlog (messages not yet delivered) is at most `max_pending`
  (`CORRAL_READY_MAX_PENDING`, 100): caught up;
- `lease`: held (for a single-writer service), else it is a standby.

Ready = consuming, connected, caught up and holding its lease if it has one. `/healthz` is
alive = the event loop answers (it runs the endpoint) and the process is not stopping.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from corral import environment

READY_MAX_PENDING_ENV = "CORRAL_READY_MAX_PENDING"


class Phase(StrEnum):
    STARTING = "starting"
    STANDBY = "standby"
    REBUILDING = "rebuilding"
    CONSUMING = "consuming"
    STOPPING = "stopping"


class Backlog(Protocol):
    """A durable consumer whose backlog can be asked (`corral.bus.RunningConsumer`)."""

    durable: str

    async def backlog(self) -> tuple[int, int]: ...


@dataclass
class Readiness:
    """What `/readyz` reports, kept by the run loop's hooks (`phase`, `consumers`)."""

    connected: Callable[[], bool]
    lease: str | None = None
    phase: Phase = Phase.STARTING
    consumers: Sequence[Backlog] = field(default_factory=list)
    max_pending: int = field(default_factory=lambda: int(environment.get(READY_MAX_PENDING_ENV) or "100"))

    async def backlogs(self) -> dict[str, tuple[int, int] | None]:
        """Each consumer's (not delivered, delivered but not acknowledged); None if unknown now."""
        async def one(c: Backlog) -> tuple[int, int] | None:
            try:
                return await asyncio.wait_for(c.backlog(), 2.0)
            except Exception:
                return None

        answers = await asyncio.gather(*(one(c) for c in self.consumers))
        return {c.durable: a for c, a in zip(self.consumers, answers, strict=True)}

    async def report(self) -> tuple[bool, dict[str, Any]]:
        backlogs = await self.backlogs() if self.phase is Phase.CONSUMING else {}
        caught_up = all(b is not None and b[0] <= self.max_pending for b in backlogs.values())
        checks: dict[str, Any] = {
            "phase": self.phase.value,
            "rebuilt": self.phase is Phase.CONSUMING,
            "nats": bool(self.connected()),
            "consumers": {d: (None if b is None else {"pending": b[0], "ack_pending": b[1]})
                          for d, b in backlogs.items()},
            "caught_up": self.phase is Phase.CONSUMING and caught_up,
        }
        if self.lease is not None:
            checks["lease"] = {"name": self.lease, "held": self.phase in (Phase.REBUILDING, Phase.CONSUMING)}
        ready = checks["rebuilt"] and checks["nats"] and checks["caught_up"]
        return bool(ready), checks

    async def readyz(self) -> tuple[int, str, bytes]:
        ready, checks = await self.report()
        body = json.dumps({"ready": ready, **checks}, sort_keys=True).encode() + b"\n"
        return (200 if ready else 503), "application/json", body

    async def healthz(self) -> tuple[int, str, bytes]:
        alive = self.phase is not Phase.STOPPING
        body = json.dumps({"alive": alive, "phase": self.phase.value}).encode() + b"\n"
        return (200 if alive else 503), "application/json", body
