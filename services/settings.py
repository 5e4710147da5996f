"""Where a service finds its infrastructure, and how often its consumers retry a failing message.

Why: every service process reads the same environment (`corral up` sets it), and a
setting read in several places drifts. A service's settings are gathered here, once per process,
by the run loop (`corral.services.run_loop`), through `corral.environment`, the one module that
reads the environment (what the libraries below read, the bus's credentials or the telemetry's
log format, is read there too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from corral import environment
from corral.core.model import POLICIES, SchedulerConfig
from corral.lifecycle import Limits


@dataclass(frozen=True)
class PlacementSettings:
    """Placement's own: after how long without a heartbeat a node is lost
    (CORRAL_NODE_LOST_SECONDS), the MASTER_ADDR of a gang whose rank 0's node advertised no address
    (CORRAL_MASTER_ADDR), the gang lifecycle's time limits (`Limits.from_env`), and how long a job
    quota reserved waits for GPUs before placement records why (CORRAL_FIRST_REASON_GRACE_SECONDS,
    `corral.services.placement.first_reason`)."""

    node_lost_seconds: float = 10.0
    master_addr: str = "127.0.0.1"
    limits: Limits = field(default_factory=Limits)
    first_reason_grace_seconds: float = 1.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PlacementSettings:
        env = environment.mapping() if environ is None else environ
        return cls(node_lost_seconds=float(env.get("CORRAL_NODE_LOST_SECONDS", "10")),
                   master_addr=env.get("CORRAL_MASTER_ADDR", "127.0.0.1"), limits=Limits.from_env(env),
                   first_reason_grace_seconds=float(env.get("CORRAL_FIRST_REASON_GRACE_SECONDS", "1")))


@dataclass(frozen=True)
class Settings:
    """Where a service finds its infrastructure; read from the environment that `corral up` sets.
    `policy`: the cluster's scheduling policy (CORRAL_POLICY, `corral up --policy`; one of
    `corral.core.POLICIES`), the one quota, placement and preemption decide by."""

    nats_url: str
    postgres_dsn: str
    namespace: str = "corral"
    log_dir: str | None = None
    placement: PlacementSettings = field(default_factory=lambda: PlacementSettings.from_env())
    policy: str = "corral"

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise SystemExit(f"CORRAL_POLICY={self.policy!r}: choose one of {', '.join(POLICIES)}")

    @property
    def scheduler_config(self) -> SchedulerConfig:
        """The policy's configuration of the core, as `corral sim --policy` replays it."""
        return SchedulerConfig.named(self.policy)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = environment.mapping() if environ is None else environ
        missing = [k for k in ("CORRAL_NATS_URL", "CORRAL_POSTGRES_DSN") if not env.get(k)]
        if missing:
            raise SystemExit(f"set {' and '.join(missing)} (or start everything with `corral up`)")
        return cls(nats_url=env["CORRAL_NATS_URL"], postgres_dsn=env["CORRAL_POSTGRES_DSN"],
                   namespace=env.get("CORRAL_NAMESPACE", "corral"), log_dir=env.get("CORRAL_LOG_DIR"),
                   placement=PlacementSettings.from_env(env), policy=env.get("CORRAL_POLICY") or "corral")


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
        env = environment.mapping() if environ is None else environ
        limits = cls()
        if env.get("CORRAL_MAX_DELIVER"):
            n = int(env["CORRAL_MAX_DELIVER"])
            limits = DeliveryLimits(events_max_deliver=n, inbox_max_deliver=n, backoff=limits.backoff)
        if env.get("CORRAL_RETRY_BACKOFF"):
            backoff = tuple(float(x) for x in env["CORRAL_RETRY_BACKOFF"].split(",") if x.strip())
            limits = DeliveryLimits(limits.events_max_deliver, limits.inbox_max_deliver, backoff)
        return limits


