"""What the NATS server refuses a client, learnt as the client learns it.

A publish the account may not make is dropped by the server, which tells the connection at once
(`-ERR 'Permissions Violation for Publish to "<subject>"'`); a JetStream publish or request then
never gets its answer. Waiting for that answer's timeout made each refusal a test checks cost the
whole timeout; listening for the violation makes it a round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

import nats.errors

from corral.bus import Bus


async def refused(bus: Bus, subject: str, send: Awaitable[object]) -> bool:
    """Whether the server refuses `send`, a publish or request on `subject` through `bus`, not yet
    awaited (it starts here, once the refusal is listened for): the permissions violation for the
    subject comes back (nats.py hands it to the connection's error callback, lowercased, which
    passes it to `Bus.error_listeners`), or no answer comes within `send`'s own timeout."""
    violation: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_error(exc: Exception) -> None:
        if f'permissions violation for publish to "{subject.lower()}"' in str(exc) and not violation.done():
            violation.set_result(None)

    bus.error_listeners.append(on_error)
    sending = asyncio.ensure_future(send)
    try:
        await asyncio.wait({sending, violation}, return_when=asyncio.FIRST_COMPLETED)
        if violation.done():
            return True
        sending.result()
    except (TimeoutError, nats.errors.Error):
        return True
    finally:
        bus.error_listeners.remove(on_error)
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await sending
    return False
