"""Where a service finds its infrastructure, and how often its consumers retry a failing message.

Why: every service process reads the same environment (`corral up` sets it), and a
setting read in several places drifts. Both are read here, once per process, by the run loop
(`corral.services.run_loop`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    """Where a service finds its infrastructure; read from the environment that `corral up` sets."""

    nats_url: str
    postgres_dsn: str
    namespace: str = "corral"
    log_dir: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        missing = [k for k in ("CORRAL_NATS_URL", "CORRAL_POSTGRES_DSN") if not env.get(k)]
        if missing:
            raise SystemExit(f"set {' and '.join(missing)} (or start everything with `corral up`)")
        return cls(nats_url=env["CORRAL_NATS_URL"], postgres_dsn=env["CORRAL_POSTGRES_DSN"],
                   namespace=env.get("CORRAL_NAMESPACE", "corral"), log_dir=env.get("CORRAL_LOG_DIR"))


@dataclass(frozen=True)
class DeliveryLimits:
    """How often a service's consumers retry a message that fails (bad input or a bug) before
    dead-lettering it, and the delays between tries. From the environment, so tests and operators
    can shorten or lengthen the window: CORRAL_MAX_DELIVER (both consumers), CORRAL_RETRY_BACKOFF
    (comma-separated seconds)."""

    events_max_deliver: int = 10
    inbox_max_deliver: int = 5
    backoff: tuple[float, ...] = (0.5, 2.0, 10.0, 30.0)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DeliveryLimits:
        env = os.environ if environ is None else environ
        limits = cls()
        if env.get("CORRAL_MAX_DELIVER"):
            n = int(env["CORRAL_MAX_DELIVER"])
            limits = DeliveryLimits(events_max_deliver=n, inbox_max_deliver=n, backoff=limits.backoff)
        if env.get("CORRAL_RETRY_BACKOFF"):
            backoff = tuple(float(x) for x in env["CORRAL_RETRY_BACKOFF"].split(",") if x.strip())
            limits = DeliveryLimits(limits.events_max_deliver, limits.inbox_max_deliver, backoff)
        return limits


