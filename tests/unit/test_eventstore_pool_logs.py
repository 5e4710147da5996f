"""asyncpg's pool logs a Postgres outage's reconnect tries in one line each (`corral.eventstore.pool_logs`)."""

from __future__ import annotations

import logging

import pytest

from corral.eventstore import pool_logs


def _formatted(caplog: pytest.LogCaptureFixture) -> str:
    handler = logging.StreamHandler()
    return "\n".join(handler.format(record) for record in caplog.records)


def test_the_pool_s_floor_retry_is_one_line_naming_the_error(caplog: pytest.LogCaptureFixture) -> None:
    pool_logs.install()
    pool_logs.install()  # idempotent
    logger = logging.getLogger("asyncpg.pool")
    assert sum(isinstance(f, pool_logs.PoolFloorRetry) for f in logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger="asyncpg.pool"):
        try:
            raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 60969)")
        except ConnectionRefusedError:  # as asyncpg's pool logs it
            logger.warning("Failed to restore the pool connection floor; retrying", exc_info=True)
    text = _formatted(caplog)
    assert "Traceback" not in text
    assert text == ("Postgres does not answer (ConnectionRefusedError: [Errno 111] Connect call failed "
                    "('127.0.0.1', 60969)); the connection pool tries again")


def test_other_records_of_the_pool_keep_their_traceback(caplog: pytest.LogCaptureFixture) -> None:
    pool_logs.install()
    logger = logging.getLogger("asyncpg.pool")
    with caplog.at_level(logging.WARNING, logger="asyncpg.pool"):
        try:
            raise RuntimeError("a bug")
        except RuntimeError:
            logger.warning("something else went wrong", exc_info=True)
    assert "Traceback" in _formatted(caplog)
