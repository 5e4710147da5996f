"""Job commands: submit, jobs, show, cancel, why (sbatch / squeue / scontrol / scancel); logs in `logs`.

The typer declarations; the work of submit, jobs, show and cancel is `corral.cli.job_commands`',
why's `corral.cli.commands.jobs`'."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from corral.cli import job_commands as commands
from corral.cli.commands import jobs as why_command
from corral.cli.job_commands import (  # noqa: F401 (their home for other modules)
    JOBS_PAGE,
    _details,
    _summary,
    _waited,
    empty_listing_hint,
    in_folder,
    more_hint,
    read_spec,
)
from corral.cli.output import console, err_console, print_json, print_table
from corral.cli.session import EXIT_FAILURE, with_client
from corral.cli.verdict_report import VERDICT_WAIT

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def register(app: typer.Typer) -> None:
    @app.command()
    def submit(
        file: Annotated[str, typer.Argument(help="Job spec (YAML or JSON), or - for stdin.")],
        wait: Annotated[bool, typer.Option("--wait", help="Follow the job until it runs (or ends).")] = False,
        until_done: Annotated[bool, typer.Option("--until-done", help="With --wait: follow to the end.")] = False,
        timeout: Annotated[float, typer.Option(help="Seconds --wait follows before giving up.")] = 600.0,
        no_wait_admission: Annotated[bool, typer.Option(
            "--no-wait-admission",
            help="Return once the submission is on the bus, without waiting for admission's verdict.")] = False,
        json_out: JsonOpt = False,
    ) -> None:
        """Submit a job (like sbatch) and wait for admission's verdict: exit 1 with the reason when it
        is rejected, 5 when none comes. A bad spec lists each problem; nothing is published. A
        submission_id you used before answers with the job it created (ids are per user)."""
        commands.submit(file, wait, until_done, timeout, no_wait_admission, json_out)

    @app.command()
    def jobs(
        queue: Annotated[str | None, typer.Option(help="Only this queue (and its children).")] = None,
        state: Annotated[str | None, typer.Option(help="Only these states, comma-separated: PENDING,RUNNING.")] = None,
        user: Annotated[str | None, typer.Option(help="Only this user's jobs.")] = None,
        all_jobs: Annotated[bool, typer.Option("--all", "-a", help="Include finished jobs.")] = False,
        stuck: Annotated[bool, typer.Option("--stuck", help="Only jobs waiting longer than their queue's max_wait: "
                                            "how long past it, and what blocks them.")] = False,
        limit: Annotated[int | None, typer.Option(
            "--limit", "-n", min=0,
            help=f"Show at most N jobs, the oldest first (a table shows {JOBS_PAGE} unless told; --json all); "
                 "0: every one.")] = None,
        json_out: JsonOpt = False,
    ) -> None:
        """List jobs (like squeue): ID, NAME, QUEUE, PRIO, STATE, GPUS, NODES, AGE, REASON; the oldest
        first, a page of them, with a line saying how many more match and how to see them."""
        commands.jobs(queue, state, user, all_jobs, stuck, limit, json_out)

    @app.command()
    def show(job: str, json_out: JsonOpt = False) -> None:
        """Everything about one job: spec, state, placement (rank -> node, GPUs), checkpoint."""
        commands.show(job, json_out)

    @app.command()
    def cancel(job: str, json_out: JsonOpt = False, waited: Annotated[float, typer.Option(
            "--verdict-timeout", min=0, help="Seconds to wait for admission's verdict (none by then: exit 5).")
            ] = VERDICT_WAIT) -> None:
        """Cancel a job (like scancel): its workers are stopped and its GPUs released. Waits for
        admission's verdict: a refusal (not your job) exits 4 with its reason."""
        commands.cancel(job, json_out, waited)

    @app.command()
    def why(job: str, json_out: JsonOpt = False) -> None:
        """The decision trail of a job: every event, who decided, why; for a pending job, what blocks it."""
        result = with_client(lambda c: why_command.why(c, job, time.time()), bus=False)
        if result is None:
            err_console.print(f"[red]error:[/red] no job {job!r}", highlight=False)
            raise SystemExit(EXIT_FAILURE)
        if json_out:
            print_json(result)
            return
        print_table(f"job {job}: {result['state']}", ["AT", "EVENT", "BY", "WHY"],
                    [(s["at"][11:23], s["event"], s["actor"],
                      (f"{s['code']}: " if s["code"] else "") + (s["message"] or "")) for s in result["trail"]])
        if result["blocker"]:
            b = result["blocker"]
            if result["state"] == "HELD":  # the message says who held it and that `corral release` ends it
                console.print(f"[bold yellow]Held[/bold yellow] — {b['message']}", highlight=False)
                if b.get("after_release"):
                    console.print(f"[bold]Once released:[/bold] {b['after_release']}", highlight=False)
                return
            console.print(f"[bold yellow]Pending[/bold yellow] — {b['code']}: {b['message']}", highlight=False)
            if b.get("fair_share"):
                console.print(f"[bold]Fair share:[/bold] {b['fair_share'].removeprefix('fair share: ')}",
                              highlight=False)
            if b["unblock"]:
                console.print(f"[bold]Would unblock:[/bold] {b['unblock']}", highlight=False)
            if b.get("wait_exceeded"):
                console.print(f"[bold red]Escalated[/bold red] at {b['wait_exceeded']['at'][11:19]}: "
                              f"{b['wait_exceeded']['words']} (`corral jobs --stuck`)", highlight=False)
