"""Operator actions: `corral hold|release|requeue JOB`, `corral drain [--evict]|undrain NODE`
(Slurm's scontrol hold / release / requeue and DRAIN / RESUME).

Why: an operator must be able to take a node out of service before maintenance and keep a job
from starting (a broken dataset, a budget question) without cancelling it. Each action is a
request to the inbox, recorded in the log with who asked and why, and shown by `corral why`,
`corral jobs` and `corral nodes`; nothing here changes state directly. Each waits for the owning
service's verdict and exits with it (`corral.cli.verdict_report`).
"""

from __future__ import annotations

from typing import Annotated

import typer

from corral.cli.output import err_console
from corral.cli.session import EXIT_FAILURE, require_admin, with_client
from corral.cli.verdict_report import VERDICT_WAIT, job_now, report
from corral.client import Client
from corral.projection import JobState, JobView
from corral.verdicts import Verdict

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
Message = Annotated[str, typer.Option("--message", "-m", help="Why: recorded with the action.")]
VerdictWait = Annotated[float, typer.Option(
    "--verdict-timeout", min=0, help="Seconds to wait for the service's verdict (no verdict by then: exit 5).")]


def _fail(message: str) -> None:
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    raise SystemExit(EXIT_FAILURE)


async def _job(c: Client, job: str) -> tuple[JobView | None, str | None]:
    """The job as the read model has it, or why not."""
    j = await c.job(job)
    return (j, None) if j is not None else (None, f"no job {job!r}")


def _hold(job: str, release: bool, message: str, json_out: bool, waited: float) -> None:
    wanted, after = (JobState.HELD, JobState.PENDING) if release else (JobState.PENDING, JobState.HELD)

    async def go(c: Client) -> tuple[Verdict, str] | str:
        j, problem = await _job(c, job)
        if j is None:
            return str(problem)
        if j.state is not wanted:
            verb = "release" if release else "hold"
            fix = ("only a held job is released" if release else
                   "only a waiting job is held: a running one can be cancelled (corral cancel)")
            return f"cannot {verb} {job}: it is {j.state.value}; {fix}"
        verdict = await c.await_verdict(await c.hold(job, release=release, message=message), waited)
        return verdict, await job_now(c, job)

    verdict, now = _answered(with_client(go))
    report(verdict, job, fields={"id": job, "state": after.value}, waited=waited, json_out=json_out,
           done=f"{job} {'released: it waits for GPUs again' if release else 'held'}", unchanged=now)


def _requeue(job: str, message: str, json_out: bool, waited: float) -> None:
    async def go(c: Client) -> tuple[Verdict, str] | str:
        j, problem = await _job(c, job)
        if j is None:
            return str(problem)
        if j.state not in (JobState.STARTING, JobState.RUNNING):
            return (f"cannot requeue {job}: it is {j.state.value}; only a starting or running job is requeued "
                    "(a waiting one already waits; corral hold keeps it from starting)")
        verdict = await c.await_verdict(await c.requeue(job, message=message), waited)
        return verdict, await job_now(c, job)

    verdict, now = _answered(with_client(go))
    report(verdict, job, fields={"id": job, "requeue_requested": True}, waited=waited, json_out=json_out,
           done=f"{job}: asked to checkpoint and stop; it then waits again (corral why {job})", unchanged=now)


def _drain(node: str, undrain: bool, message: str, json_out: bool, waited: float, evict: bool = False) -> None:
    require_admin("corral undrain" if undrain else "corral drain")

    async def go(c: Client) -> tuple[Verdict, str] | str:
        if node not in (await c.live_view()).nodes:
            return f"no node {node!r} (corral nodes lists them)"
        verdict = await c.await_verdict(await c.drain(node, undrain=undrain, evict=evict, message=message), waited)
        return verdict, ""

    verdict, _ = _answered(with_client(go))
    state = "ready" if undrain else "draining"
    if undrain:
        done = f"{node} takes new work again"
    elif evict:
        done = f"{node} draining: no new work; its jobs are asked to checkpoint and move"
    else:
        done = f"{node} draining: no new work; running jobs go on to their end"
    report(verdict, node, fields={"node": node, "state": state}, waited=waited, json_out=json_out, done=done,
           unchanged=f"{node} is already {state}" + (" (with --evict)" if evict else ""), unchanged_ok=True)


def _answered(result: tuple[Verdict, str] | str) -> tuple[Verdict, str]:
    """The verdict and what the job is now, or the problem found before sending (exit 1)."""
    if isinstance(result, str):
        _fail(result)
        raise AssertionError  # unreachable: _fail exits
    return result


def register(app: typer.Typer) -> None:
    @app.command()
    def hold(job: str, message: Message = "", json_out: JsonOpt = False, waited: VerdictWait = VERDICT_WAIT) -> None:
        """Keep a waiting job from starting until `corral release` (its quota is given back)."""
        _hold(job, False, message, json_out, waited)

    @app.command()
    def release(job: str, message: Message = "", json_out: JsonOpt = False,
                waited: VerdictWait = VERDICT_WAIT) -> None:
        """Let a held job wait for GPUs again."""
        _hold(job, True, message, json_out, waited)

    @app.command()
    def requeue(job: str, message: Message = "", json_out: JsonOpt = False,
                waited: VerdictWait = VERDICT_WAIT) -> None:
        """Stop a running job at a checkpoint and let it wait again (resuming from the checkpoint)."""
        _requeue(job, message, json_out, waited)

    @app.command()
    def drain(node: str, message: Message = "",
              evict: Annotated[bool, typer.Option("--evict", help="Also ask its running jobs to checkpoint and "
                                                  "move elsewhere.")] = False,
              json_out: JsonOpt = False, waited: VerdictWait = VERDICT_WAIT) -> None:
        """No new work on NODE (maintenance); running jobs go on to their end, or with --evict
        checkpoint and wait again for other nodes."""
        _drain(node, False, message, json_out, waited, evict)

    @app.command()
    def undrain(node: str, message: Message = "", json_out: JsonOpt = False,
                waited: VerdictWait = VERDICT_WAIT) -> None:
        """NODE takes new work again."""
        _drain(node, True, message, json_out, waited)
