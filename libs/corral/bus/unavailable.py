"""Telling an unavailable dependency from bad input.

Why: a consumer that retries every failure a few times and then dead-letters it would dead-letter
a valid JobSubmitted whose handler failed because Postgres was down for a while, after the user
was told "Submitted". A connection error says nothing about the message; only a decode or
validation failure does.

So failures are classified: `is_unavailable(exc)` is True for errors of talking to a dependency
(Postgres or NATS not reachable, shutting down, a connection lost mid-query, a timeout); the
consumer then never dead-letters the message and never counts the attempt, but stops taking
messages and retries the same one with `UnavailableBackoff` until the dependency answers. A
handler that knows better raises `Unavailable` itself. Everything else keeps its old meaning:
`Poison` is dead-lettered at once, other exceptions are retried a bounded number of times.
Pure: no I/O; the classification looks at exception types (and their causes) only.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

import asyncpg
import nats.errors
import nats.js.errors


class Unavailable(Exception):
    """A dependency (the event store, the bus) does not answer: wait and retry, never dead-letter."""


# Postgres: the connection cannot be made or was lost (class 08 and asyncpg's interface errors
# such as "connection is closed"), the server is starting or shutting down (class 57P: admin or
# crash shutdown, cannot connect now), or it is out of connections / resources (class 53).
_POSTGRES: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
)
# NATS: not connected, reconnecting, timed out, or JetStream not answering. `StreamMissing` (a
# NoStreamResponseError) is here too: the streams are declared by every service at start.
_NATS: tuple[type[BaseException], ...] = (
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.NoServersError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.NoRespondersError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.NoStreamResponseError,
)
# The operating system: refused or reset connections, unreachable hosts, name lookups, timeouts
# (asyncio's TimeoutError is the builtin one; nats.errors.TimeoutError derives from it). Not any
# OSError: a missing file or a denied permission is a fact about the request, not an outage.
_SYSTEM: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, socket.gaierror)
_NETWORK_ERRNOS = frozenset({
    errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE, errno.ETIMEDOUT,
    errno.ENETUNREACH, errno.ENETDOWN, errno.EHOSTUNREACH, errno.EHOSTDOWN, errno.EADDRNOTAVAIL,
})

UNAVAILABLE: tuple[type[BaseException], ...] = (Unavailable, *_POSTGRES, *_NATS, *_SYSTEM)
# JetStream API errors that say "not now": 10158, a publish retried with the same message id while
# the first try is still being stored (its stream's leader moved, or a slow replica quorum). The
# retry that follows is answered as a duplicate: stored once. 10070, a message chained to one the
# stream did not store (the relay's batches, `corral.bus.relay.chained`): the batch is sent again.
_TRANSIENT_API_ERRORS = frozenset({10158, 10070})


def is_unavailable(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) says a dependency did not answer, not that the input is bad."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, UNAVAILABLE):
            return True
        if isinstance(current, OSError) and current.errno in _NETWORK_ERRNOS:
            return True
        if isinstance(current, nats.js.errors.APIError) and current.err_code in _TRANSIENT_API_ERRORS:
            return True
        current = current.__cause__
    return False


def dependency_failure(exc: BaseException) -> bool:
    """NATS or Postgres unavailable, or an error Postgres answered: a dependency's state to wait
    out and retry, not a bug (the one test for it in the services' loops)."""
    return is_unavailable(exc) or isinstance(exc, asyncpg.PostgresError)


@dataclass(frozen=True, slots=True)
class UnavailableBackoff:
    """Delays between tries while a dependency is down: `first`, doubling, capped at `cap`."""

    first: float = 0.5
    cap: float = 10.0

    def __post_init__(self) -> None:
        if not 0 < self.first <= self.cap:
            raise ValueError(f"backoff needs 0 < first <= cap, got first={self.first} cap={self.cap}")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed try number `attempt` (1-based) of the same message."""
        return min(self.cap, self.first * 2 ** min(max(attempt, 1) - 1, 32))
