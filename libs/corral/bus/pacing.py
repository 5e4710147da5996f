"""When a batching wait is worth taking: a linger gathers only what arrives while it lasts.

Why: a consumer (`corral.bus.consumer`) and the outbox relay (`corral.bus.relay`) wait a few
milliseconds after a partial batch, so that under a stream of messages one fetch, acknowledgement,
commit or publish covers many. On a quiet cluster nothing arrives in that wait, and a job's next
step (the event that answers the one just handled, a few milliseconds later) pays for it in full at
every hop. So a wait is taken only while the recent rate says it gathers something: at least
`GATHERS` of a message expected within it. The rate is a decaying count of the messages handled
(time constant `HORIZON`): a steady stream keeps it, and the first messages after a quiet spell
pass at once (a consumer that is behind fetches what waits without lingering anyway).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

#: The messages a wait must be expected to gather to be taken (rate x wait).
GATHERS = 0.5
#: Seconds over which the rate is counted (the decay's time constant).
HORIZON = 1.0


class Linger:
    """The wait after a batch: `seconds` while messages come often enough to gather, else none."""

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        if seconds < 0:
            raise ValueError(f"linger must be >= 0 seconds, got {seconds}")
        self.seconds = seconds
        self._clock = clock
        self._rate = 0.0  # messages a second, decayed to `_at`
        self._at = float("-inf")

    def rate(self) -> float:
        """Messages a second over about the last `HORIZON` seconds."""
        return self._rate * math.exp(-(self._clock() - self._at) / HORIZON) if self._rate else 0.0

    def busy(self) -> bool:
        """Whether a wait of `seconds` would gather something at the current rate."""
        return self.seconds > 0 and self.rate() * self.seconds >= GATHERS

    def after(self, count: int) -> float:
        """Count `count` messages handled now; the wait to take before the next batch."""
        now = self._clock()
        self._rate = self.rate() + count / HORIZON
        self._at = now
        return self.seconds if self.busy() else 0.0
