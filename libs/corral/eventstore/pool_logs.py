"""asyncpg's pool says in one line that Postgres does not answer, not in a traceback.

Why: while Postgres is down (a restart, a failover), every connection pool keeps reconnecting the
connections it holds at its floor (`min_size`), and asyncpg logs each failed try as a warning
with the whole traceback (`Failed to restore the pool connection floor; retrying`): 20 lines
each, for a dependency that is only unavailable, which the services wait out by design.

So a filter on asyncpg's pool logger that turns exactly that record into one line naming
the error (`ConnectionRefusedError: [Errno 111] ...`); every other record is left as it is.
`install()` is idempotent and is called when a store opens its pool.
"""

from __future__ import annotations

import logging

_LOGGER = "asyncpg.pool"
_FLOOR = "Failed to restore the pool connection floor; retrying"


class PoolFloorRetry(logging.Filter):
    """Rewrites asyncpg's floor-retry warning to one line; passes every record on."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == _FLOOR and record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            record.msg = "Postgres does not answer (%s: %s); the connection pool tries again"
            record.args = (type(exc).__name__, exc)
            record.exc_info = None
            record.exc_text = None
        return True


def install() -> None:
    """Add the filter to asyncpg's pool logger once."""
    logger = logging.getLogger(_LOGGER)
    if not any(isinstance(f, PoolFloorRetry) for f in logger.filters):
        logger.addFilter(PoolFloorRetry())
