"""Liveness of a Corral process for container healthchecks and Kubernetes probes.

Why: a process that exists is not one whose event loop still runs and still reaches NATS (a
wedged loop, or a process that lost every NATS server, would look healthy forever), and a
probe of docker-compose or Kubernetes that cannot speak HTTP needs another sign. With
`CORRAL_HEALTH_FILE` set, the process touches that file every few seconds while its event loop
runs and its NATS connection is up (`beat`); `corral healthcheck --file F --max-age S` (the probe)
exits 0 only when F was touched within S seconds (`fresh`).

Every process also serves `/healthz` and `/readyz` over HTTP (`corral.telemetry.health`): an
HTTP probe (Kubernetes `httpGet`) needs nothing else, and where a probe must be a command (a
docker-compose healthcheck: the image has no curl) `corral healthcheck --url /healthz` asks the
process's own endpoint (`probe_url`; a bare path is on `CORRAL_METRICS_ADDR` of the environment).
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from corral import environment

HEALTH_FILE_ENV = "CORRAL_HEALTH_FILE"
BEAT_SECONDS = 5.0


async def beat(path: Path, connected: Callable[[], bool], interval: float = BEAT_SECONDS) -> None:
    """Touch `path` every `interval` seconds while `connected()`; runs until cancelled."""
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        if connected():
            path.touch()
        await asyncio.sleep(interval)


def start_beat(connected: Callable[[], bool]) -> asyncio.Task[None] | None:
    """The beat task when `CORRAL_HEALTH_FILE` is set, else None (nothing to do)."""
    where = environment.get(HEALTH_FILE_ENV)
    if not where:
        return None
    return asyncio.create_task(beat(Path(where), connected), name="health-beat")


def fresh(path: Path, max_age: float, now: float | None = None) -> bool:
    """Whether `path` was touched within `max_age` seconds."""
    try:
        touched = path.stat().st_mtime
    except OSError:
        return False
    return (time.time() if now is None else now) - touched <= max_age


def endpoint_url(url: str, metrics_address: str | None) -> str:
    """`url` as given when it is `http://...`; a bare path (`/healthz`) on this host's telemetry
    endpoint at `metrics_address` (`HOST:PORT` as `CORRAL_METRICS_ADDR`; every interface -> 127.0.0.1).
    ValueError names what is missing."""
    if url.startswith(("http://", "https://")):
        return url
    if not url.startswith("/"):
        raise ValueError(f"--url {url!r}: expected http://HOST:PORT/PATH or a path such as /healthz")
    from corral.telemetry.endpoint import DEFAULT_ADDRESS, parse_address

    parsed = parse_address(metrics_address or DEFAULT_ADDRESS)
    if parsed is None:
        raise ValueError(f"--url {url}: the process serves no endpoint (CORRAL_METRICS_ADDR is "
                         f"{metrics_address!r}); give a full http:// URL or a HOST:PORT address")
    host = "127.0.0.1" if parsed[0] in ("0.0.0.0", "::", "") else parsed[0]
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{parsed[1]}{url}"


def probe_url(url: str, timeout: float = 5.0) -> tuple[bool, str]:
    """(healthy, what was seen): healthy only on HTTP 200 within `timeout` seconds."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status == 200, f"{url}: {answer.status}"
    except urllib.error.HTTPError as exc:
        body = exc.read(300).decode(errors="replace").strip()
        return False, f"{url}: {exc.code} {body}"
    except (OSError, ValueError) as exc:
        return False, f"{url}: {type(exc).__name__}: {exc}"
