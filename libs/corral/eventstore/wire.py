"""A blocking Postgres reader for a command-line process: the few statements of `corral jobs`,
`show`, `submit` and `cancel` without asyncio and asyncpg.

Why: importing asyncio and asyncpg cost such a call about a third of its CPU, more than its
queries. Postgres' frontend/backend protocol (postgresql.org/docs/current/protocol.html) needs
little for a reader: the startup message, password or SCRAM-SHA-256 authentication, TLS when the
server offers it (`sslmode` as libpq reads it), and the extended query protocol with text
parameters and text results. Rows come back as asyncpg's do (`row["name"]`, `row[0]`, the same
Python types for the types the readers use), through the same coroutine methods (`fetch`,
`fetchrow`, `fetchval`, `execute`, `transaction`), so `EventStore` and the read model run on it
unchanged: each coroutine here finishes without ever suspending, and `finish` runs one to its
end with no event loop.

Whatever this does not speak is `Unsupported` before anything is sent (a DSN option, several
hosts, an authentication method): the caller opens the store with asyncpg instead.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import select
import socket
import struct
import time
from collections.abc import Coroutine, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from corral import environment

T = TypeVar("T")

#: The DSN options read here; any other makes the DSN `Unsupported`.
_OPTIONS = {"passfile", "sslmode", "sslrootcert", "connect_timeout", "application_name", "host", "port", "user",
            "password", "dbname"}
_SSLMODES = {"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}
_SSL_REQUEST = struct.pack("!ii", 8, 80877103)


class Unsupported(Exception):
    """A DSN or server this reader does not speak: open the store with asyncpg."""


class PostgresError(Exception):
    """The server's ErrorResponse: `sqlstate` and its message."""

    def __init__(self, fields: dict[str, str]) -> None:
        super().__init__(f"{fields.get('M', 'error')} (SQLSTATE {fields.get('C', '?')})")
        self.sqlstate = fields.get("C", "")
        self.fields = fields


def finish(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro`, which must never suspend (it awaits only this module's methods), to its end."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a blocking read awaited something that suspends (it needs an event loop)")


@dataclass(frozen=True)
class Target:
    """Where and as whom to connect: a DSN as libpq and asyncpg read it."""

    host: str
    port: int
    user: str
    database: str
    password: str | None
    sslmode: str
    sslrootcert: str | None
    timeout: float

    @classmethod
    def of(cls, dsn: str, timeout: float) -> Target:
        parts = urlsplit(dsn)
        if parts.scheme not in ("postgresql", "postgres") or "," in parts.netloc:
            raise Unsupported("not a single-host postgresql:// DSN")
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        unknown = set(query) - _OPTIONS
        if unknown:
            raise Unsupported(f"DSN options {sorted(unknown)}")
        env = environment.mapping()
        host = query.get("host") or (unquote(parts.hostname) if parts.hostname else None) or env.get("PGHOST") \
            or "/run/postgresql"
        if "," in host:
            raise Unsupported("several hosts")
        port = int(query.get("port") or parts.port or env.get("PGPORT") or 5432)
        user = query.get("user") or (unquote(parts.username) if parts.username else None) or env.get("PGUSER") \
            or _login()
        database = query.get("dbname") or unquote(parts.path.lstrip("/")) or env.get("PGDATABASE") or user
        password = query.get("password") or (unquote(parts.password) if parts.password is not None else None) \
            or env.get("PGPASSWORD")
        if password is None:
            password = _passfile_password(query.get("passfile") or env.get("PGPASSFILE"), host, port, database, user)
        sslmode = query.get("sslmode") or env.get("PGSSLMODE") or "prefer"
        if sslmode not in _SSLMODES:
            raise Unsupported(f"sslmode {sslmode}")
        timeout = float(query.get("connect_timeout") or timeout)
        return cls(host, port, user, database, password, sslmode,
                   query.get("sslrootcert") or env.get("PGSSLROOTCERT"), timeout)


def _login() -> str:
    import getpass

    return getpass.getuser()


def _passfile_password(path: str | None, host: str, port: int, database: str, user: str) -> str | None:
    """The password of the first matching line of a libpq password file (`*` matches anything)."""
    file = Path(path) if path else Path.home() / ".pgpass"
    try:
        text = file.read_text()
    except OSError:
        return None
    wanted = ("localhost" if host.startswith("/") else host, str(port), database, user)
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        fields = _split_passfile_line(line)
        if len(fields) == 5 and all(f in ("*", w) for f, w in zip(fields[:4], wanted, strict=True)):
            return fields[4]
    return None


def _split_passfile_line(line: str) -> list[str]:
    fields, current, escaped = [], [], False
    for c in line:
        if escaped:
            current.append(c)
            escaped = False
        elif c == "\\":
            escaped = True
        elif c == ":":
            fields.append("".join(current))
            current = []
        else:
            current.append(c)
    fields.append("".join(current))
    return fields


class Row(tuple):
    """One result row: by position, or by column name as asyncpg's Record."""

    names: dict[str, int]

    def __getitem__(self, key: Any) -> Any:
        return super().__getitem__(self.names[key] if isinstance(key, str) else key)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self.names else default


def _decode_array(text: str, item: Any) -> list[Any]:
    """A one-dimensional array's text form (`{a,"b c",NULL}`)."""
    body, out, i = text[1:-1], [], 0
    while i < len(body):
        if body[i] == '"':
            j, chars = i + 1, []
            while body[j] != '"':
                if body[j] == "\\":
                    j += 1
                chars.append(body[j])
                j += 1
            out.append(item("".join(chars)))
            i = j + 2
        else:
            j = body.find(",", i)
            j = len(body) if j < 0 else j
            raw = body[i:j]
            out.append(None if raw == "NULL" else item(raw))
            i = j + 1
    return out


def _bytea(text: str) -> bytes:
    if not text.startswith("\\x"):
        raise Unsupported("bytea output other than hex")
    return bytes.fromhex(text[2:])


def _timestamp(text: str) -> datetime:
    return datetime.fromisoformat(text)


_INT = int
_DECODERS: dict[int, Any] = {
    16: lambda t: t == "t", 20: _INT, 21: _INT, 23: _INT, 26: _INT, 700: float, 701: float,
    17: _bytea, 25: str, 1043: str, 18: str, 19: str, 114: str, 3802: str, 2205: str, 705: str,
    1184: _timestamp, 1114: _timestamp, 1082: date.fromisoformat,
    1009: lambda t: _decode_array(t, str), 1015: lambda t: _decode_array(t, str),
    1016: lambda t: _decode_array(t, int), 1007: lambda t: _decode_array(t, int),
}


def _encode(value: Any) -> bytes | None:
    """A parameter in Postgres' text form (its type is the server's inference, or the SQL's cast)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, (int, float, str)):
        return str(value).encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return b"\\x" + bytes(value).hex().encode()
    if isinstance(value, datetime):
        return value.isoformat().encode()
    if isinstance(value, timedelta):
        return f"{value.total_seconds()} seconds".encode()
    if isinstance(value, (list, tuple)):
        return ("{" + ",".join("NULL" if v is None else '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
                               for v in value) + "}").encode()
    raise Unsupported(f"a parameter of type {type(value).__name__}")


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def _cstr(text: str) -> bytes:
    return text.encode() + b"\0"


class Connection:
    """One connection, blocking underneath, with asyncpg's coroutine methods (see the module)."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._buffer = b""

    @classmethod
    def open(cls, dsn: str, timeout: float = 5.0) -> Connection:
        """Connect and authenticate; Unsupported for what this does not speak; OSError, TimeoutError
        or PostgresError when the server is not there or says no."""
        target = Target.of(dsn, timeout)
        if target.host.startswith("/"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(target.timeout)
            sock.connect(f"{target.host}/.s.PGSQL.{target.port}")
        else:
            sock = socket.create_connection((target.host, target.port), timeout=target.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            conn = cls(_tls(sock, target))
            conn._start(target)
            conn._sock.settimeout(None)  # connected: a statement takes what it takes, as asyncpg's do
        except BaseException:
            sock.close()
            raise
        return conn

    # ---- the wire ----------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        self._sock.sendall(data)

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self._sock.recv(max(65536, n - len(self._buffer)))
            if not chunk:
                raise ConnectionError("Postgres closed the connection")
            self._buffer += chunk
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def _messages(self) -> Iterator[tuple[bytes, bytes]]:
        while True:
            head = self._read(5)
            yield head[:1], self._read(struct.unpack("!i", head[1:])[0] - 4)

    def _start(self, target: Target) -> None:
        params = {"user": target.user, "database": target.database, "client_encoding": "UTF8",
                  "DateStyle": "ISO", "TimeZone": "UTC", "application_name": "corral-cli"}
        body = struct.pack("!i", 196608) + b"".join(_cstr(k) + _cstr(v) for k, v in params.items()) + b"\0"
        self._send(struct.pack("!i", len(body) + 4) + body)
        scram: _Scram | None = None
        for kind, data in self._messages():
            if kind == b"R":
                code = struct.unpack("!i", data[:4])[0]
                if code == 0:
                    continue
                if target.password is None and code in (3, 5, 10):
                    raise PostgresError({"C": "28P01", "M": f"no password for {target.user}"})
                if code == 3:
                    self._send(_message(b"p", _cstr(target.password or "")))
                elif code == 5:
                    inner = hashlib.md5((target.password or "").encode() + target.user.encode()).hexdigest()
                    self._send(_message(b"p", _cstr("md5" + hashlib.md5(inner.encode() + data[4:8]).hexdigest())))
                elif code == 10:
                    if b"SCRAM-SHA-256\0" not in data[4:]:
                        raise Unsupported("SASL without SCRAM-SHA-256")
                    scram = _Scram(target.password or "")
                    first = scram.first()
                    self._send(_message(b"p", _cstr("SCRAM-SHA-256") + struct.pack("!i", len(first)) + first))
                elif code == 11 and scram is not None:
                    self._send(_message(b"p", scram.final(data[4:])))
                elif code == 12 and scram is not None:
                    scram.check(data[4:])
                else:
                    raise Unsupported(f"authentication method {code}")
            elif kind == b"E":
                raise PostgresError(_fields(data))
            elif kind == b"Z":
                return

    def _run(self, sql: str, args: tuple[Any, ...]) -> tuple[list[Row], str]:
        params = [_encode(a) for a in args]
        bind = b"\0\0" + struct.pack("!hh", 1, 0) + struct.pack("!h", len(params)) + b"".join(
            struct.pack("!i", -1) if p is None else struct.pack("!i", len(p)) + p for p in params) + struct.pack(
            "!hh", 1, 0)
        self._send(_message(b"P", b"\0" + _cstr(sql) + b"\0\0") + _message(b"B", bind) + _message(b"D", b"P\0")
                   + _message(b"E", b"\0\0\0\0\0") + _message(b"S", b""))
        return self._results()

    def _simple(self, sql: str) -> None:
        self._send(_message(b"Q", _cstr(sql)))
        self._results()

    def _results(self) -> tuple[list[Row], str]:
        rows: list[Row] = []
        names: dict[str, int] = {}
        decoders: list[Any] = []
        status, error = "", None
        for kind, data in self._messages():
            if kind == b"T":
                names, decoders = _description(data)
            elif kind == b"D":
                row = Row(_values(data, decoders))
                row.names = names
                rows.append(row)
            elif kind == b"C":
                status = data[:-1].decode()
            elif kind == b"E":
                error = PostgresError(_fields(data))
            elif kind == b"Z":
                if error is not None:
                    raise error
                return rows, status
        raise AssertionError("unreachable")

    def wait_notified(self, deadline: float) -> bool:
        """Wait until a NotificationResponse arrives (True) or `deadline` (False); the notices and
        parameter changes the server may send meanwhile are read and dropped."""
        while True:
            while len(self._buffer) >= 5:
                size = struct.unpack("!i", self._buffer[1:5])[0] + 1
                if len(self._buffer) < size:
                    break
                kind, self._buffer = self._buffer[:1], self._buffer[size:]
                if kind == b"A":
                    return True
            pending = getattr(self._sock, "pending", None)  # TLS: bytes already decrypted
            left = deadline - time.monotonic()
            if not (pending and pending()) and (left <= 0 or not select.select([self._sock], [], [], left)[0]):
                return False
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("Postgres closed the connection")
            self._buffer += chunk

    # ---- asyncpg's methods -------------------------------------------------------------------
    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        return self._run(sql, args)[0]

    async def fetchrow(self, sql: str, *args: Any) -> Row | None:
        rows = self._run(sql, args)[0]
        return rows[0] if rows else None

    async def fetchval(self, sql: str, *args: Any) -> Any:
        rows = self._run(sql, args)[0]
        return rows[0][0] if rows else None

    async def execute(self, sql: str, *args: Any) -> str:
        return self._run(sql, args)[1]

    @asynccontextmanager
    async def transaction(self, *, isolation: str | None = None, readonly: bool = False) -> Any:
        level = f" ISOLATION LEVEL {isolation.replace('_', ' ').upper()}" if isolation else ""
        self._simple(f"BEGIN{level}{' READ ONLY' if readonly else ''}")
        try:
            yield self
        except BaseException:
            self._simple("ROLLBACK")
            raise
        self._simple("COMMIT")

    def close(self) -> None:
        try:
            self._send(_message(b"X", b""))
        except OSError:
            pass
        self._sock.close()


class Pool:
    """asyncpg's pool as `EventStore` uses it, over one connection (a command runs one statement
    at a time). `channel`: what every append NOTIFYs (`pause` wakes on it)."""

    def __init__(self, conn: Connection, channel: str | None = None) -> None:
        self.conn = conn
        self.channel = channel
        self._listening = False

    @asynccontextmanager
    async def acquire(self) -> Any:
        yield self.conn

    async def close(self) -> None:
        self.conn.close()

    async def listen(self) -> None:
        """`EventStore.listen`: from now on an append's NOTIFY on `channel` wakes `pause`."""
        if self.channel is not None and not self._listening:
            self.conn._simple(f'LISTEN "{self.channel}"')
            self._listening = True

    async def pause(self, seconds: float) -> None:
        """`EventStore.pause`: this thread waits (nothing else runs in it) `seconds`, or less: until
        an append's NOTIFY on `channel` (a poll then reads what it wrote at once: a verdict is
        seen when it is recorded, not at the poll after). Listening starts at `listen` or else at
        the first pause; an append before it is read by the poll that follows in any case, but
        one after the poll before it wakes nothing: the pause then lasts `seconds`."""
        if self.channel is None:
            time.sleep(seconds)
            return
        await self.listen()
        self.conn.wait_notified(time.monotonic() + seconds)


def _fields(data: bytes) -> dict[str, str]:
    return {chunk[:1].decode(): chunk[1:].decode(errors="replace") for chunk in data.split(b"\0") if chunk}


def _description(data: bytes) -> tuple[dict[str, int], list[Any]]:
    count = struct.unpack("!h", data[:2])[0]
    names: dict[str, int] = {}
    decoders: list[Any] = []
    at = 2
    for i in range(count):
        end = data.index(b"\0", at)
        names[data[at:end].decode()] = i
        type_oid = struct.unpack("!i", data[end + 7:end + 11])[0]
        decoders.append(_DECODERS.get(type_oid, str))  # another type: its text, as psql shows it
        at = end + 19
    return names, decoders


def _values(data: bytes, decoders: list[Any]) -> list[Any]:
    out: list[Any] = []
    at = 2
    for decoder in decoders:
        size = struct.unpack("!i", data[at:at + 4])[0]
        at += 4
        if size < 0:
            out.append(None)
            continue
        out.append(decoder(data[at:at + size].decode()))
        at += size
    return out


def _tls(sock: socket.socket, target: Target) -> Any:
    """The socket, wrapped in TLS when `sslmode` asks for it and the server offers it."""
    if target.sslmode in ("disable", "allow") or target.host.startswith("/"):
        return sock
    sock.sendall(_SSL_REQUEST)
    answer = sock.recv(1)
    if answer != b"S":
        if target.sslmode != "prefer":
            raise PostgresError({"C": "08004", "M": "the server does not offer TLS, which sslmode asks for"})
        return sock
    import ssl

    root = target.sslrootcert or str(Path.home() / ".postgresql" / "root.crt")
    verify = target.sslmode in ("verify-ca", "verify-full") or (target.sslmode == "require" and Path(root).exists())
    context = ssl.create_default_context(cafile=root) if verify else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = target.sslmode == "verify-full"
    if not verify:
        context.verify_mode = ssl.CERT_NONE
    return context.wrap_socket(sock, server_hostname=target.host)


class _Scram:
    """SCRAM-SHA-256 (RFC 5802, RFC 7677) without channel binding, as Postgres speaks it."""

    def __init__(self, password: str, *, user: str = "", nonce: str | None = None) -> None:
        # Postgres takes the user of the startup message and ignores this one: it is left empty.
        self.password = password.encode()
        self.nonce = nonce or base64.b64encode(secrets.token_bytes(18)).decode()
        self.first_bare = f"n={user},r={self.nonce}"
        self.auth_message = b""
        self.salted = b""

    def first(self) -> bytes:
        return f"n,,{self.first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        fields = dict(item.split("=", 1) for item in server_first.decode().split(","))
        if not fields["r"].startswith(self.nonce):
            raise PostgresError({"C": "28000", "M": "the server's SCRAM nonce is not ours"})
        self.salted = hashlib.pbkdf2_hmac("sha256", self.password, base64.b64decode(fields["s"]), int(fields["i"]))
        without_proof = f"c=biws,r={fields['r']}"
        self.auth_message = f"{self.first_bare},{server_first.decode()},{without_proof}".encode()
        client_key = hmac.digest(self.salted, b"Client Key", "sha256")
        signature = hmac.digest(hashlib.sha256(client_key).digest(), self.auth_message, "sha256")
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def check(self, server_final: bytes) -> None:
        server_key = hmac.digest(self.salted, b"Server Key", "sha256")
        expected = base64.b64encode(hmac.digest(server_key, self.auth_message, "sha256")).decode()
        if server_final.decode() != f"v={expected}":
            raise PostgresError({"C": "28000", "M": "the server did not prove it knows the password"})
