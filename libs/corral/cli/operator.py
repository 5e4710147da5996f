"""Operator actions: `corral hold|release|requeue JOB`, `corral drain [--evict]|undrain NODE`
(Slurm's scontrol hold / release / requeue and DRAIN / RESUME).

Why: an operator must be able to take a node out of service before maintenance and keep a job
from starting (a broken dataset, a budget question) without cancelling it. Each action is a
request to the inbox, recorded in the log with who asked and why, and shown by `corral why`,
`corral jobs` and `corral nodes`; nothing here changes state directly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

import typer

from corral.cli.output import console, err_console, print_json
from corral.cli.session import EXIT_FAILURE, require_admin, with_client
from corral.client import Client
from corral.contracts import events as ev
from corral.contracts.envelope import Event
from corral.projection import ClusterView, JobState, JobView

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
Message = Annotated[str, typer.Option("--message", "-m", help="Why: recorded with the action.")]


RECORD_WAIT = 15.0  # seconds a command waits for its request to be recorded in the log


def _fail(message: str) -> None:
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    raise SystemExit(EXIT_FAILURE)


def _act(go: Callable[[Client], Awaitable[str | None]]) -> None:
    """Run `go`; a problem it returns is printed as one error line, exit 1."""
    problem = with_client(go)
    if problem is not None:
        _fail(problem)


async def _recorded(c: Client, job: str, request: Awaitable[Event], acts_on: str) -> str | None:
    """Send a job request and wait for what admission records for it: None when it was recorded,
    else the refusal's reason, or what became of the job (the request then changed nothing).

    The problem: the commands waited for the job's state to leave the one they act on, so a job
    placed before admission saw the hold was reported "held", and a refused request (not the job's
    owner) waited 15 s and then asked whether admission was running."""
    sent = await request
    outcome = await c.request_outcome(job, sent, RECORD_WAIT)
    if isinstance(outcome, ev.AccessDenied):
        return f"{job}: refused: {outcome.reason.message}"
    if outcome is not None:
        return None
    now = (await c.live_view(job_ids=[job])).jobs.get(job)
    if now is not None and now.state.value != acts_on:
        return f"{job}: nothing was done: the job is now {now.state.value}"
    return (f"{job}: the request was sent but not recorded within {RECORD_WAIT:.0f} s "
            "(is admission running?)")


async def _send_and_wait(c: Client, send: Awaitable[object], recorded: Callable[[ClusterView], bool],
                         subject: str, recorder: str, job_ids: list[str]) -> str | None:
    """Send a request, then wait until the log shows it recorded (None) or say who did not answer."""
    await send
    try:
        await c.wait_for(recorded, RECORD_WAIT, job_ids=job_ids)
    except TimeoutError:
        return (f"{subject}: the request was sent but not recorded within {RECORD_WAIT:.0f} s "
                f"(is {recorder} running?)")
    return None


async def _job(c: Client, job: str) -> tuple[JobView | None, str | None]:
    """The job as the read model has it, or why not."""
    j = (await c.live_view(job_ids=[job])).jobs.get(job)
    return (j, None) if j is not None else (None, f"no job {job!r}")


def _hold(job: str, release: bool, message: str, json_out: bool) -> None:
    wanted, after = (JobState.HELD, JobState.PENDING) if release else (JobState.PENDING, JobState.HELD)

    async def go(c: Client) -> str | None:
        j, problem = await _job(c, job)
        if j is None:
            return problem
        if j.state is not wanted:
            verb = "release" if release else "hold"
            fix = ("only a held job is released" if release else
                   "only a waiting job is held: a running one can be cancelled (corral cancel)")
            return f"cannot {verb} {job}: it is {j.state.value}; {fix}"
        return await _recorded(c, job, c.hold(job, release=release, message=message), wanted.value)

    _act(go)
    if json_out:
        print_json({"id": job, "state": after.value})
    else:
        console.print(f"{job} {'released: it waits for GPUs again' if release else 'held'}", highlight=False)


def _requeue(job: str, message: str, json_out: bool) -> None:
    async def go(c: Client) -> str | None:
        j, problem = await _job(c, job)
        if j is None:
            return problem
        if j.state not in (JobState.STARTING, JobState.RUNNING):
            return (f"cannot requeue {job}: it is {j.state.value}; only a starting or running job is requeued "
                    "(a waiting one already waits; corral hold keeps it from starting)")
        return await _recorded(c, job, c.requeue(job, message=message), j.state.value)

    _act(go)
    if json_out:
        print_json({"id": job, "requeue_requested": True})
    else:
        console.print(f"{job}: asked to checkpoint and stop; it then waits again (corral why {job})",
                      highlight=False)


def _drain(node: str, undrain: bool, message: str, json_out: bool, evict: bool = False) -> None:
    require_admin("corral undrain" if undrain else "corral drain")
    async def go(c: Client) -> str | None:
        view = await c.live_view()
        n = view.nodes.get(node)
        if n is None:
            return f"no node {node!r} (corral nodes lists them)"
        def done(v: ClusterView) -> bool:  # an --evict on a node drained without it is news too
            n = v.nodes[node]
            return not n.draining if undrain else n.drain is not None and (n.drain.evict or not evict)

        return await _send_and_wait(c, c.drain(node, undrain=undrain, evict=evict, message=message), done, node,
                                    "placement", [])

    _act(go)
    state = "ready" if undrain else "draining"
    if json_out:
        print_json({"node": node, "state": state})
    elif undrain:
        console.print(f"{node} takes new work again", highlight=False)
    elif evict:
        console.print(f"{node} draining: no new work; its jobs are asked to checkpoint and move", highlight=False)
    else:
        console.print(f"{node} draining: no new work; running jobs go on to their end", highlight=False)


def register(app: typer.Typer) -> None:
    @app.command()
    def hold(job: str, message: Message = "", json_out: JsonOpt = False) -> None:
        """Keep a waiting job from starting until `corral release` (its quota is given back)."""
        _hold(job, False, message, json_out)

    @app.command()
    def release(job: str, message: Message = "", json_out: JsonOpt = False) -> None:
        """Let a held job wait for GPUs again."""
        _hold(job, True, message, json_out)

    @app.command()
    def requeue(job: str, message: Message = "", json_out: JsonOpt = False) -> None:
        """Stop a running job at a checkpoint and let it wait again (resuming from the checkpoint)."""
        _requeue(job, message, json_out)

    @app.command()
    def drain(node: str, message: Message = "",
              evict: Annotated[bool, typer.Option("--evict", help="Also ask its running jobs to checkpoint and "
                                                  "move elsewhere.")] = False,
              json_out: JsonOpt = False) -> None:
        """No new work on NODE (maintenance); running jobs go on to their end, or with --evict
        checkpoint and wait again for other nodes."""
        _drain(node, False, message, json_out, evict)

    @app.command()
    def undrain(node: str, message: Message = "", json_out: JsonOpt = False) -> None:
        """NODE takes new work again."""
        _drain(node, True, message, json_out)
