"""`corral dlq list|replay`: what the services could never process, and putting it back.

Why: a dead letter used to be the end of a message; after fixing its cause (a bug, a missing
queue) an operator had no way to send it again. See `corral.bus.dead_letters`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from corral.cli.commands import observe as commands
from corral.cli.output import console, fail, print_json, print_table
from corral.cli.session import require_admin, with_client

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def register(app: typer.Typer) -> None:
    dlq = typer.Typer(no_args_is_help=True, help="Dead letters: messages a service could never process.")
    app.add_typer(dlq, name="dlq")

    @dlq.command("list")
    def list_(json_out: JsonOpt = False) -> None:
        """List dead letters: SEQ, SUBJECT, CONSUMER, DELIVERIES, ERROR, AGE."""
        rows = with_client(commands.dead_letters)
        if json_out:
            print_json(rows)
            return
        print_table(f"{len(rows)} dead letter(s)", ["SEQ", "SUBJECT", "CONSUMER", "DELIVERIES", "ERROR", "AGE"],
                    [(r["seq"], r["subject"], r["consumer"], r["deliveries"],
                      r["error"] if len(r["error"]) <= 80 else r["error"][:77] + "...", _age(r["age_seconds"]))
                     for r in rows])

    @dlq.command("replay")
    def replay_(
        seq: Annotated[int | None, typer.Argument(help="SEQ of the dead letter (see `corral dlq list`).")] = None,
        all_letters: Annotated[bool, typer.Option("--all", help="Replay every dead letter.")] = False,
        json_out: JsonOpt = False,
    ) -> None:
        """Have a service republish a dead letter (a request) to its original subject, then remove
        it from the DLQ. An admin's request."""
        if (seq is None) == (not all_letters):
            fail("give one SEQ or --all (see `corral dlq list`)", code=2)
        require_admin("corral dlq replay")

        rows = with_client(lambda c: commands.replay_dead_letters(c, None if all_letters else seq))
        if json_out:
            print_json(rows)
        else:
            for r in rows:
                mark = "[green]replayed[/green]" if r["replayed"] else "[red]not replayed[/red]"
                console.print(f"{r['seq']} {r['subject'] or ''}: {mark} — {r['message']}", highlight=False)
        if any(not r["replayed"] for r in rows):
            raise SystemExit(1)
