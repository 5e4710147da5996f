"""How a command reaches the cluster, and how failures to reach it are reported.

Why: "a dead cluster gives one clear line, not a trace". Every command that talks to Corral goes
through `with_client`, which resolves the context, connects with a short timeout and turns the
expected failures into one line and a documented exit code.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import NoReturn, TypeVar

from corral.cli.commands import CommandError
from corral.cli.exit_codes import ExitCode
from corral.cli.output import err_console
from corral.client import Client
from corral.gateway.local import GatewayError, gateway_socket
from corral.stack.context import Context, NoClusterError, redacted, resolve
from corral.stack.credentials import NatsCredentials

T = TypeVar("T")

EXIT_FAILURE = ExitCode.FAILURE
EXIT_NO_CLUSTER = ExitCode.NO_CLUSTER


class ConnectionOptions:
    """Filled by the top-level callback from --nats/--postgres/--namespace/--context (or the environment)."""

    context: Path | None = None
    nats: str | None = None
    postgres: str | None = None
    namespace: str | None = None


def context(*, need_postgres: bool = True) -> Context:
    try:
        return resolve(ConnectionOptions.nats, ConnectionOptions.postgres, ConnectionOptions.namespace,
                       ConnectionOptions.context, need_postgres=need_postgres)
    except NoClusterError as exc:
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise SystemExit(EXIT_NO_CLUSTER) from None


def with_client(fn: Callable[[Client], Coroutine[object, object, T]], *, bus: bool = True, lazy_bus: bool = False,
                blocking: bool = False) -> T:
    """Run `fn` with a connected client; a cluster that does not answer is one line, exit 3, and
    a `CommandError` its line, its problems and its exit code. `lazy_bus`: NATS is reached only to
    publish (`Client.connect`), for commands that only publish requests. `blocking`: `fn` awaits
    only what a blocking client runs without an event loop (`Client.blocking`: reads,
    `await_verdict`, requests), and runs so when the context allows it (its own credential, a DSN
    that client speaks), else as without it."""
    from corral.client import BusUnreachable

    ctx = context()
    if blocking and (lazy_bus or not bus) and gateway_socket(ctx) is None:
        client = _blocking_client(ctx)
        if client is not None:
            try:
                return _run_blocking(fn, client, ctx)
            except CommandError as exc:
                command_failed(exc)

    async def run() -> T:
        try:
            client = await connect(ctx, bus=bus, timeout=5.0, lazy_bus=lazy_bus)
        except (TimeoutError, OSError, ConnectionError) as exc:
            dsn = redacted(ctx.postgres_dsn)
            where = dsn if not bus or lazy_bus else f"{ctx.nats_url} / {dsn}"
            raise _Unreachable(f"cannot reach the Corral cluster at {where} ({type(exc).__name__}: {exc}); "
                               "is `corral up` running?") from exc
        except Exception as exc:
            if type(exc).__module__.startswith(("nats", "asyncpg")):
                raise _Unreachable(f"cannot reach the Corral cluster ({type(exc).__name__}: {exc}); "
                                   "is `corral up` running?") from exc
            raise
        try:
            return await fn(client)
        except BusUnreachable as exc:
            raise _Unreachable(f"cannot reach the Corral cluster at {ctx.nats_url} / {redacted(ctx.postgres_dsn)} "
                               f"({exc}); is `corral up` running?") from exc
        finally:
            await client.close()

    import asyncio

    try:
        return asyncio.run(run())
    except _Unreachable as exc:
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise SystemExit(EXIT_NO_CLUSTER) from None
    except GatewayError as exc:  # a person without a credential, through the local gateway
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise SystemExit(EXIT_NO_CLUSTER if exc.code == "UNREACHABLE" else EXIT_FAILURE) from None
    except CommandError as exc:
        command_failed(exc)


def command_failed(exc: CommandError) -> NoReturn:
    """A command's `CommandError` on stderr: its line, each problem with its fix; exit its code."""
    err_console.print(f"[red]error:[/red] {exc.message}", highlight=False)
    for p in exc.problems:
        err_console.print(f"  [bold]{p.path}[/bold]: {p.message}" + (f"\n    hint: {p.hint}" if p.hint else ""),
                          highlight=False)
    raise SystemExit(exc.code)


def _blocking_client(ctx: Context) -> Client | None:
    """`Client.blocking` for `ctx`, None when it does not speak its DSN or migrations are pending;
    a cluster that does not answer is one line, exit 3."""
    from corral.eventstore import wire

    try:
        return Client.blocking(ctx, timeout=5.0)
    except wire.Unsupported:
        return None
    except (TimeoutError, OSError, ConnectionError) as exc:
        fail_unreachable(f"cannot reach the Corral cluster at {redacted(ctx.postgres_dsn)} ({type(exc).__name__}: "
                         f"{exc}); is `corral up` running?")
    except wire.PostgresError as exc:
        fail_unreachable(f"cannot reach the Corral cluster ({type(exc).__name__}: {exc}); is `corral up` running?")


def _run_blocking(fn: Callable[[Client], Coroutine[object, object, T]], client: Client, ctx: Context) -> T:
    from corral.client import BusUnreachable
    from corral.eventstore.wire import finish

    try:
        try:
            return finish(fn(client))
        finally:
            finish(client.close())
    except BusUnreachable as exc:
        fail_unreachable(f"cannot reach the Corral cluster at {ctx.nats_url} / {redacted(ctx.postgres_dsn)} "
                         f"({exc}); is `corral up` running?")


def fail_unreachable(message: str) -> NoReturn:
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    raise SystemExit(EXIT_NO_CLUSTER)


async def connect(ctx: Context, *, bus: bool = True, timeout: float = 5.0, lazy_bus: bool = False) -> Client:
    """A command's client: through the local gateway when the context names a gateway and no
    credential this uid can read (`corral.gateway.client`), else `Client.connect` with the
    context's own credential. The choice is the CLI's: the client itself knows no gateway."""
    socket_path = gateway_socket(ctx)
    if socket_path is not None:
        from corral.gateway.client import GatewayClient  # only a person without a credential pays for it

        return await GatewayClient.open(ctx, socket_path)
    return await Client.connect(ctx, bus=bus, timeout=timeout, lazy_bus=lazy_bus)


class _Unreachable(Exception):
    pass


def admin_problem(ctx: Context, action: str) -> str | None:
    """Why this person's login may not `action` (an admin's request: drain, undrain, apply), or None.

    NATS refuses a submitter's publish to the admins' subjects without a word to the client,
    which would wait out its 30 s retry window and end in a traceback."""

    if ctx.credentials is None:
        return None  # no login: a cluster without authentication
    try:
        creds = NatsCredentials.load(ctx.credentials)
    except (OSError, ValueError, KeyError):
        return None  # unreadable: connecting will say so
    from corral.bus.auth import Role

    if creds.role in ("", Role.ADMIN.value, Role.SUPERUSER.value):
        return None
    return (f"{action} needs the admin's login; {ctx.credentials} is the login of {creds.role} `{creds.user}`: "
            "run it where `corral up` ran, or with CORRAL_CREDENTIALS set to the admin's credentials file")


def require_admin(action: str) -> None:
    """Exit 4 (refused) with `admin_problem` when this person's login may not `action`: the bus
    would refuse the request, so it is refused here, before it is sent."""
    problem = admin_problem(context(), action)
    if problem is not None:
        err_console.print(f"[red]error:[/red] {problem}", highlight=False)
        raise SystemExit(ExitCode.REFUSED)
