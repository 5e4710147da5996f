"""`corral audit verify`: fold the whole event log and prove the invariants at every position.

Why: after a crash, a chaos run or a restore from backup, an operator needs one command that says
"the log never had a GPU held twice, a gang half placed, a job lost" — or names the first position
where it did. The events and the `allocations` table are read in one read-only, repeatable-read
transaction, so the table is compared with the fold at exactly the same head; the checks
themselves are the pure `corral.audit` module. The typer declaration; the work is
`corral.cli.commands.audit`'s.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from corral import environment
from corral.cli.commands import CommandError
from corral.cli.commands import audit as commands
from corral.cli.output import console, print_json, print_table
from corral.cli.session import EXIT_FAILURE, ConnectionOptions, command_failed, context


def register(app: typer.Typer) -> None:
    audit_app = typer.Typer(no_args_is_help=True, help="Prove the cluster's invariants from the event log.")
    app.add_typer(audit_app, name="audit")

    @audit_app.command()
    def verify(
        grace: Annotated[float, typer.Option(help="Jobs that changed within this many seconds of now (or of the "
                                                  "log's head, if later) are not judged lost or stuck.")] = 60.0,
        limit: Annotated[int, typer.Option(help="Show at most this many violations in the table.")] = 20,
        json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    ) -> None:
        """Fold the whole log: no GPU held twice nor allocated out of service, no gang half placed, one
        live attempt per job, no job lost or stuck, no preemption loop, no wait escalated twice,
        allocations table = fold. Exit 1 at the first violation."""
        # Only the log is read: a --postgres DSN (or CORRAL_POSTGRES_DSN) is enough, e.g. for a restored copy.
        dsn = ConnectionOptions.postgres or environment.get("CORRAL_POSTGRES_DSN") or context().postgres_dsn
        try:
            verified = asyncio.run(commands.verify(dsn, grace))
        except CommandError as exc:
            command_failed(exc)
        report, undecodable, chain = verified.report, verified.undecodable, verified.chain
        if json_out:
            print_json(commands.verified_dict(verified))
        else:
            console.print(f"Audited {report.events} events (head position {report.head_position}"
                          + (f", {undecodable} undecodable" if undecodable else "") + ").", highlight=False)
            print_table(None, ["CHECK", "VIOLATIONS"],
                        [(c.name, sum(1 for v in report.violations if v.invariant.check == c.name))
                         for c in report.checks] +
                        [("allocations_table", report.by_invariant().get("ALLOCATIONS_DIFFER", 0)),
                         ("hash_chain", 0 if chain.ok else 1)])
            if not chain.ok:
                console.print(f"[red]FAILED[/red]: the log's hash chain breaks at position "
                              f"{chain.first_bad_position}: {chain.reason}", highlight=False)
            if report.violations:
                first = report.first
                assert first is not None
                console.print(f"[red]FAILED[/red]: first violation at position {first.position}: "
                              f"{first.invariant}: {first.message}", highlight=False)
                print_table(f"violations ({len(report.violations)}, first {min(limit, len(report.violations))})",
                            ["POSITION", "INVARIANT", "JOB", "NODE", "WHAT"],
                            [(v.position, v.invariant, v.job_id, v.node, v.message)
                             for v in report.violations[:limit]])
            elif chain.ok:
                console.print("[green]OK[/green]: every invariant holds at every position, and the hash chain "
                              "is intact.")
        if not verified.ok:
            raise SystemExit(EXIT_FAILURE)

