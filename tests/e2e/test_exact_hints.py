"""On a live stack: `corral why` gives the core's exact hint, and lost work is honest.

The cases a new user meets (two tests, one stack each for two cases):
- fair share: job p of team-b waits behind job j of team-a; when j ends its GPU goes to team-a's
  waiting job k, and team-b is under its guarantee. The hint names both jobs that must end and k,
  which takes the first GPU, and p's reason says team-b is under its guarantee;
- preemption: a victim that checkpoints at the signal loses no work; the reason says the work is
  lost only without a checkpoint, and the requeue says what is lost, counted from the last
  checkpoint;
- rack topology: a rack gang blocked by a job s spanning two racks; the node of the other rack can
  never help. The hint names only nodes of the rack the gang then uses, and ending the jobs it
  names starts the gang there;
- two blockers: with x and t gone the queue q is still at its ceiling (y). The hint names x and
  y, both of queue q; after cancelling x alone the gang still waits, after cancelling y it starts.
(A hint that releases running jobs by expected end until the job alone fits fails the second
test's assertions on this stack.)
(The first three and a lost node on the folded log: tests/unit/cli/test_exact_hints.py; lost work:
tests/unit/core/test_exact_hints_core.py.)
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from corral.cli.present import unblock_hint
from corral.client import Client
from corral.contracts import events as ev
from corral.contracts.jobspec import validate_job_spec
from corral.projection import JobState
from tests.e2e.conftest import StackFactory, connect, with_queues
from tests.e2e.test_cli import as_json, corral, wait_reason, wait_state


async def submit(c: Client, name: str, queue: str, **extra: Any) -> str:
    spec = validate_job_spec({"name": name, "queue": queue, "gpus_per_replica": 1, "runtime": "sim",
                              "duration_seconds": 600, **extra})
    return await c.submit(spec)


async def test_why_names_every_blocker_the_job_ahead_and_lost_work_from_the_checkpoint(
        make_stack: StackFactory) -> None:
    stack = make_stack(cluster="1x4:H100")
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 4}, {"name": "team-b", "guaranteed_gpus": 4}],
                          nodes=1)
        j = await submit(c, "j", "team-a", estimated_runtime_seconds=300)
        rs = [await submit(c, f"r{i}", "team-b", estimated_runtime_seconds=400 + 100 * i) for i in range(3)]
        for x in (j, *rs):
            await wait_state(c, x, JobState.RUNNING)
        k = await submit(c, "k", "team-a")
        p = await submit(c, "p", "team-b")
        await wait_reason(c, p, "GANG_DOES_NOT_FIT")

        # fair share: team-a (1 of 4 in use) is ahead of team-b (3 of 4): j's GPU goes to k
        blocker = as_json(corral(stack, "why", p, "--json"))["blocker"]
        assert f"job {j} ends" in blocker["unblock"] and f"job {rs[0]} ends" in blocker["unblock"], blocker
        assert f"then job {k}, ahead of it in queue team-a, takes 1 of the freed GPUs" in blocker["unblock"], blocker
        assert "queue team-b uses 3 of 4 guaranteed GPUs (under its guarantee)" in blocker["fair_share"], blocker
        assert "queue team-b uses 3 of 4 guaranteed GPUs (under its guarantee)" in blocker["message"], blocker
        assert [t["job"] for t in blocker["taken_by"]] == [k]
        shown = corral(stack, "why", p).stdout
        assert "Fair share: queue team-b uses 3 of 4" in shown and "Would unblock:" in shown, shown

        await c.cancel(j)  # as the hint said: k starts, p still needs r0's GPU
        await wait_state(c, k, JobState.RUNNING)
        view = await c.view()
        assert view.jobs[p].state is JobState.PENDING
        assert f"job {rs[0]} ends" in (unblock_hint(view, view.jobs[p], time.time()) or "")

        # preemption: a high-priority team-b job preempts one of the r jobs, which checkpoints at the signal
        await submit(c, "hi", "team-b", priority="high")
        await c.wait_for(lambda v: any(v.jobs[r].attempt >= 1 for r in rs), 60)
        view = await c.view()
        victim = next(r for r in rs if view.jobs[r].attempt >= 1)
        trail = [e for _, e in await c.job_events(victim)]
        asked = next(e for e in trail if isinstance(e, ev.PreemptRequested))
        assert "lost only if they stop without checkpointing" in asked.reason.message, asked.reason
        assert any(isinstance(e, ev.CheckpointDone) for e in trail)
        requeued = next(e for e in trail if isinstance(e, ev.JobRequeued))
        assert "GPU-seconds since its last checkpoint lost" in requeued.reason.message, requeued.reason
        assert requeued.reason.details["lost_gpu_seconds"] < 5, requeued.reason  # checkpointed at the signal
    finally:
        await c.close()


#: two racks of two 4-GPU nodes; node-1 and node-2 (one in each rack) are the only A100s, so a
#: 2x4 A100 job spans both racks
RACKS = {"node-0": ("rack-0", "H100"), "node-1": ("rack-0", "A100"),
         "node-2": ("rack-1", "A100"), "node-3": ("rack-1", "H100")}


def rack_mates(node: str) -> list[str]:
    return sorted(n for n, (rack, _) in RACKS.items() if rack == RACKS[node][0])


async def node_of(c: Client, job: str) -> str:
    await wait_state(c, job, JobState.RUNNING)
    (node,) = (await c.view()).jobs[job].nodes
    return node


async def test_a_rack_gang_hint_stays_in_its_rack_and_names_both_blockers(
        make_stack: StackFactory, tmp_path: Path) -> None:
    cluster_file = tmp_path / "cluster.json"
    cluster_file.write_text(json.dumps({"nodes": [{"name": n, "gpus": 4, "model": m, "rack": r}
                                                  for n, (r, m) in RACKS.items()]}))
    stack = make_stack(cluster=None, cluster_file=cluster_file)
    c = await connect(stack)
    rack_gang: dict[str, Any] = {"replicas": 2, "gpus_per_replica": 4, "topology": {"gang": "rack"}}
    try:
        await with_queues(c, [{"name": "r", "guaranteed_gpus": 16}, {"name": "q", "guaranteed_gpus": 8, "max_gpus": 8}],
                          nodes=4)
        # rack: s spans node-1 and node-2 (ends first); t and u hold the two H100 nodes
        s = await submit(c, "s", "r", replicas=2, gpus_per_replica=4, gpu={"model": "A100"},
                         estimated_runtime_seconds=100)
        t = await submit(c, "t", "r", gpus_per_replica=4, gpu={"model": "H100"}, estimated_runtime_seconds=900)
        u = await submit(c, "u", "r", gpus_per_replica=4, gpu={"model": "H100"}, estimated_runtime_seconds=800)
        t_node, u_node = await node_of(c, t), await node_of(c, u)
        await wait_state(c, s, JobState.RUNNING)
        assert sorted((await c.view()).jobs[s].nodes) == ["node-1", "node-2"]
        g = await submit(c, "g", "r", **rack_gang)
        await wait_reason(c, g, "GANG_DOES_NOT_FIT")
        rack = rack_mates(u_node)  # s and u ending free u's rack (t ends last)
        s_node = next(n for n in rack if n != u_node)
        hint = as_json(corral(stack, "why", g, "--json"))["blocker"]["unblock"]
        # before: "node-1 frees 4, node-2 frees 4 when job s ends; node-3 frees 4 when job u ends"
        assert f"{s_node} frees 4 when job {s} ends" in hint and f"{u_node} frees 4 when job {u} ends" in hint, hint
        assert not any(n in hint for n in RACKS if n not in rack) and f"job {t}" not in hint, hint
        for job in (s, u):
            await c.cancel(job)
        await wait_state(c, g, JobState.RUNNING)
        assert sorted((await c.view()).jobs[g].nodes) == rack

        # two blockers: x (q) shares t's rack (r), y (q) is in the other; the gang needs q's quota (x and y
        # both: q's ceiling is 8) and a whole rack (y's). t ends before y: the old hint named t
        await c.cancel(g)
        x = await submit(c, "x", "q", gpus_per_replica=4, estimated_runtime_seconds=100)
        x_node = await node_of(c, x)
        y = await submit(c, "y", "q", gpus_per_replica=4, estimated_runtime_seconds=950)
        y_node = await node_of(c, y)
        assert rack_mates(x_node) == rack_mates(t_node) != rack_mates(y_node), (t_node, x_node, y_node)
        g2 = await submit(c, "g2", "q", **rack_gang)
        await wait_reason(c, g2, "MAX_GPUS_EXCEEDED")
        hint = as_json(corral(stack, "why", g2, "--json"))["blocker"]["unblock"]
        # before: "queue q regains 4 GPUs when job x ends; then it still needs node-0 frees 4 when job t ends"
        assert f"queue q regains 4 GPUs when job {x} ends" in hint, hint
        assert f"{y_node} frees 4 when job {y} ends" in hint and f"job {t}" not in hint, hint

        await c.cancel(x)  # the first blocker alone: q still uses 4 of its 8, the gang waits
        await c.wait_for(lambda v: v.jobs[x].state is JobState.CANCELLED
                         and "uses 4 of max 8" in getattr(v.jobs[g2].reason, "message", ""), 30)
        view = await c.view()
        assert view.jobs[g2].state is JobState.PENDING
        rest = unblock_hint(view, view.jobs[g2], time.time()) or ""
        assert f"{y_node} frees 4 when job {y} ends" in rest and f"job {x}" not in rest, rest
        await c.cancel(y)  # and the second: it starts, on y's rack
        await wait_state(c, g2, JobState.RUNNING)
        assert sorted((await c.view()).jobs[g2].nodes) == rack_mates(y_node)
    finally:
        await c.close()
