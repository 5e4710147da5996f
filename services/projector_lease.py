"""The CLI's read model kept current by whichever service process holds the projector lease.

Why: the read model (`corral.readmodel`) stores the folded view for the CLI, so that `corral jobs`
does not fold the whole log, and some process must keep it current.
Every service process competes for one lease, as for the outbox relay (`corral.services.relay`;
the loop is `corral.services.leased_task`'s), so whichever service survives keeps the read model
current; the projector's failures are logged and retried, never a reason to stop the service
(the CLI folds the log without it).
"""

from __future__ import annotations

import asyncio
import contextlib

from corral.eventstore import EventStore
from corral.readmodel.projector import Projector
from corral.services.base import Service
from corral.services.lease import Lease
from corral.services.leased_task import run_while_leased
from corral.services.settings import Settings


class _Projecting:
    """The projector as leased work: a task of `Projector.run`, stopped by cancelling it."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self._task: asyncio.Task[None] | None = None

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.create_task(Projector(self.store).run(), name="projector")
        return self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        if task.done():
            task.result()  # raises what stopped it
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def project_forever(store: EventStore, settings: Settings, service: Service) -> None:
    """Keep the CLI's read model current (`corral.readmodel.projector`) whenever this process holds
    the projector lease; which process competes first follows `relay_wait()`, as for the relay."""
    await run_while_leased(Lease(settings.postgres_dsn, f"corral:{settings.namespace}:projector"), service,
                           _Projecting(store), name="projector", doing="projecting the log for the CLI",
                           fatal=lambda exc: False)
