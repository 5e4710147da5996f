"""Every apply is a numbered version; --what-if shows the effect; quota gates it on the queues
file's standing gates and --require; --rollback restores an earlier version; the log (events,
replay) shows each step.

One stack: a recorded workload first (the what-if replays it), then the whole story of a change.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from corral.cli.commands import queue_tree
from corral.contracts import events as ev
from corral.contracts.envelope import QUEUE_GATE_STREAM, QUEUE_TREE_STREAM
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.queues import QueueSpec
from corral.projection import JobState
from tests.e2e.conftest import Cluster
from tests.e2e.test_cli import as_json, corral, write

PROPOSED = "queues:\n  - {name: team-a, guaranteed_gpus: 32, max_gpus: 32}\n  - {name: team-b, guaranteed_gpus: 0}\n"


async def test_what_if_gate_versions_and_rollback(cluster: Cluster, tmp_path: Path) -> None:
    stack, c = cluster.stack, cluster.client
    jobs = [await c.submit(validate_job_spec({"name": f"{team}{i}", "queue": team, "replicas": 1,
                                              "gpus_per_replica": 8, "runtime": "sim", "duration_seconds": 1}))
            for i in range(3) for team in ("team-a", "team-b")]
    await c.wait_for(lambda v: all(j in v.jobs and v.jobs[j].state is JobState.COMPLETED for j in jobs), 60)
    proposed = write(tmp_path, "proposed.yaml", PROPOSED)

    # --what-if: both trees side by side, nothing applied.
    shown = as_json(corral(stack, "apply", proposed, "--what-if", "--json"))
    assert shown["applied"] is False and shown["refused"] is False and shown["what_if"]["jobs"] == 6
    rows = {r["queue"]: r for r in shown["what_if"]["queues"]}
    assert set(rows) == {"team-a", "team-b"} and rows["team-a"]["jobs"] == 3
    assert rows["team-a"]["gpu_hours_before"] > 0 and rows["team-a"]["p95_wait_after"] is not None
    table = corral(stack, "apply", proposed, "--what-if").stdout
    assert "P95 WAIT" in table and "team-b" in table and "->" in table

    # --require: a criterion the what-if misses refuses the change (exit 4, not 3: no cluster) and records why.
    refused = corral(stack, "apply", proposed, "--require", "queue team-a gpu_hours >= 1000", "-m", "more for a",
                     check=False)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert "MISS" in refused.stdout and "nothing applied" in refused.stderr
    await c.wait_for(lambda v: v.versions.get(QUEUE_GATE_STREAM, 0) >= 1, 30)
    recorded = as_json(corral(stack, "events", "--type", "QueueChangeRefused", "--json"))
    assert [e["stream"] for e in recorded] == [QUEUE_GATE_STREAM]
    assert len(as_json(corral(stack, "queues", "--history", "--json"))) == 1

    # A criterion it meets: applied as version 2, with the evidence it passed.
    before_change = datetime.now(UTC)
    applied = as_json(corral(stack, "apply", proposed, "--require", "queue team-a p95_wait <= 1d",
                             "-m", "team-a's deadline", "--json"))
    assert applied["version"] == 2
    history = as_json(corral(stack, "queues", "--history", "--json"))
    assert [h["version"] for h in history] == [1, 2]
    assert history[1]["message"] == "team-a's deadline" and history[1]["changed"] == ["team-a", "team-b"]
    assert history[1]["evidence"][0]["passed"] is True
    diff = {(d["queue"], d["field"]): (d["before"], d["after"])
            for d in as_json(corral(stack, "queues", "--diff", "1", "2", "--json"))}
    assert diff[("team-a", "guaranteed_gpus")] == (16, 32) and diff[("team-b", "max_gpus")] == (32, None)
    assert (await c.view()).queues["team-a"].guaranteed_gpus == 32

    # --rollback: version 1's tree comes back, as version 3.
    back = as_json(corral(stack, "apply", "--rollback", "--json"))
    assert {k: back[k] for k in ("applied", "version", "rollback_of", "verdict")} == {
        "applied": ["team-a", "team-b"], "version": 3, "rollback_of": 1, "verdict": "done"}, back
    assert applied["evidence"][0]["passed"] is True
    now = {q["queue"]: q for q in as_json(corral(stack, "queues", "--json"))}
    assert now["team-a"]["guaranteed"] == 16 and now["team-b"]["max"] == 32
    history = queue_tree.history_rows(await c.view())  # what `corral queues --history --json` prints
    assert history[2]["rollback_of"] == 1 and history[2]["message"] == "rollback to v1"

    # The log shows both: replay before the rollback has version 2's tree, replay now version 3's.
    at_v2 = as_json(corral(stack, "replay", "--until", before_change.isoformat(), "--json"))["queue_tree"]
    latest = as_json(corral(stack, "replay", "--json"))["queue_tree"]
    assert at_v2["version"] == 1 and at_v2["queues"]["team-a"]["guaranteed_gpus"] == 16
    assert latest["version"] == 3 and latest["queues"]["team-a"]["guaranteed_gpus"] == 16

    bad = corral(stack, "apply", "--rollback", "9", check=False)
    assert bad.returncode != 0 and "between 1 and 3" in bad.stderr
    bad = corral(stack, "apply", proposed, "--require", "team-a p95 <= 2h", check=False)
    assert bad.returncode != 0 and "queue NAME METRIC OP VALUE" in bad.stderr

    # A file that, over the current tree, would promise a parent's children more than it has is
    # refused by the CLI, naming the queue; its implied parent no longer replaces the real one.
    tree = write(tmp_path, "tree.yaml", "queues:\n  - {name: lab, guaranteed_gpus: 8, max_gpus: 16}\n"
                                        "  - {name: lab/a, guaranteed_gpus: 4}\n")
    corral(stack, "apply", tree)
    child = write(tmp_path, "child.yaml", "queues:\n  - {name: lab/b, guaranteed_gpus: 2}\n")
    corral(stack, "apply", child)
    lab = {q["queue"]: q for q in as_json(corral(stack, "queues", "--json"))}["lab"]
    assert lab["guaranteed"] == 8 and lab["max"] == 16  # not an implied lab (2 GPUs, no ceiling)
    greedy = write(tmp_path, "greedy.yaml", "queues:\n  - {name: lab/b, guaranteed_gpus: 6}\n")
    bad = corral(stack, "apply", greedy, check=False)
    assert bad.returncode != 0 and "queue lab guaranteed_gpus" in bad.stderr and "10 GPUs" in bad.stderr, bad.stderr

    # Standing gates: the queues file declares them, quota checks every later change against them.
    gated = write(tmp_path, "gated.yaml", "gates: ['queue team-a gpu_hours > 0']\n"
                                          "queues:\n  - {name: team-a, guaranteed_gpus: 16, max_gpus: 32}\n")
    kept = as_json(corral(stack, "apply", gated, "-m", "team-a must keep working", "--json"))
    assert kept["evidence"][0]["criterion"] == "queue team-a gpu_hours > 0" and kept["evidence"][0]["passed"]
    starve = write(tmp_path, "starve.yaml", "queues:\n  - {name: team-a, guaranteed_gpus: 0, max_gpus: 0}\n")
    refused = corral(stack, "apply", starve, "-m", "no --require", check=False)  # the gate stands without it
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert "MISS  queue team-a gpu_hours > 0" in refused.stdout and "refused by quota" in refused.stderr
    dropped = write(tmp_path, "dropped.yaml", "gates: []\n"
                                              "queues:\n  - {name: team-a, guaranteed_gpus: 0, max_gpus: 0}\n")
    assert corral(stack, "apply", dropped, check=False).returncode == 4  # dropping a gate is itself gated
    assert (await c.view()).queues["team-a"].max_gpus == 32

    # A client records neither a refusal nor a pass: no inbox takes a QueueChangeRefused, and the
    # evidence a request carries is never read (quota replays and records its own).
    lie = ev.QueueTreeApplied.new(
        stream=QUEUE_TREE_STREAM, actor="user/liar", correlation_id="queues", user="liar",
        queues=[QueueSpec(name="team-a", guaranteed_gpus=0, max_gpus=0)],
        evidence=[ev.GateCheck(criterion="queue team-a gpu_hours > 0", queue="team-a", metric="gpu_hours", op=">",
                               threshold=0.0, before=1.0, after=1.0, passed=True)])
    await c.publish_request(lie)
    verdict = await c.await_verdict(lie, 30)
    assert verdict.refused and verdict.event is not None
    assert [e.passed for e in verdict.event.evidence] == [False]  # type: ignore[attr-defined]
    forged = ev.QueueChangeRefused.new(stream=QUEUE_GATE_STREAM, actor="user/liar", correlation_id="queues",
                                       user="liar", queues=[], evidence=[])
    with pytest.raises(ValueError, match="not an inbox type"):
        await c.publish_request(forged)
