"""deploy/prometheus and deploy/grafana are checked without Prometheus or Grafana (no promtool
here): every metric a dashboard panel or an alert rule reads is one the processes export, every
expression is balanced, every alert the issue asks for is there, the scrape targets are the
compose services on the endpoint's default port.

What the processes export is read from their registries themselves (`ServiceTelemetry` of each
service, `AgentTelemetry`), built around stand-ins of a service: no servers needed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from corral.projection import ClusterView
from corral.telemetry.agent import AgentTelemetry
from corral.telemetry.health import Phase
from corral.telemetry.metrics import ServiceTelemetry
from tests.metrics_text import parse

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "corral.json"
REQUIRED_ALERTS = {"CorralNodeLost", "CorralQueueStarvedBelowGuarantee", "CorralRelayLagging", "CorralDeadLetters"}
_METRIC = re.compile(r"\b((?:corral|process)_[a-z0-9_]+)\b")


class _Store:
    def observe_appends(self, observer: Any) -> None:
        pass

    async def relay_backlog(self, relay: str) -> tuple[int, int, None]:
        return 10, 10, None


class _Consumer:
    durable = "stand-in-events"

    async def backlog(self) -> tuple[int, int]:
        return 0, 0


def _stand_in(name: str) -> Any:
    async def stream_info(stream: str) -> Any:
        return SimpleNamespace(state=SimpleNamespace(messages=0))

    names = SimpleNamespace(stream=lambda k: k, dead_letter_stream="DLQ")
    bus = SimpleNamespace(nc=SimpleNamespace(is_connected=True), names=names,
                          js=SimpleNamespace(stream_info=stream_info))
    return SimpleNamespace(name=name, view=ClusterView(), store=_Store(), bus=bus, standby=False,
                           folded=lambda event: None, heartbeats={}, started_at=0.0)


async def exported() -> set[str]:
    """Every sample name any Corral process can export (histograms' _bucket/_sum/_count, counters'
    _total), from the families their registries declare."""
    names: set[str] = set()
    registries = []
    for service in ("admission", "quota", "placement", "preemption"):
        telemetry = ServiceTelemetry.attach(_stand_in(service))
        telemetry.consuming([_Consumer()])
        registries.append(telemetry.registry)
        await telemetry.metrics()  # the lags are asked here
    agent = AgentTelemetry({}, lambda: 0, lambda: True)
    agent.phase(Phase.CONSUMING)
    registries.append(agent.registry)
    for registry in registries:
        for metric in registry.collect():
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                        "summary": ("_sum", "_count")}.get(metric.type, ("",))
            names.update(metric.name + s for s in suffixes)
    return names


def balanced(expr: str) -> bool:
    depth: list[str] = []
    pairs = {")": "(", "}": "{", "]": "["}
    for ch in re.sub(r'"[^"]*"', '""', expr):
        if ch in "({[":
            depth.append(ch)
        elif ch in pairs and (not depth or depth.pop() != pairs[ch]):
            return False
    return not depth


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL) of every dashboard target and alert rule."""
    out = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            out.append((f"dashboard panel {panel['title']!r}", target["expr"]))
    for group in yaml.safe_load((PROMETHEUS / "rules.yml").read_text())["groups"]:
        for rule in group["rules"]:
            out.append((f"rule {rule['alert']}", rule["expr"]))
    return out


def problems(exprs: list[tuple[str, str]], known: set[str]) -> list[str]:
    found = []
    for where, expr in exprs:
        if not balanced(expr):
            found.append(f"{where}: unbalanced brackets in {expr!r}")
        for name in _METRIC.findall(expr):
            if name not in known:
                found.append(f"{where}: no process exports {name}")
    return found


async def test_every_metric_the_dashboard_and_alerts_read_is_exported() -> None:
    known = await exported()
    assert {"corral_gpus", "corral_pending_jobs", "corral_preemptions_total", "corral_relay_lag_seconds",
            "corral_job_wait_to_running_seconds_bucket", "process_start_time_seconds"} <= known
    exprs = expressions()
    assert len(exprs) > 30
    assert problems(exprs, known) == []


@pytest.mark.parametrize(("expr", "named"), [
    ("sum by (state) (corral_gpu)", "no process exports corral_gpu"),
    ("rate(corral_preemptions_total[5m]", "unbalanced"),
])
async def test_the_check_catches_a_wrong_name_or_bracket(expr: str, named: str) -> None:
    found = problems([("panel", expr)], await exported())
    assert found and named in found[0]


def test_the_rules_have_the_alerts_of_the_issue_each_complete() -> None:
    rules = [r for g in yaml.safe_load((PROMETHEUS / "rules.yml").read_text())["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} >= REQUIRED_ALERTS
    for rule in rules:
        assert {"alert", "expr", "for", "labels", "annotations"} <= set(rule), rule["alert"]
        assert rule["labels"]["severity"] in ("page", "warn") and rule["annotations"]["summary"]
    starved = next(r for r in rules if r["alert"] == "CorralQueueStarvedBelowGuarantee")
    assert starved["for"] == "10m"
    assert "> 5" in next(r for r in rules if r["alert"] == "CorralRelayLagging")["expr"]


def test_the_scrape_config_reaches_each_compose_service_on_its_own_port() -> None:
    """Each compose process has its own CORRAL_METRICS_ADDR port; the job `corral` names every one
    of them there (a broken copy fails: tests/integration/test_deploy_files.py)."""
    from tests import deploy_checks, deploy_probes

    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert config["rule_files"] == ["rules.yml"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert deploy_probes.prometheus_compose_problems(
        config, compose, lambda s: deploy_checks._env(s.get("environment"))) == []
    (static,) = [job for job in config["scrape_configs"] if job["job_name"] == "corral"]
    targets = [t for group in static["static_configs"] for t in group["targets"]]
    # the long-running processes: one-shot setup steps (identities, logins) serve no metrics
    corral_services = {name for name, s in compose.items() if (s.get("command") or [""])[0] == "corral"
                       and "CORRAL_METRICS_ADDR" in deploy_checks._env(s.get("environment"))}
    assert {t.rsplit(":", 1)[0] for t in targets} == corral_services
    relabel = next(job for job in config["scrape_configs"] if job["job_name"] == "corral-kubernetes")
    assert any(r.get("replacement") == "${1}:${2}" and "__meta_kubernetes_pod_annotation_prometheus_io_port"
               in r.get("source_labels", []) for r in relabel["relabel_configs"])


def test_the_dashboard_has_its_four_rows_and_well_formed_panels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Cluster", "Queues and fairness", "Job latency", "Reliability"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]


async def test_a_stand_in_scrape_renders() -> None:
    telemetry = ServiceTelemetry.attach(_stand_in("quota"))
    status, _, body = await telemetry.metrics()
    assert status == 200 and parse(body.decode()).values("corral_dlq_messages") == [0.0]
    assert generate_latest(telemetry.registry)
