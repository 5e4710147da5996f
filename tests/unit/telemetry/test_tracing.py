"""Tracing hooks (corral.telemetry.tracing): off unless asked, and when on, the spans of one job
chain through the bus and the log by their `traceparent`s (the e2e test runs the real processes:
tests/e2e/test_observe.py)."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.telemetry import tracing


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),
    ({"OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "none,console"}, True),
    ({"CORRAL_TRACE_FILE": "/tmp/spans.jsonl"}, True),
    ({"CORRAL_TRACE_FILE": "/tmp/spans.jsonl", "OTEL_SDK_DISABLED": "true"}, False),
])
def test_tracing_is_on_only_when_the_environment_asks(env: dict[str, str], on: bool) -> None:
    assert tracing.wanted(env) is on


def test_off_by_default_nothing_of_the_sdk_is_loaded() -> None:
    code = ("import sys, asyncio\n"
            "import corral.client, corral.bus, corral.eventstore\n"
            "from corral.telemetry import tracing\n"
            "assert tracing.configure('x') is False\n"
            "with tracing.appending([], 'corral_append') as t: assert t is None\n"
            "with tracing.receiving('c', []): pass\n"
            "assert tracing.outgoing('a.b', None) is None and tracing.relayed('00-x', 'T', 's', 1) is None\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))\n")
    env = {k: v for k, v in __import__("os").environ.items()
           if not k.startswith("OTEL_") and k != tracing.FILE_ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]"


@dataclass
class _Event:
    event_id: str
    type: str
    stream: str
    correlation_id: str | None


@dataclass
class _Message:
    subject: str
    headers: Mapping[str, str]
    data: bytes = b"{}"


@pytest.fixture
def traced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "spans.jsonl"
    monkeypatch.setenv(tracing.FILE_ENV, str(path))
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    monkeypatch.setattr(tracing, "_state", tracing._Tracing())
    assert tracing.configure("test")
    yield path
    tracing.shutdown()


def test_one_job_chains_from_the_submit_through_the_log_and_the_relay(traced: Path) -> None:
    subject = "ns.inbox.JobSubmitted"
    with tracing.span("corral submit", **{"corral.job_id": "j1"}):
        request = tracing.outgoing(subject, {tracing.CORRELATION: "j1"})
    assert request is not None and tracing.TRACEPARENT in request
    with tracing.receiving("admission-inbox", [_Message(subject, request)]):
        pass
    # later, outside any span (a reconcile): the append continues the job's latest span
    events = [_Event("E1", "JobAdmitted", "job-j1", "j1"), _Event("E2", "NodeRegistered", "node-n", "n")]
    with tracing.appending(events, "corral_append") as traces:
        assert traces is not None and set(traces) == {"E1"}  # the node's event has no trace
    relayed = tracing.relayed(traces["E1"], "JobAdmitted", "ns.events.JobAdmitted", 7)
    assert relayed is not None
    with tracing.receiving("quota-events", [_Message("ns.events.JobAdmitted",
                                                     {tracing.TRACEPARENT: relayed, tracing.CORRELATION: "j1"})]):
        pass
    # a message with a traceparent already (a relayed event) keeps it
    kept = {tracing.TRACEPARENT: relayed}
    assert tracing.outgoing("ns.events.X", kept) is kept

    spans = tracing.load_spans(traced)
    names = [s["name"] for s in spans]
    assert sorted(names) == sorted(["corral submit", "publish JobSubmitted", "receive JobSubmitted", "corral_append",
                                    "relay JobAdmitted", "receive JobAdmitted"])
    by_name = {s["name"]: s for s in spans}
    chain = ["corral submit", "publish JobSubmitted", "receive JobSubmitted", "corral_append", "relay JobAdmitted",
             "receive JobAdmitted"]
    for parent, child in itertools.pairwise(chain):
        assert by_name[child]["parent_span_id"] == by_name[parent]["span_id"], (parent, child)
    assert len({s["trace_id"] for s in spans}) == 1
    assert by_name["corral_append"]["attributes"]["corral.event_types"] == ["JobAdmitted"]


def test_a_malformed_traceparent_starts_nothing(traced: Path) -> None:
    with tracing.receiving("c", [_Message("ns.events.T", {tracing.TRACEPARENT: "garbage", tracing.CORRELATION: "j"})]):
        pass
    assert tracing.relayed("00-zz-zz-01", "T", "s", 1) is None
    with tracing.appending([_Event("E", "T", "job-j", "j")], "corral_append") as traces:
        assert traces is None
    assert not traced.exists() or tracing.load_spans(traced) == []


@dataclass
class _Stored:
    correlation_id: str | None
    trace_context: str | None


def test_a_rebuilt_process_continues_each_jobs_trace_from_the_log(traced: Path) -> None:
    stored = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    tracing.recall([_Stored("j1", "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"), _Stored("j1", stored),
                    _Stored("j2", None), _Stored(None, stored)])
    with tracing.appending([_Event("E1", "QuotaReserved", "job-j1", "j1"), _Event("E2", "T", "job-j2", "j2")],
                           "corral_append") as traces:
        assert traces is not None and set(traces) == {"E1"}
    (append,) = tracing.load_spans(traced)
    assert append["trace_id"] == "0af7651916cd43dd8448eb211c80319c" and append["parent_span_id"] == "b7ad6b7169203331"
    # a job with a span in this process already keeps it: the log is read behind live messages
    tracing.recall([_Stored("j1", "00-11111111111111111111111111111111-2222222222222222-01")])
    with tracing.appending([_Event("E3", "T", "job-j1", "j1")], "corral_append") as traces:
        assert traces is not None and traces["E3"].split("-")[1] == "0af7651916cd43dd8448eb211c80319c"



def test_a_pipelines_own_request_with_only_a_traceparent_is_continued_for_its_job(traced: Path) -> None:
    root = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    requests = [_Message("ns.inbox.JobSubmitted", {tracing.TRACEPARENT: root}, b'{"correlation_id": "j9"}'),
                _Message("ns.inbox.JobSubmitted", {}, b"not json")]
    with tracing.receiving("admission-inbox", requests):
        pass
    with tracing.appending([_Event("E9", "JobAdmitted", "job-j9", "j9")], "corral_append") as traces:
        assert traces is not None and traces["E9"].split("-")[1] == "4bf92f3577b34da6a3ce929d0e0e4736"
