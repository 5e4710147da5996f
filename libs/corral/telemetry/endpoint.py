"""One small HTTP endpoint per process: `/metrics`, `/healthz`, `/readyz`, on the process's event loop.

Why: Prometheus and Kubernetes probes speak HTTP; the services otherwise speak only NATS. The
endpoint runs on the service's own event loop, not in a thread: what it reports is read from the
folded view between two events, never while a fold is half done (a scrape in another thread
could see a dictionary change size mid-iteration). It answers GET and HEAD on three paths; the
figures are computed per request, so an idle endpoint costs nothing.

Where it listens: `CORRAL_METRICS_ADDR` (`HOST:PORT`, `:PORT` for every interface, port 0 for a
free one; `off` for none), or `--metrics-address` of `corral service` / `corral agent` (default
`0.0.0.0:9464`, Prometheus's port for exporters); `corral up` gives each process a free port on
127.0.0.1 and writes the addresses into the cluster context. A port that cannot be bound is
logged and the process runs on without the endpoint: metrics never stop the scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger("corral.telemetry")

METRICS_ADDR_ENV = "CORRAL_METRICS_ADDR"
DEFAULT_ADDRESS = "0.0.0.0:9464"
OFF = ("", "off", "none", "0")
#: What every process's endpoint answers (a probe or a scrape target elsewhere is a mistake).
PATHS = ("/metrics", "/healthz", "/readyz")

Response = tuple[int, str, bytes]
"""Status, content type, body."""
Route = Callable[[], Awaitable[Response]]

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error",
            503: "Service Unavailable"}


def parse_address(text: str | None) -> tuple[str, int] | None:
    """`HOST:PORT`, `:PORT` (every interface), `[::1]:PORT`, or None for `off`/empty.
    ValueError names the expected form."""
    text = (text or "").strip()
    if text.lower() in OFF:
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"metrics address {text!r}: expected HOST:PORT (e.g. 127.0.0.1:9464, :9464 for every "
                         "interface, port 0 for a free one) or 'off'")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


@dataclass
class Endpoint:
    """A listening endpoint; `address` is where it actually listens (the port chosen if 0 was asked)."""

    server: asyncio.base_events.Server
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    async def close(self) -> None:
        self.server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.server.wait_closed(), 2.0)


async def serve(host: str, port: int, routes: Mapping[str, Route]) -> Endpoint:
    """Listen on host:port and answer `routes` (path -> handler)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, ctype, body, head = await _answer(reader, routes)
            writer.write(f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\nContent-Type: {ctype}\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode())
            if not head:
                writer.write(body)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, host, port, reuse_address=True)
    bound = server.sockets[0].getsockname()
    return Endpoint(server=server, host=host, port=int(bound[1]))


async def _answer(reader: asyncio.StreamReader, routes: Mapping[str, Route]) -> tuple[int, str, bytes, bool]:
    request = await asyncio.wait_for(reader.readline(), 10.0)
    while (await asyncio.wait_for(reader.readline(), 10.0)) not in (b"\r\n", b"\n", b""):
        pass  # headers: nothing in them matters here
    parts = request.decode("latin-1").split()
    if len(parts) < 2:
        return 405, "text/plain", b"bad request\n", False
    method, path = parts[0], parts[1].split("?", 1)[0]
    if method not in ("GET", "HEAD"):
        return 405, "text/plain", b"only GET and HEAD\n", False
    route = routes.get(path)
    if route is None:
        known = ", ".join(sorted(routes))
        return 404, "text/plain", f"no such path {path}; try {known}\n".encode(), method == "HEAD"
    try:
        status, ctype, body = await route()
    except Exception as exc:  # a bug in a collector must not take the endpoint down
        log.exception("telemetry endpoint: %s failed", path)
        status, ctype, body = 500, "text/plain", f"{type(exc).__name__}: {exc}\n".encode()
    return status, ctype, body, method == "HEAD"


async def start(address: str | None, routes: Mapping[str, Route], what: str) -> Endpoint | None:
    """The endpoint at `address` (see `parse_address`), or None when off or the port is taken
    (logged: the process runs on without it)."""
    try:
        parsed = parse_address(address)
    except ValueError as exc:
        log.error("%s: %s; running without a metrics endpoint", what, exc)
        return None
    if parsed is None:
        return None
    try:
        endpoint = await serve(parsed[0], parsed[1], routes)
    except OSError as exc:
        log.error("%s: cannot listen on %s:%d for /metrics (%s); running without a metrics endpoint", what,
                  parsed[0], parsed[1], exc)
        return None
    log.info("%s: /metrics, /healthz and /readyz on http://%s", what, endpoint.address)
    return endpoint
