"""Operator actions: drain/undrain a node (with and without --evict), hold/release and requeue a
job; each is an event with its actor and reason, shown by `corral why`, `corral jobs`, `corral nodes`.

One stack (4 nodes x 8 GPUs): three nodes drained leave room for one 8-GPU job; a held job stays
out even when GPUs free up; released, it runs. Then the long job is requeued (checkpoint, wait,
run again), and its node drained with --evict moves it once more; `corral audit verify` passes.
"""

from __future__ import annotations

from corral.contracts.jobspec import validate_job_spec
from corral.projection import JobState
from tests.e2e.conftest import Cluster
from tests.e2e.test_cli import as_json, corral


def spec(name: str, replicas: int, seconds: float) -> object:
    return validate_job_spec({"name": name, "queue": "team-a", "replicas": replicas, "gpus_per_replica": 8,
                              "runtime": "sim", "duration_seconds": seconds})


async def test_drain_hold_release_undrain(cluster: Cluster) -> None:
    stack, c = cluster.stack, cluster.client
    nodes = sorted((await c.view()).nodes)
    out = as_json(corral(stack, "drain", nodes[1], "-m", "maintenance", "--json"))
    assert (out["node"], out["state"], out["verdict"]) == (nodes[1], "draining", "done"), out
    for node in nodes[2:]:  # the same request through the client (a CLI call costs a Python start)
        await c.drain(node, message="maintenance")
    await c.wait_for(lambda v: all(v.nodes[n].draining for n in nodes[1:]), 15)
    states = {n["node"]: n["state"] for n in as_json(corral(stack, "nodes", "--json"))}
    assert states == {nodes[0]: "ready", **{n: "draining" for n in nodes[1:]}}

    # Only the ready node takes work: one 8-GPU job runs, the next waits.
    first = await c.submit(spec("first", 1, 600))
    await c.wait_for(lambda v: first in v.jobs and v.jobs[first].state is JobState.RUNNING, 30)
    assert {r.node for r in (await c.view()).jobs[first].ranks} == {nodes[0]}
    second = await c.submit(spec("second", 1, 1))
    await c.wait_for(lambda v: second in v.jobs and v.jobs[second].state is JobState.PENDING, 30)

    # Held: it stays out even when the drained nodes come back.
    assert as_json(corral(stack, "hold", second, "-m", "dataset broken", "--json"))["state"] == "HELD"
    corral(stack, "undrain", nodes[1])
    for node in nodes[2:]:
        await c.drain(node, undrain=True)
    big = await c.submit(spec("big", 2, 1))
    await c.wait_for(lambda v: big in v.jobs and v.jobs[big].state is JobState.COMPLETED, 30)
    assert (await c.view()).jobs[second].state is JobState.HELD
    why = as_json(corral(stack, "why", second, "--json"))
    assert why["state"] == "HELD" and why["blocker"]["code"] == "HELD"
    assert "dataset broken" in why["blocker"]["message"] and why["blocker"]["unblock"] == f"corral release {second}"
    after = why["blocker"]["after_release"]  # what it would wait for once released: nothing (or big's GPUs)
    assert after == "it fits now: it starts at the next scheduling cycle" or after.startswith("needs 1x8 GPUs; "), after
    shown = corral(stack, "why", second).stdout
    assert "Held — held by " in shown and "dataset broken" in shown and "Once released: " in shown, shown
    held = [s for s in why["trail"] if s["event"] == "JobHeld"]
    assert held and held[0]["actor"].startswith("user/") and "dataset broken" in held[0]["message"]

    # A running job cannot be held: the error says what to do instead.
    refused = corral(stack, "hold", first, check=False)
    assert refused.returncode != 0 and "only a waiting job is held" in refused.stderr

    corral(stack, "release", second)
    await c.wait_for(lambda v: v.jobs[second].state is JobState.COMPLETED, 30)
    drained = as_json(corral(stack, "events", "--type", "NodeDrained,NodeUndrained", "--json"))
    assert sorted(e["type"] for e in drained) == ["NodeDrained"] * 3 + ["NodeUndrained"] * 3
    assert all(e["actor"].startswith("user/") for e in drained)

    # requeue: the running job checkpoints, waits again and runs as attempt 1.
    assert as_json(corral(stack, "requeue", first, "-m", "rebalance", "--json"))["requeue_requested"]
    await c.wait_for(lambda v: v.jobs[first].attempt == 1 and v.jobs[first].state is JobState.RUNNING, 60)
    # drain --evict its node: it checkpoints and runs elsewhere as attempt 2.
    where = {r.node for r in (await c.view()).jobs[first].ranks}
    (node,) = where
    corral(stack, "drain", node, "-m", "fan noise")  # drained without --evict: the job stays ...
    assert (await c.view()).jobs[first].attempt == 1
    corral(stack, "drain", node, "--evict", "-m", "bad fan")  # ... until --evict is asked (it was dropped)
    await c.wait_for(lambda v: v.jobs[first].attempt == 2 and v.jobs[first].state is JobState.RUNNING, 60)
    assert node not in {r.node for r in (await c.view()).jobs[first].ranks}
    trail = as_json(corral(stack, "why", first, "--json"))["trail"]
    asked = [s for s in trail if s["event"] == "PreemptRequested"]
    assert [s["code"] for s in asked] == ["REQUEUE_REQUESTED", "NODE_DRAINED"]
    assert "rebalance" in asked[0]["message"] and "bad fan" in asked[1]["message"]
    assert [s["code"] for s in trail if s["event"] == "JobRequeued"] == ["PREEMPTED", "PREEMPTED"]
    refused = corral(stack, "requeue", second, check=False)
    assert refused.returncode != 0 and "only a starting or running job is requeued" in refused.stderr
    corral(stack, "audit", "verify")
