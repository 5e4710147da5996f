"""OTLP export of traces (corral.telemetry.tracing), configured by the standard OTEL_* variables
alone, against a collector stand-in on a loopback port."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from corral.telemetry import tracing


def test_otlp_export_is_configured_by_the_standard_variables() -> None:
    """A process with OTEL_TRACES_EXPORTER=otlp and OTEL_EXPORTER_OTLP_ENDPOINT sends its spans
    there (OTLP/HTTP protobuf): a collector stand-in on a loopback port receives them."""
    received: list[tuple[str, bytes]] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != tracing.FILE_ENV}
        env.update(OTEL_TRACES_EXPORTER="otlp", OTEL_SERVICE_NAME="quota",
                   OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{server.server_port}")
        code = ("from corral.telemetry import tracing\n"
                "assert tracing.configure('ignored')\n"
                "with tracing.span('corral submit', **{'corral.job_id': 'j1'}): pass\n")
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    finally:
        server.shutdown()
    assert [path for path, _ in received] == ["/v1/traces"]
    request = ExportTraceServiceRequest.FromString(received[0][1])
    (resource,) = request.resource_spans
    assert {a.key: a.value.string_value for a in resource.resource.attributes}["service.name"] == "quota"
    assert [s.name for scope in resource.scope_spans for s in scope.spans] == ["corral submit"]
