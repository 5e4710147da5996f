"""How a client connects to the NATS of a Corral installation: its identity and its TLS context.

Apart from `corral.bus.bus` so that a process that publishes one request without nats-py
(`corral.bus.request`) connects exactly as the bus does.
"""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

__all__ = ["CA_ENV", "identity_options", "tls_context"]


def identity_options(path: str | None) -> dict[str, Any]:
    """nats.connect arguments of a credentials file: user, password and the identity's inbox prefix
    (its permissions allow replies only there)."""
    if not path:
        return {}
    raw = json.loads(Path(path).read_text())
    raw = raw.get("nats_identity") or raw  # a person's context file carries it (`corral user add --out`)
    return {"user": raw["user"], "password": raw["password"], "role": raw.get("role"),
            "inbox_prefix": raw.get("inbox_prefix") or f"_INBOX.{raw['user']}"}


#: Environment variable naming the CA file that verifies the nats-server (see `corral.stack.tls`).
CA_ENV = "CORRAL_NATS_CA"


def tls_context(ca: str | None) -> ssl.SSLContext | None:
    """A client TLS context that trusts only the CA file `ca` (never the system's trust store) and
    checks the server's name against its certificate; None without a CA.

    With a CA the client starts with the TLS handshake (`tls_handshake_first`) whatever the URL's
    scheme, as the nats-server of `corral up` requires."""
    if not ca:
        return None
    if ca.lstrip().startswith("-----BEGIN"):  # the PEM text itself (a person's context file carries it)
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca)
    elif not Path(ca).is_file():
        raise FileNotFoundError(f"NATS CA file {ca!r} does not exist: set CORRAL_NATS_CA (or the context's "
                                "`nats_ca`) to the `tls/ca.pem` of the data directory `corral up` wrote")
    else:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context
