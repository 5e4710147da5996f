"""Answers a person can trust, each case one a person reads wrong otherwise:

- `corral queues` does not count pending jobs' quota reservations as GPUs in use;
- `corral submit` does not print "Submitted" and exit 0 for a job admission rejects;
- a gang larger than the cluster is refused with its numbers;
- priorities are bounded, and a queue can cap them;
- non-UTF-8 spec bytes are refused with a message, not a traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from corral.contracts import events as ev
from corral.contracts.envelope import job_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.registry import encode
from corral.projection import JobState
from tests.e2e.conftest import StackFactory, connect, handled, with_queues
from tests.e2e.test_cli import as_json, cli_env, corral, job_yaml, wait_state, write


async def test_queues_shows_gpus_in_use_apart_from_quota_reserved(make_stack: StackFactory, tmp_path: Path) -> None:
    stack = make_stack(cluster="2x8:H100")
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 16}], nodes=2)
        running = []
        for i in range(2):  # 5 + 5 GPUs: one job per node, 3 GPUs left on each
            path = write(tmp_path, f"r{i}.yaml", job_yaml(f"r{i}", "team-a", 1, 5, 600))
            running.append(as_json(corral(stack, "submit", path, "--json"))["id"])
        for job in running:
            await wait_state(c, job, JobState.RUNNING)
        # 6 GPUs on one node: the quota (16) has room, the cluster has 6 free GPUs but not on one node.
        path = write(tmp_path, "wide.yaml", job_yaml("wide", "team-a", 1, 6, 600))
        wide = as_json(corral(stack, "submit", path, "--json"))["id"]
        await c.wait_for(lambda v: wide in v.jobs and v.jobs[wide].quota_gpus == 6
                         and v.jobs[wide].state is JobState.PENDING, 30)
        row = {q["queue"]: q for q in as_json(corral(stack, "queues", "--json"))}["team-a"]
        assert row["in_use"] == 10, row  # allocated to placed gangs
        assert row["reserved"] == 16, row  # quota held, pending jobs included
        assert row["share"] <= 1.0
        table = corral(stack, "queues").stdout
        assert "RESERVED" in table and "IN USE" in table
    finally:
        await c.close()


async def test_submit_waits_for_the_verdict_and_exits_1_with_the_reason(make_stack: StackFactory,
                                                                        tmp_path: Path) -> None:
    stack = make_stack(cluster="4x8:H100")
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 16}], nodes=4)
        unknown = write(tmp_path, "unknown.yaml", job_yaml("u", "nowhere", 1, 1, 5))
        proc = corral(stack, "submit", unknown, check=False)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "QUEUE_UNKNOWN" in proc.stderr and "nowhere" in proc.stderr
        assert "Submitted" not in proc.stdout

        big = write(tmp_path, "big.yaml", job_yaml("big", "team-a", 8, 8, 5))
        proc = corral(stack, "submit", big, "--json", check=False)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        result = as_json(proc)
        assert result["state"] == "REJECTED" and result["reason_code"] == "EXCEEDS_CLUSTER", result
        assert "needs 64 GPUs; the cluster has 32" in result["reason_message"], result

        # Skipping the wait is still possible; a good job is admitted and says so.
        skipped = corral(stack, "submit", unknown, "--no-wait-admission")
        assert "Submitted" in skipped.stdout
        good = write(tmp_path, "good.yaml", job_yaml("good", "team-a", 1, 1, 5))
        proc = corral(stack, "submit", good)
        assert "Admitted" in proc.stdout or "admitted" in proc.stdout, proc.stdout

        # A submission_id used twice: admission drops the second; submit answers with the first job.
        once = write(tmp_path, "once.yaml", job_yaml("once", "team-a", 1, 1, 5, "submission_id: nightly-42\n"))
        first = as_json(corral(stack, "submit", once, "--json"))
        again = as_json(corral(stack, "submit", once, "--json"))
        assert first["state"] == again["state"] == "ADMITTED" and again["id"] == first["id"], (first, again)
    finally:
        await c.close()


async def test_priority_is_bounded_and_a_queue_may_cap_it(make_stack: StackFactory, tmp_path: Path) -> None:
    stack = make_stack(cluster="1x8:H100")
    c = await connect(stack)
    try:
        queues = write(tmp_path, "queues.yaml", "queues:\n  - {name: capped, guaranteed_gpus: 8, max_priority: 500}\n")
        corral(stack, "apply", queues)
        await with_queues(c, [{"name": "capped", "guaranteed_gpus": 8, "max_priority": 500}], nodes=1)

        huge = write(tmp_path, "huge.yaml", job_yaml("h", "capped", 1, 1, 5, "priority: 99999999\n"))
        proc = corral(stack, "submit", huge, check=False)
        assert proc.returncode == 1 and "priority" in proc.stderr and "10000" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr

        over = write(tmp_path, "over.yaml", job_yaml("o", "capped", 1, 1, 5, "priority: high\n"))
        proc = corral(stack, "submit", over, check=False)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "PRIORITY_ABOVE_QUEUE_MAX" in proc.stderr and "max_priority" in proc.stderr and "500" in proc.stderr

        fine = write(tmp_path, "fine.yaml", job_yaml("f", "capped", 1, 1, 5, "priority: normal\n"))
        corral(stack, "submit", fine)
    finally:
        await c.close()


async def test_non_utf8_spec_bytes_are_a_clear_error(make_stack: StackFactory, tmp_path: Path) -> None:
    stack = make_stack(cluster="1x8:H100")
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 8}], nodes=1)
        bad = tmp_path / "bad.yaml"
        bad.write_bytes(job_yaml("n\xe9", "team-a", 1, 1, 5).encode("latin-1"))
        proc = corral(stack, "submit", str(bad), check=False)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert "UTF-8" in proc.stderr and "byte 0xe9" in proc.stderr, proc.stderr
        piped = subprocess.run([sys.executable, "-m", "corral.cli.main", "submit", "-"], input=bad.read_bytes(),
                               capture_output=True, env=cli_env(stack), timeout=60)
        err = piped.stderr.decode()
        assert piped.returncode == 1 and "Traceback" not in err and "UTF-8" in err, err

        # The same bytes from a pipeline straight onto the inbox: admission names the problem.
        spec = validate_job_spec({"name": "latin", "queue": "team-a", "runtime": "sim", "duration_seconds": 5})
        submitted = ev.JobSubmitted.new(stream=job_stream("jlatin"), actor="user/x", correlation_id="jlatin",
                                        job_id="jlatin", spec=spec, user="x")
        raw = encode(submitted).replace(b'"latin"', b'"lat\xe9n"')
        await c.bus.publish(c.subjects.inbox("JobSubmitted"), raw, "latin-1")
        await handled(c.bus)
        assert "jlatin" not in (await c.view()).jobs
        admission_log = stack.process("admission").log_path.read_text(errors="replace")
        assert "Traceback" not in admission_log
        assert "UTF-8" in admission_log, admission_log[-2000:]
    finally:
        await c.close()
