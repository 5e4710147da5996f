"""One server `corral up` started (nats-server, Postgres), kept working: restarted when it exits,
and when it is alive but fails its liveness check (`corral.stack.liveness`), once its store's
disk has room again (a server restarted onto a full disk wedges again at its first write).

The same watch serves `corral up` (`Stack.supervise`) and the chaos run (`bench/chaos.py`), which
runs its own servers to stop and restart them on purpose.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from corral.stack.backoff import RestartBackoff
from corral.stack.liveness import Liveness
from corral.stack.servers import NatsServer, PostgresServer, ServerStartError, has_room

#: nats-server's `/healthz` every 2 s, wedged after 6 s of failures; a Postgres write every 5 s,
#: wedged after 30 s (a restart costs it more).
LIVENESS = {"nats": (2.0, 6.0), "postgres": (5.0, 30.0)}


@dataclass
class ServerWatch:
    name: str
    server: NatsServer | PostgresServer
    say: Callable[[str], None] = field(default=lambda message: None)
    backoff: RestartBackoff = field(default_factory=lambda: RestartBackoff(initial=1.0))
    liveness: Liveness = field(default_factory=Liveness)
    waiting_for_room: bool = False

    def __post_init__(self) -> None:
        every, grace = LIVENESS.get(self.name, (self.liveness.every, self.liveness.grace))
        self.liveness.every, self.liveness.grace = every, grace

    def round(self, now: float) -> bool:
        """One round; True when the server was started again in it."""
        server, backoff, liveness = self.server, self.backoff, self.liveness
        if backoff.started_at is None and not backoff.waiting:
            backoff.started(now)
            liveness.started(now)
        if not backoff.waiting and not server.alive():
            code = server.proc.returncode if server.proc is not None else None
            delay = backoff.exited(now)
            self.say(f"{self.name} exited ({code}); restarting it in {delay:.1f}s")
        elif backoff.due(now):
            try:
                server.start()
            except (ServerStartError, OSError, subprocess.SubprocessError) as exc:
                delay = backoff.exited(time.monotonic())
                self.say(f"{self.name} did not start ({str(exc).splitlines()[0]}); trying again in {delay:.1f}s")
            else:
                backoff.started(time.monotonic())
                liveness.started(time.monotonic())
                self.say(f"{self.name} restarted (pid {server.proc.pid if server.proc else '?'})")
                return True
        elif not backoff.waiting and liveness.due(now) and liveness.observe(now, server.works()):
            self._wedged(now)
        return False

    def _wedged(self, now: float) -> None:
        """Alive but failing its liveness check for its grace: stop it and schedule its restart,
        unless its store's disk is full: then once space is back."""
        if not has_room(self.server.store):
            if not self.waiting_for_room:
                self.waiting_for_room = True
                self.say(f"{self.name} fails its liveness check and {self.server.store} has no space left; "
                         "restarting it once space is back")
            return
        self.waiting_for_room = False
        since = self.liveness.failing_for
        self.say(f"{self.name} is alive but has failed its liveness check for {now - (since or now):.0f}s; "
                 "restarting it")
        self.server.stop()
        delay = self.backoff.exited(now)
        self.say(f"{self.name} stopped; restarting it in {delay:.1f}s")
