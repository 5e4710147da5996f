"""Alive is not working: when a supervised child that runs must be restarted all the same.

A process that runs can be wedged: a nats-server whose JetStream met a full disk keeps failing
every store on that stream after space is back, its process alive, so a supervisor that only
watches for exits never restarts it. Each child therefore has a probe that proves work (see
`corral.stack.probes`: the nats-server's `/healthz`, which fails on a stream's write error; a
Postgres write; a service's `/healthz`, answered by its event loop), run every `every` seconds,
and `Liveness` decides from their answers:

- a probe counts only once one has passed since the child started (a server still recovering,
  a service still connecting to its dependencies, is starting, not wedged; Kubernetes' startup
  probe);
- the child is wedged once its probes have failed without a pass for `grace` seconds;
- a restart is then worth doing only if what it needs is there: a store on a full disk would
  wedge again at its first write (`corral.stack.up` asks for free space first).

Pure: the caller passes the clock and the probes' answers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Liveness:
    """The probe schedule and verdict of one child."""

    every: float = 2.0
    grace: float = 6.0
    armed: bool = False
    failing_since: float | None = None
    next_at: float = 0.0

    def started(self, now: float) -> None:
        """The child (re)started at `now`: nothing counts until a probe passes."""
        self.armed, self.failing_since, self.next_at = False, None, now + self.every

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def observe(self, now: float, ok: bool) -> bool:
        """Record a probe's answer at `now`; True when the child is wedged (restart it)."""
        self.next_at = now + self.every
        if ok:
            self.armed, self.failing_since = True, None
            return False
        if not self.armed:
            return False
        if self.failing_since is None:
            self.failing_since = now
        return now - self.failing_since >= self.grace

    @property
    def failing_for(self) -> float | None:
        """Since when the probes fail (None: they pass, or have not passed yet)."""
        return self.failing_since
