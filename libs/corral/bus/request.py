"""One JetStream publish for a command-line request, without nats-py.

Why: `corral submit` and `corral cancel` are fresh processes that publish one message and wait for
JetStream's ack, with no event loop (`send`; `publish` runs it from one). Importing nats-py (its
client loads its JetStream API, a module of dataclasses) cost ~85 ms of CPU of such a call, more
than connecting with TLS (~8 ms). A publish needs only a few lines of the NATS protocol
(docs.nats.io, "Client Protocol"): the server's INFO, CONNECT with the identity, SUB to a reply
subject on the identity's own inbox prefix, HPUB with the `Nats-Msg-Id` header, and the ack that
JetStream sends to the reply subject. Anything else (no stream for the subject, an error, a server
that wants what this does not speak, a lost connection) is `NotPublished`: the caller publishes
again through `corral.bus.Bus`, which handles all of it, and the msg id makes a second publish of
the same request harmless.

The connection is made as the bus makes it (`corral.bus.options`): the context's identity, TLS
first with the installation's CA, the first server of the URL.
"""

from __future__ import annotations

import json
import secrets
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from corral import environment
from corral.bus.options import CA_ENV, identity_options, tls_context
from corral.bus.urls import server_urls

#: The largest reply read (a PubAck is ~100 bytes; an INFO a few KB).
_MAX_LINE = 1 << 16


class NotPublished(Exception):
    """This path did not get an ack; the request may or may not be stored (publish it again)."""


@dataclass(frozen=True)
class Acked:
    stream: str
    sequence: int
    duplicate: bool


#: The header JetStream deduplicates by (`corral.bus.delivery.MSG_ID`).
MSG_ID = "Nats-Msg-Id"


def _target(url: str) -> tuple[str, int, str | None, str | None]:
    first = urlsplit(server_urls(url)[0])
    return (first.hostname or "127.0.0.1", first.port or 4222,
            unquote(first.username) if first.username is not None else None,
            unquote(first.password) if first.password is not None else None)


def _headers(headers: Mapping[str, str]) -> bytes:
    lines = ["NATS/1.0"]
    for key, value in headers.items():
        if any(c in key for c in ": \r\n") or any(c in value for c in "\r\n"):
            raise NotPublished(f"header {key!r} cannot be sent as is")
        lines.append(f"{key}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def send(url: str, subject: str, data: bytes, headers: Mapping[str, str], *, credentials: str | None,
         ca: str | None, name: str, timeout: float = 5.0) -> Acked:
    """Publish `data` to `subject` with `headers` (which hold the `Nats-Msg-Id`) and wait for
    JetStream's ack, blocking (no event loop: a command-line process does nothing else meanwhile);
    NotPublished when this path cannot say it was stored."""
    try:
        return _send(url, subject, data, headers, credentials=credentials, ca=ca, name=name, timeout=timeout)
    except NotPublished:
        raise
    except (OSError, EOFError, ValueError) as exc:  # TimeoutError and ssl's errors are OSErrors
        raise NotPublished(f"{type(exc).__name__}: {exc}") from None


async def publish(url: str, subject: str, data: bytes, headers: Mapping[str, str], *, credentials: str | None,
                  ca: str | None, name: str, timeout: float = 5.0) -> Acked:
    """`send` from an event loop, in a worker thread (the loop goes on meanwhile)."""
    import asyncio

    return await asyncio.to_thread(send, url, subject, data, headers, credentials=credentials, ca=ca, name=name,
                                   timeout=timeout)


def _send(url: str, subject: str, data: bytes, headers: Mapping[str, str], *, credentials: str | None,
          ca: str | None, name: str, timeout: float) -> Acked:
    host, port, url_user, url_password = _target(url)
    identity: dict[str, Any] = identity_options(credentials or environment.get("CORRAL_NATS_CREDENTIALS"))
    if not identity and url_user:
        identity = {"user": url_user, "password": url_password, "inbox_prefix": f"_INBOX.{url_user}"}
    tls = tls_context(ca or environment.get(CA_ENV))
    deadline = time.monotonic() + timeout
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            sock = tls.wrap_socket(sock, server_hostname=host)
        lines = _Lines(sock, deadline)
        line = lines.readline()
        if not line.startswith(b"INFO "):
            raise NotPublished(f"the server said {line[:80]!r}, not INFO")
        info = json.loads(line[5:])
        if not info.get("headers") or (info.get("tls_required") and tls is None):
            raise NotPublished("the server wants what this path does not speak (TLS upgrade, no headers)")
        connect: dict[str, Any] = {"verbose": False, "pedantic": False, "tls_required": tls is not None,
                                   "name": name, "lang": "python3", "version": "corral", "protocol": 1,
                                   "headers": True, "no_responders": True, "echo": False}
        if identity.get("user"):
            connect.update(user=identity["user"], **{"pass": identity.get("password") or ""})
        reply = f"{identity.get('inbox_prefix') or '_INBOX'}.{secrets.token_hex(11)}"
        head = _headers(headers)
        sock.sendall(b"".join([
            b"CONNECT ", json.dumps(connect, separators=(",", ":")).encode(), b"\r\n",
            f"SUB {reply} 1\r\n".encode(),
            f"HPUB {subject} {reply} {len(head)} {len(head) + len(data)}\r\n".encode(), head, data, b"\r\n",
            b"PING\r\n"]))
        return _ack(lines, sock)
    finally:
        sock.close()


class _Lines:
    """The server's lines and payloads from a blocking socket, within one deadline."""

    def __init__(self, sock: Any, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buffer = b""

    def _more(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no ack within the timeout")
        self.sock.settimeout(left)
        chunk = self.sock.recv(_MAX_LINE)
        if not chunk:
            raise EOFError("the server closed the connection")
        self.buffer += chunk

    def readline(self) -> bytes:
        while b"\n" not in self.buffer:
            if len(self.buffer) > _MAX_LINE:
                raise ValueError("a line over the limit")
            self._more()
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line + b"\n"

    def read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            self._more()
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data


def _ack(lines: _Lines, sock: Any) -> Acked:
    """Read until the message on the reply subject (the ack), answering the server's pings."""
    while True:
        line = lines.readline().rstrip(b"\r\n")
        if not line:
            raise NotPublished("the server closed the connection")
        op = line.split(b" ", 1)[0].upper()
        if op == b"PING":
            sock.sendall(b"PONG\r\n")
        elif op == b"-ERR":
            raise NotPublished(line.decode(errors="replace"))
        elif op in (b"MSG", b"HMSG"):
            parts = line.split()
            total = int(parts[-1])
            head_size = int(parts[-2]) if op == b"HMSG" else 0
            body = lines.read(total + 2)
            return _acked(body[:head_size], body[head_size:total])
        # +OK, PONG, INFO (a cluster's news): nothing to do


def _acked(head: bytes, payload: bytes) -> Acked:
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) > 1 and status[1] != b"200":  # 503: no stream takes the subject
        raise NotPublished(f"status {status[1].decode(errors='replace')} (no responders: no stream for it?)")
    ack = json.loads(payload)
    if not isinstance(ack, dict) or "error" in ack or "stream" not in ack or "seq" not in ack:
        raise NotPublished(f"JetStream answered {payload[:200]!r}")
    return Acked(stream=str(ack["stream"]), sequence=int(ack["seq"]), duplicate=bool(ack.get("duplicate")))
