"""The job commands' work: submit, jobs, show, cancel (sbatch / squeue / scontrol / scancel).

Why apart from their typer declarations (`corral.cli.jobs`): `corral.cli.entry` runs these four
without importing typer when their arguments are plain (`corral.cli.fast`)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Collection, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from corral.cli.exit_codes import ExitCode
from corral.cli.output import console, err_console, print_json, print_table
from corral.cli.session import EXIT_FAILURE, with_client
from corral.cli.verdict_report import report
from corral.client import Client, check_spec_size
from corral.contracts import events as ev
from corral.contracts.jobspec import JobSpec, validate_job_spec
from corral.contracts.problems import ContractError, SpecError
from corral.contracts.validation import parse_document, utf8_text
from corral.readmodel.pages import JobFilter
from corral.verdicts import Verdict, VerdictKind

# The presentation (`corral.cli.present`) and the fold (`corral.projection`) are imported by the
# commands that show a job: `submit` and `cancel` send a request and read its verdict only.


def in_folder(doc: Any, folder: str) -> Any:
    """The spec document with its `workdir` made absolute against the submitter's `folder` (as
    sbatch does: a relative one is resolved there, and a `process` job without one starts there,
    not in whatever folder the node agent was started from)."""
    if not isinstance(doc, dict):
        return doc
    workdir = doc.get("workdir")
    if isinstance(workdir, str) and workdir and not workdir.startswith("/"):
        return {**doc, "workdir": os.path.normpath(os.path.join(folder, workdir))}
    if workdir is None and doc.get("runtime", "process") == "process" and folder.startswith("/"):
        return {**doc, "workdir": folder}
    return doc


def read_spec(file: str) -> JobSpec:
    """Load a spec from FILE or '-' (stdin); print every problem with its field and hint, exit 1."""
    try:
        data = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
    except OSError as exc:
        err_console.print(f"[red]error:[/red] cannot read {file}: {exc.strerror}", highlight=False)
        raise SystemExit(EXIT_FAILURE) from None
    fmt: Literal["yaml", "json"] | None = (
        "json" if file.endswith(".json") else ("yaml" if file.endswith((".yaml", ".yml")) else None))
    try:
        spec = validate_job_spec(in_folder(parse_document(utf8_text(data), fmt), os.getcwd()))
        check_spec_size(spec)
        return spec
    except SpecError as exc:
        shown = "stdin" if file == "-" else file
        err_console.print(f"[red]error:[/red] {shown} is not a valid job spec:", highlight=False)
        for p in exc.problems:
            err_console.print(f"  [bold]{p.path or '(top)'}[/bold]: {p.message}" + (f"\n    hint: {p.hint}" if p.hint
                                                                                     else ""), highlight=False)
        raise SystemExit(EXIT_FAILURE) from None


def submit(file: str, wait: bool, until_done: bool, timeout: float, no_wait_admission: bool,
           json_out: bool) -> None:
    """Submit a job (like sbatch) and wait for admission's verdict: exit 1 with the reason when it
    is rejected, 5 when none comes. A bad spec lists each problem; nothing is published. A
    submission_id you used before answers with the job it created (ids are per user)."""
    spec = read_spec(file)

    async def go(c: Client) -> dict[str, Any]:
        request = await c.submit_request(spec)
        if no_wait_admission:
            return {"id": request.job_id, "state": "SUBMITTED"}
        # A submission id its user has used before is a duplicate: the verdict is then the
        # one on the job it first created (`Client.await_verdict`).
        verdict = await c.await_verdict(request, ADMISSION_TIMEOUT)
        job_id = verdict.job_id or request.job_id
        judged = verdict_row(job_id, verdict.event) | {"verdict": verdict.kind.value}
        if not wait or judged["state"] != "ADMITTED":
            return judged
        from corral.cli.present import job_row
        from corral.projection import JobState

        done = {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.REJECTED}
        goal = done if until_done else done | {JobState.RUNNING}
        seen: set[str] = set()

        def progressed(v: Any) -> bool:
            j = v.jobs.get(job_id)
            if j is None:
                return False
            if j.state.value not in seen and not json_out:
                seen.add(j.state.value)
                shown = j.reason is not None and j.state is not JobState.RUNNING
                reason = f"  ({j.reason.code}: {j.reason.message})" if shown and j.reason else ""
                console.print(f"{job_id}: {j.state.value}{reason}", highlight=False)
            return j.state in goal

        view = await c.wait_for(progressed, timeout, job_ids=[job_id])
        return job_row(view.jobs[job_id])

    try:
        result = with_client(go, lazy_bus=True, blocking=not wait)
    except TimeoutError:
        err_console.print(f"[red]error:[/red] the job did not get there within {timeout:.0f}s; "
                          "see `corral why`", highlight=False)
        raise SystemExit(EXIT_FAILURE) from None
    if json_out:
        print_json(result)
    elif result.get("state") == "REJECTED":
        print_rejection(result)
    elif result.get("state") == "SUBMITTED":
        console.print(f"Submitted job [bold]{result['id']}[/bold]", highlight=False)
        if not no_wait_admission:
            err_console.print(f"[yellow]warning:[/yellow] admission has not judged {result['id']} within "
                              f"{ADMISSION_TIMEOUT:.0f}s (is `corral up` running?); it will when it is back: "
                              f"see `corral why {result['id']}`", highlight=False)
    elif not wait:
        console.print(f"Submitted job [bold]{result['id']}[/bold]: admitted to queue {result['queue']} "
                      f"(priority {result['prio']})", highlight=False)
    if result.get("state") in ("FAILED", "REJECTED", "CANCELLED"):
        raise SystemExit(EXIT_FAILURE)
    if result.get("state") == "SUBMITTED" and not no_wait_admission:
        raise SystemExit(ExitCode.NO_VERDICT)


def jobs(queue: str | None, state: str | None, user: str | None, all_jobs: bool, stuck: bool,
         limit: int | None, json_out: bool) -> None:
    """List jobs (like squeue): ID, NAME, QUEUE, PRIO, STATE, GPUS, NODES, AGE, REASON; the oldest
    first, a page of them, with a line saying how many more match and how to see them."""
    if stuck:
        _stuck(queue, user, json_out)
        return
    states = {s.strip().upper() for s in state.split(",")} if state else None
    shown = limit if limit is not None else (0 if json_out else JOBS_PAGE)

    from corral.cli.present import JOB_COLUMNS, job_row

    async def go(c: Client) -> tuple[list[dict[str, Any]], int]:
        page, matched = await c.jobs_page(JobFilter(queue=queue, user=user, states=states, all_jobs=all_jobs),
                                          shown or None)
        now = datetime.now(UTC)
        return [job_row(j, now) for j in page], matched

    rows, matched = with_client(go, bus=False, blocking=True)
    if json_out:
        print_json(rows)
    else:
        print_table(None, JOB_COLUMNS, [[_shown(c, r[c.lower()]) for c in JOB_COLUMNS] for r in rows],
                    below="REASON")
        hint = more_hint(len(rows), matched) or empty_listing_hint(rows, all_jobs=all_jobs, states=states)
        if hint:
            err_console.print(hint, highlight=False)


def show(job: str, json_out: bool) -> None:
    """Everything about one job: spec, state, placement (rank -> node, GPUs), checkpoint."""
    from corral.cli.present import job_detail

    async def go(c: Client) -> dict[str, Any] | None:
        j = await c.job(job)
        if j is None or j.spec is None:
            return None
        # The spec as submitted: the read model keeps no env values (whose they are is the
        # log's to say: a person's login reads their own jobs' values, others' hidden).
        submitted = next((e for _, e in await c.job_events(job) if isinstance(e, ev.JobSubmitted)), None)
        return job_detail(replace(j, spec=submitted.spec) if submitted is not None else j)

    detail = with_client(go, bus=False, blocking=True)
    if detail is None:
        err_console.print(f"[red]error:[/red] no job {job!r} (see `corral jobs --all`)", highlight=False)
        raise SystemExit(EXIT_FAILURE)
    if json_out:
        print_json(detail)
        return
    # e.g. running_since of a job that has ended: nothing to say (one print: each costs ~1 ms)
    lines = [f"[bold]{key:>13}[/bold]  {detail[key]}" for key in (
        "id", "name", "queue", "user", "prio", "state", "gpus", "attempt", "restarts", "quota_gpus", "borrowed",
        "checkpoint", "resume_from", "submitted_at", "running_since", "ended_at") if detail[key] is not None]
    if detail["reason_code"]:
        lines.append(f"[bold]{'reason':>13}[/bold]  {detail['reason_code']}: {detail['reason_message']}")
    console.print("\n".join(lines), highlight=False)
    if detail["ranks"]:
        print_table("placement", ["RANK", "NODE", "GPUS"],
                    [(r["rank"], r["node"], ",".join(map(str, r["gpus"]))) for r in detail["ranks"]])


def cancel(job: str, json_out: bool, waited: float) -> None:
    """Cancel a job (like scancel): its workers are stopped and its GPUs released. Waits for
    admission's verdict: a refusal (not your job) exits 4 with its reason."""

    async def go(c: Client) -> tuple[Verdict, str] | None:
        return await cancel_job(c, job, waited)

    answered = with_client(go, lazy_bus=True, blocking=True)
    if answered is None:
        err_console.print(f"[red]error:[/red] no job {job!r}", highlight=False)
        raise SystemExit(EXIT_FAILURE)
    verdict, now = answered
    report(verdict, job, fields={"id": job, "cancel_requested": True}, waited=waited, json_out=json_out,
           done=f"Cancellation of {job} requested and recorded: its workers are stopped and its GPUs released",
           unchanged=now)


async def cancel_job(c: Client, job: str, waited: float) -> tuple[Verdict, str] | None:
    """Ask admission to cancel `job` and read its verdict, with what the job is now when the
    verdict changed nothing (the words for it); None when there is no such job. Whether the job
    exists is admission's to find (it changes nothing for a job it does not know): the request
    goes first, and only a verdict that did nothing, or none, costs a read of the job."""
    try:
        request = await c.cancel(job)
    except ContractError:  # not a job id at all: no job has it
        return None
    verdict = await c.await_verdict(request, waited)
    if verdict.kind not in (VerdictKind.UNCHANGED, VerdictKind.NO_VERDICT):
        return verdict, ""
    j = await c.job(job)
    if j is None:
        return None
    return verdict, f"the job is {j.state.value}"


def _stuck(queue: str | None, user: str | None, json_out: bool) -> None:
    """`corral jobs --stuck`: the jobs past their queue's max_wait (escalated or about to be)."""
    from corral.cli.present import STUCK_COLUMNS, stuck_rows, stuck_table_row

    async def go(c: Client) -> list[dict[str, Any]]:
        view = await c.view()
        return [r for r in stuck_rows(view, time.time())
                if (not queue or r["queue"] == queue or r["queue"].startswith(queue + "/"))
                and (not user or r["user"] == user)]

    rows = with_client(go, bus=False)
    if json_out:
        print_json(rows)
    elif not rows:
        console.print("No job waits longer than its queue's max_wait.", highlight=False)
    else:
        now = datetime.now(UTC)
        print_table("waiting past max_wait", STUCK_COLUMNS, [stuck_table_row(r, now) for r in rows], below="BLOCKER")


#: Jobs a `corral jobs` table shows unless `--limit` says otherwise: a screenful or two; a backlog of
#: 20,000 printed whole took seconds to render and nobody reads it (squeue users filter instead).
JOBS_PAGE = 100


def more_hint(shown: int, matched: int) -> str | None:
    """The line under a table that shows only the first `shown` of `matched` jobs, or None."""
    if matched <= shown:
        return None
    return (f"... and {matched - shown:,} more ({matched:,} match; the oldest {shown:,} are shown): "
            f"`--limit N` shows N, `--limit 0` every one; narrow with --queue, --user or --state")


def empty_listing_hint(rows: Sequence[object], *, all_jobs: bool, states: Collection[str] | None) -> str | None:
    """What `corral jobs` adds under an empty table of active jobs (the demo's last words point at
    jobs that have all ended: a bare header read as "Corral lost them"), or None."""
    if rows or all_jobs or states is not None:
        return None
    return "no active jobs (`corral jobs --all` lists the ones that have ended too)"


def _shown(column: str, value: Any) -> Any:
    """Node lists break between nodes when a narrow terminal wraps them."""
    return value.replace(",", ", ") if column == "NODES" and value else value


#: How long `corral submit` waits for admission's verdict (milliseconds when the cluster is up).
ADMISSION_TIMEOUT = 30.0


def verdict_row(job_id: str, verdict: Any) -> dict[str, Any]:
    """What `corral submit` reports: ADMITTED, REJECTED (reason and problems) or SUBMITTED (no verdict yet)."""
    from corral.contracts import events as ev

    if isinstance(verdict, ev.JobAdmitted):
        return {"id": job_id, "state": "ADMITTED", "queue": verdict.queue, "prio": verdict.priority}
    if isinstance(verdict, ev.JobRejected):
        return {"id": job_id, "state": "REJECTED", "reason_code": verdict.reason.code,
                "reason_message": verdict.reason.message,
                "problems": [{"path": p.path, "message": p.message, "hint": p.hint} for p in verdict.problems]}
    return {"id": job_id, "state": "SUBMITTED"}


def print_rejection(result: dict[str, Any]) -> None:
    err_console.print(f"[red]error:[/red] job {result['id']} was rejected: {result['reason_code']}: "
                      f"{result['reason_message']}", highlight=False)
    for p in result["problems"]:
        err_console.print(f"  [bold]{p['path'] or '(top)'}[/bold]: {p['message']}"
                          + (f"\n    hint: {p['hint']}" if p["hint"] else ""), highlight=False)


def _details(event: Any) -> dict[str, Any]:
    """The figures of a step that has no reason (a WaitExceeded: its limit, its wait, its blocker)."""
    if not isinstance(event, ev.WaitExceeded):
        return {}
    blocker = event.blocker
    return {"queue": event.queue, "limit_queue": event.limit_queue, "max_wait_seconds": event.max_wait_seconds,
            "waited_seconds": event.waited_seconds, "waiting_since": event.waiting_since.isoformat(),
            "attempt": event.attempt,
            "blocker": None if blocker is None else {"code": blocker.code, "message": blocker.message}}


def _waited(event: Any) -> str:
    """A WaitExceeded in words: how long, since when, which limit."""
    from corral.cli.present import seconds_text

    where = event.queue if event.limit_queue == event.queue else f"{event.queue} (set on {event.limit_queue})"
    return (f"waited {seconds_text(event.waited_seconds)} since {event.waiting_since.isoformat()[11:19]}, past "
            f"max_wait {seconds_text(event.max_wait_seconds)} of queue {where}")


def _blocked(event: ev.WaitExceeded) -> str:
    blocker = f"{event.blocker.code}: {event.blocker.message}" if event.blocker else "no reason recorded yet"
    return f"{_waited(event)}; blocked by {blocker}"


def _by(verb: str) -> Any:
    return lambda e: f"{verb} by {e.user or e.actor}" + (f": {e.message}" if e.message else "")


#: A step of a job's trail that has no reason, in words (`corral why`), by event class.
_SUMMARIES: dict[type[Any], Any] = {
    ev.GangReserved: lambda e: "; ".join(f"rank {r.rank} -> {r.node} GPUs {','.join(map(str, r.gpus))}"
                                         for r in e.ranks),
    ev.QuotaReserved: lambda e: f"{e.gpus} GPUs of queue {e.queue}" + (f" ({e.borrowed} borrowed)" if e.borrowed
                                                                         else ""),
    ev.WorkerStarted: lambda e: f"rank {e.rank} on {e.node} (pid {e.pid}, attempt {e.attempt})",
    ev.WorkerExited: lambda e: f"rank {e.rank} on {e.node} exited {e.exit_code}",
    ev.CheckpointDone: lambda e: f"checkpoint {e.path}" + (f" at step {e.step}" if e.step is not None else ""),
    ev.JobSubmitted: lambda e: f"{e.spec.replicas}x{e.spec.gpus_per_replica} GPUs in queue {e.spec.queue} by {e.user}",
    ev.JobAdmitted: lambda e: f"queue {e.queue}, priority {e.priority}",
    ev.JobRunning: lambda e: f"every rank started (attempt {e.attempt})",
    ev.JobCompleted: lambda e: "every rank exited 0",
    ev.WaitExceeded: _blocked,
    ev.JobHeld: _by("held"),
    ev.JobHoldReleased: _by("released"),
}


def _summary(event: Any) -> str:
    summary = _SUMMARIES.get(type(event))
    return summary(event) if summary is not None else ""
