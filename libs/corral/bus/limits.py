"""How much the bus keeps, and how large one message may be.

Why: a stream without limits keeps garbage on the inbox forever, and every consumer's dead letter
of it; and one valid message near NATS' max payload (8 MiB) could not be republished by the
outbox relay once admission re-encoded it, which would stop the relay for good.

So every stream has a maximum age, a maximum size and a maximum message size; the dead-letter
stream also a maximum count. The log stream (ranks' output, `corral.contracts.logs`) is user data,
not events: it keeps less for less long, and its oldest chunks go first. Submissions are bounded
well below the message size (`max_spec_bytes`), so the recorded JobSubmitted always fits on the
bus. Defaults are sane for one installation; each can be overridden from the environment (names
below, values in bytes or seconds). Pure: reading a mapping, no I/O.

Replicas (`stream_replicas`, CORRAL_STREAM_REPLICAS): how many nats-servers of a JetStream cluster
hold each stream (3 in a deployment: one server may be lost with nothing lost; 1 for `corral up`'s
single server). Unset, a stream is created with 3 when the NATS URL lists three servers or more
(a cluster), else 1, and an existing stream keeps its replicas: a CLI or an agent without the
setting must never shrink a deployment's R3 streams to R1 (`corral.bus.Bus.ensure_streams`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from corral import environment

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
DAY = 86_400.0

#: Room for a dead letter's headers (origin, consumer, error) on top of the original message.
DEAD_LETTER_OVERHEAD = 16 * KIB
#: JetStream keeps at most five replicas of a stream.
MAX_REPLICAS = 5


@dataclass(frozen=True, slots=True)
class BusLimits:
    """Limits of the four streams, and of one message. Environment: CORRAL_<FIELD> upper-cased,
    e.g. CORRAL_MAX_EVENT_BYTES=1048576, CORRAL_EVENTS_MAX_AGE=604800."""

    #: Largest message (payload + headers) on the events and inbox streams.
    max_event_bytes: int = 1 * MIB
    #: Largest recorded JobSubmitted admission accepts (and the client sends): well below
    #: `max_event_bytes`, so the event as the log and the bus carry it always fits.
    max_spec_bytes: int = 256 * KIB
    events_max_age: float = 7 * DAY
    events_max_bytes: int = 2 * GIB
    #: Consumers the events stream takes: each service's durable, one per node-agent process and
    #: its history consumer at start. A stream that sets none gets the server's default, 1,000
    #: since nats-server 2.15: fewer than the agents of a 1,000-host cluster.
    events_max_consumers: int = 100_000
    inbox_max_age: float = 7 * DAY
    inbox_max_bytes: int = 1 * GIB
    dlq_max_age: float = 30 * DAY
    dlq_max_bytes: int = 256 * MIB
    dlq_max_msgs: int = 10_000
    logs_max_age: float = 3 * DAY
    #: Counted against the nats-server's `max_file_store` like every stream's max bytes (8 GB for
    #: `corral up`'s, which two installations on one server share in tests): raise both together.
    logs_max_bytes: int = 256 * MIB
    #: Largest log chunk message: an agent ships at most 32 KiB of lines per chunk
    #: (`corral.services.node_agent.reporting.log_chunks`), which JSON escaping may grow up to six times.
    logs_max_msg_bytes: int = 256 * KIB
    #: Servers holding each stream (1..5); None: 1 for a new stream, an existing one keeps its own.
    stream_replicas: int | None = None

    def __post_init__(self) -> None:
        if self.stream_replicas is not None and not 1 <= self.stream_replicas <= MAX_REPLICAS:
            raise ValueError(f"bus limit stream_replicas (CORRAL_STREAM_REPLICAS) must be 1..{MAX_REPLICAS}, got "
                             f"{self.stream_replicas}: 1 for one nats-server, 3 for a 3-node JetStream cluster")
        for f in fields(self):
            if f.name == "stream_replicas":
                continue
            if getattr(self, f.name) <= 0:
                raise ValueError(f"bus limit {f.name} must be > 0, got {getattr(self, f.name)}")
        if self.max_spec_bytes >= self.max_event_bytes:
            raise ValueError(f"max_spec_bytes ({self.max_spec_bytes}) must be below max_event_bytes "
                             f"({self.max_event_bytes}): a recorded submission must fit on the bus")

    @property
    def dlq_max_msg_bytes(self) -> int:
        return self.max_event_bytes + DEAD_LETTER_OVERHEAD

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> BusLimits:
        env = environment.mapping() if environ is None else environ
        values: dict[str, float | int] = {}
        for f in fields(cls):
            raw = env.get(f"CORRAL_{f.name.upper()}")
            if raw:
                try:
                    values[f.name] = float(raw) if f.type in (float, "float") else int(raw)
                except ValueError:
                    raise ValueError(f"CORRAL_{f.name.upper()}={raw!r}: expected a number "
                                     f"({'seconds' if 'age' in f.name else 'a count or bytes'})") from None
        return cls(**values)  # type: ignore[arg-type]
