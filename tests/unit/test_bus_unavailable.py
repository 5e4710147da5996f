"""An unavailable dependency is told apart from bad input (`corral.bus.unavailable`)."""

from __future__ import annotations

import errno

import asyncpg
import msgspec
import nats.errors
import nats.js.errors
import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.bus import Poison, Retry, Unavailable, UnavailableBackoff, is_unavailable


@pytest.mark.parametrize("exc", [
    Unavailable("event store down"),
    ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed ('127.0.0.1', 5432)"),
    OSError(errno.ECONNREFUSED, "Connect call failed"),  # what asyncio raises for several addresses
    OSError(errno.EHOSTUNREACH, "no route to host"),
    ConnectionResetError(),
    TimeoutError(),
    asyncpg.PostgresConnectionError("connection lost"),
    asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    asyncpg.InterfaceError("connection is closed"),
    asyncpg.CannotConnectNowError("the database system is starting up"),
    asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
    asyncpg.exceptions.TooManyConnectionsError("sorry, too many clients already"),
    # its disk full (53100, "could not extend file"): an append waits for space, never a dead letter
    asyncpg.exceptions.DiskFullError('could not extend file "base/16384/16401": No space left on device'),
    nats.errors.TimeoutError(),
    nats.errors.ConnectionClosedError(),
    nats.errors.NoServersError(),
    nats.errors.ConnectionReconnectingError(),
    nats.js.errors.NoStreamResponseError(),
    nats.js.errors.ServiceUnavailableError(),
    # a publish retried after a timeout while the stream elects a new leader: the first try is
    # still being stored, as after a leader is killed
    nats.js.errors.APIError(code=409, err_code=10158, description="duplicate message id is in process"),
], ids=lambda e: type(e).__name__)
def test_dependency_failures_are_unavailable(exc: BaseException) -> None:
    assert is_unavailable(exc)


@pytest.mark.parametrize("exc", [
    Poison("undecodable request"),
    Retry("stream moved on"),
    ValueError("bad field"),
    KeyError("queue"),
    msgspec.ValidationError("Expected `int`, got `str` - at `$.gpus_per_replica`"),
    FileNotFoundError(errno.ENOENT, "no such file"),  # a fact about the request, not an outage
    PermissionError(errno.EACCES, "denied"),
    asyncpg.exceptions.UniqueViolationError("duplicate key"),
    asyncpg.exceptions.InvalidTextRepresentationError("invalid input syntax"),
    nats.errors.MaxPayloadError(),
    nats.js.errors.APIError(code=409, err_code=10071, description="wrong last sequence: 5"),
    RuntimeError("a bug"),
], ids=lambda e: type(e).__name__)
def test_bad_input_and_bugs_are_not_unavailable(exc: BaseException) -> None:
    assert not is_unavailable(exc)


def test_a_wrapped_connection_error_is_unavailable_through_its_cause() -> None:
    try:
        try:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "refused")
        except OSError as inner:
            raise RuntimeError("could not append") from inner
    except RuntimeError as outer:
        assert is_unavailable(outer)


def test_a_cause_cycle_ends() -> None:
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert not is_unavailable(a)


def test_the_backoff_doubles_from_half_a_second_to_ten() -> None:
    backoff = UnavailableBackoff()
    assert [backoff.delay(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    with pytest.raises(ValueError, match="first"):
        UnavailableBackoff(first=0, cap=1)


@given(st.integers(min_value=-5, max_value=10_000), st.floats(0.01, 5), st.floats(5, 60))
def test_the_backoff_stays_between_first_and_cap(attempt: int, first: float, cap: float) -> None:
    delay = UnavailableBackoff(first, cap).delay(attempt)
    assert first <= delay <= cap
