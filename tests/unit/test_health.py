"""The health file behind `corral healthcheck`."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from corral.health import beat, fresh


def test_fresh_only_when_touched_within_max_age(tmp_path: Path) -> None:
    f = tmp_path / "health"
    assert not fresh(f, 30)
    f.touch()
    os.utime(f, (1000.0, 1000.0))
    assert fresh(f, 30, now=1029.0) and not fresh(f, 30, now=1031.0)


async def test_beat_touches_only_while_connected(tmp_path: Path) -> None:
    f, connected = tmp_path / "d" / "health", [False]
    task = asyncio.create_task(beat(f, lambda: connected[0], interval=0.01))
    await asyncio.sleep(0.05)
    assert not f.exists()
    connected[0] = True
    await asyncio.sleep(0.05)
    task.cancel()
    assert fresh(f, 5)


def test_healthcheck_url_asks_the_endpoint_and_fails_on_anything_but_200() -> None:
    """`corral healthcheck --url` (docker-compose's probe): 200 is healthy; 503, a path nothing
    serves or a closed port is not; a bare path is on this host at CORRAL_METRICS_ADDR."""
    import http.server
    import threading

    from typer.testing import CliRunner

    from corral.cli.main import app
    from corral.health import endpoint_url

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = {"/healthz": 200, "/readyz": 503}.get(self.path, 404)
            self.send_response(status)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    runner = CliRunner()
    try:
        env = {"CORRAL_METRICS_ADDR": f"0.0.0.0:{port}"}
        assert runner.invoke(app, ["healthcheck", "--url", "/healthz"], env=env).exit_code == 0
        for url in ("/readyz", "/nothing", f"http://127.0.0.1:{port}/readyz"):
            result = runner.invoke(app, ["healthcheck", "--url", url], env=env)
            assert result.exit_code == 1 and "unhealthy" in result.output, (url, result.output)
        server.shutdown()
        assert runner.invoke(app, ["healthcheck", "--url", "/healthz"], env=env).exit_code == 1
    finally:
        server.server_close()
    assert endpoint_url("/readyz", "[::1]:9") == "http://[::1]:9/readyz"
    assert endpoint_url("/healthz", None) == "http://127.0.0.1:9464/healthz"
    assert runner.invoke(app, ["healthcheck", "--url", "/healthz"], env={"CORRAL_METRICS_ADDR": "off"}).exit_code == 2
