"""Operator actions: `corral hold|release|requeue JOB`, `corral drain [--evict]|undrain NODE`
(Slurm's scontrol hold / release / requeue and DRAIN / RESUME).

Why: an operator must be able to take a node out of service before maintenance and keep a job
from starting (a broken dataset, a budget question) without cancelling it. Each action is a
request to the inbox, recorded in the log with who asked and why, and shown by `corral why`,
`corral jobs` and `corral nodes`; nothing here changes state directly. Each waits for the owning
service's verdict and exits with it (`corral.cli.verdict_report`). The typer declarations; the
work is `corral.cli.commands.operator`'s.
"""

from __future__ import annotations

from typing import Annotated

import typer

from corral.cli.commands import operator as commands
from corral.cli.session import require_admin, with_client
from corral.cli.verdict_report import VERDICT_WAIT, report
from corral.projection import JobState

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
Message = Annotated[str, typer.Option("--message", "-m", help="Why: recorded with the action.")]
VerdictWait = Annotated[float, typer.Option(
    "--verdict-timeout", min=0, help="Seconds to wait for the service's verdict (no verdict by then: exit 5).")]


def _hold(job: str, release: bool, message: str, json_out: bool, waited: float) -> None:
    after = JobState.PENDING if release else JobState.HELD
    verdict, now = with_client(lambda c: commands.hold(c, job, release=release, message=message, waited=waited))
    report(verdict, job, fields={"id": job, "state": after.value}, waited=waited, json_out=json_out,
           done=f"{job} {'released: it waits for GPUs again' if release else 'held'}", unchanged=now)


def _requeue(job: str, message: str, json_out: bool, waited: float) -> None:
    verdict, now = with_client(lambda c: commands.requeue(c, job, message=message, waited=waited))
    report(verdict, job, fields={"id": job, "requeue_requested": True}, waited=waited, json_out=json_out,
           done=f"{job}: asked to checkpoint and stop; it then waits again (corral why {job})", unchanged=now)


def _drain(node: str, undrain: bool, message: str, json_out: bool, waited: float, evict: bool = False) -> None:
    require_admin("corral undrain" if undrain else "corral drain")
    verdict = with_client(lambda c: commands.drain(c, node, undrain=undrain, evict=evict, message=message,
                                                   waited=waited))
    state = "ready" if undrain else "draining"
    if undrain:
        done = f"{node} takes new work again"
    elif evict:
        done = f"{node} draining: no new work; its jobs are asked to checkpoint and move"
    else:
        done = f"{node} draining: no new work; running jobs go on to their end"
    report(verdict, node, fields={"node": node, "state": state}, waited=waited, json_out=json_out, done=done,
           unchanged=f"{node} is already {state}" + (" (with --evict)" if evict else ""), unchanged_ok=True)


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
