"""Reaching `corral up`'s own servers from other hosts: where they listen, what agents are told.

Why: an agent on another host must be able to join a control plane that runs its own servers,
which listen on 127.0.0.1 unless told otherwise. `--listen ADDR` makes
both servers listen on ADDR (an address of this host, or 0.0.0.0 for all), the context and the
printed join command advertise it (or `--advertise-address HOST`, e.g. a DNS name, required
behind a wildcard only when this host's name is not what others dial), the TLS certificate names
it, and each `--agent-node NAME` gets the command that runs its agent on its own host: the two
files to copy there (the CA and the node's credentials) and the `corral agent` line.

Both servers stay authenticated as before: NATS over TLS with one identity per party
(`corral.bus.auth`), Postgres with a password per login (scram-sha-256).
"""

from __future__ import annotations

import ipaddress
import shlex
import socket
from dataclasses import dataclass, field
from pathlib import Path

from corral.stack.servers import WILDCARDS

LOOPBACK = "127.0.0.1"
#: Where the printed join command expects the copied files on an agent's host.
AGENT_CONFIG_DIR = Path("/etc/corral")


def check_listen(address: str) -> str:
    """`address` if a server can listen on it (an IP address literal), else a ValueError saying so."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        raise ValueError(f"--listen {address!r}: give an IP address of this host (or 0.0.0.0 for all of "
                         "them); a host name for clients goes in --advertise-address") from None


def advertised(listen: str, advertise: str | None = None) -> str:
    """The address clients are given: `advertise`, else the listen address, else (a wildcard) this
    host's name."""
    if advertise:
        return advertise
    return socket.gethostname() if listen in WILDCARDS else listen


def certificate_hosts(listen: str, advertise: str | None = None) -> tuple[str, ...]:
    """The names the server certificate must carry besides loopback and this host's name."""
    return tuple(dict.fromkeys(h for h in (advertised(listen, advertise), listen) if h not in WILDCARDS))


@dataclass(frozen=True)
class JoinCommand:
    """How the agent of `node` joins from its own host."""

    node: str
    #: Files to copy to the agent's host: (here, there).
    copy: tuple[tuple[str, str], ...]
    env: dict[str, str] = field(default_factory=dict)
    argv: tuple[str, ...] = ()

    def shell(self) -> str:
        """The command line to run there, as one shell line."""
        return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env.items()), shlex.join(self.argv)])

    def as_json(self) -> dict[str, object]:
        return {"node": self.node, "copy": [{"from": a, "to": b} for a, b in self.copy], "env": self.env,
                "argv": list(self.argv), "shell": self.shell()}


def join_command(node: str, nats_url: str, namespace: str, credentials: Path | None, ca: Path | None,
                 config_dir: Path = AGENT_CONFIG_DIR) -> JoinCommand:
    """The agent command of `node` against `nats_url`, its credentials and CA copied to `config_dir`."""
    copy: list[tuple[str, str]] = []
    env = {"CORRAL_NATS_URL": nats_url}
    if namespace != "corral":
        env["CORRAL_NAMESPACE"] = namespace
    for var, source in (("CORRAL_NATS_CA", ca), ("CORRAL_NATS_CREDENTIALS", credentials)):
        if source is not None:
            target = str(config_dir / source.name)
            copy.append((str(source), target))
            env[var] = target
    return JoinCommand(node, tuple(copy), env, ("corral", "agent", "--node", node))


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
