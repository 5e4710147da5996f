"""`corral audit verify`: fold the whole event log and prove the invariants at every position.

Why: after a crash, a chaos run or a restore from backup, an operator needs one command that says
"the log never had a GPU held twice, a gang half placed, a job lost" — or names the first position
where it did. The events and the `allocations` table are read in one read-only, repeatable-read
transaction, so the table is compared with the fold at exactly the same head; the checks
themselves are the pure `corral.audit` module.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Annotated, Any

import typer

from corral import environment
from corral.audit import DEFAULT_CHECKS as _DEFAULT
from corral.audit import Accounting, AllocationRow, AuditReport, Entry, audit, compare_allocations
from corral.cli.output import console, err_console, print_json, print_table
from corral.cli.session import EXIT_FAILURE, EXIT_NO_CLUSTER, ConnectionOptions, context
from corral.contracts.problems import ContractError
from corral.contracts.registry import decode
from corral.eventstore.chain import verify_chain

_BATCH = 5000


async def read_log(dsn: str, grace_seconds: float) -> tuple[AuditReport, int]:
    """Audit the log behind `dsn`; returns the report and how many stored events did not decode."""
    import asyncpg

    conn = await asyncio.wait_for(asyncpg.connect(dsn), 5.0)
    undecodable = 0
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):

            async def entries() -> AsyncIterator[Entry]:
                nonlocal undecodable
                after = 0
                while True:
                    rows = await conn.fetch("SELECT position, recorded_at, data::text AS data FROM events "
                                            "WHERE position > $1 ORDER BY position LIMIT $2", after, _BATCH)
                    if not rows:
                        return
                    for row in rows:
                        after = row["position"]
                        try:
                            yield Entry(row["position"], row["recorded_at"], decode(row["data"].encode()))
                        except ContractError:
                            undecodable += 1

            collected = [e async for e in entries()]
            now = await conn.fetchval("SELECT now()")
            table = [AllocationRow(r["node"], r["gpu"], r["job_id"], r["attempt"]) for r in await conn.fetch(
                "SELECT node, gpu, job_id, attempt FROM allocations WHERE released_by IS NULL")]
    finally:
        await conn.close()
    checks = [make() for make in _DEFAULT]
    for i, check in enumerate(checks):
        if isinstance(check, Accounting):
            checks[i] = Accounting(grace=timedelta(seconds=grace_seconds), now=now)
    report = audit(collected, checks)
    ledger = report.ledger()
    if ledger is not None:
        report.violations.extend(compare_allocations(ledger.open_allocations(), table, report.head_position))
        report.violations.sort(key=lambda v: v.position)
    return report, undecodable


def report_dict(report: AuditReport, undecodable: int) -> dict[str, Any]:
    return {"ok": report.ok, "events": report.events, "head_position": report.head_position,
            "undecodable_events": undecodable, "checks": [c.name for c in report.checks] + ["allocations_table"],
            "violations_by_invariant": report.by_invariant(),
            "first_violation": report.first.as_dict() if report.first else None,
            "violations": [v.as_dict() for v in report.violations]}


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
            report, undecodable = asyncio.run(read_log(dsn, grace))
            chain = asyncio.run(verify_chain(dsn))
        except (TimeoutError, OSError, ConnectionError) as exc:
            err_console.print(f"[red]error:[/red] cannot read the event log at {dsn} "
                              f"({type(exc).__name__}: {exc}); is `corral up` running?", highlight=False)
            raise SystemExit(EXIT_NO_CLUSTER) from None
        if json_out:
            print_json({**report_dict(report, undecodable),
                        "hash_chain": {"ok": chain.ok, "checked": chain.checked,
                                       "first_bad_position": chain.first_bad_position, "message": chain.message}})
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
        if not report.ok or not chain.ok:
            raise SystemExit(EXIT_FAILURE)

