"""Whether a command goes through the local gateway, and the error it raises.

Why apart from `corral.gateway.client`: every command asks (`corral.cli.session.connect`) and catches
`GatewayError` (`corral.cli.session`), and most never use the gateway: they need not import its
client and protocol for that.
"""

from __future__ import annotations

import os

from corral import environment
from corral.stack.context import GATEWAY_SOCKET_ENV, Context


class GatewayError(RuntimeError):
    """The gateway refused a request (`code`, the message says why) or could not be reached."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


def usable_credentials(path: str | None) -> bool:
    """Whether this process can read the credentials file `path`."""
    return bool(path) and os.access(path, os.R_OK)  # type: ignore[arg-type]


def gateway_socket(ctx: Context) -> str | None:
    """The gateway socket this process should use: the context's (or `CORRAL_GATEWAY`'s) when the
    context names no credential this uid can read; None when it has one, or no gateway is known."""
    socket_path = environment.get(GATEWAY_SOCKET_ENV) or ctx.gateway
    if not socket_path or usable_credentials(ctx.credentials):
        return None
    return socket_path
