"""`corral audit verify`: fold the whole event log and prove the invariants at every position,
and check the log's hash chain.

The events and the `allocations` table are read in one read-only, repeatable-read transaction,
so the table is compared with the fold at exactly the same head; the checks themselves are the
pure `corral.audit` module. Only the log is read: a DSN is all it needs (a restored copy too).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from corral.audit import DEFAULT_CHECKS as _DEFAULT
from corral.audit import Accounting, AllocationRow, AuditReport, Entry, audit, compare_allocations
from corral.cli.commands import CommandError
from corral.cli.exit_codes import ExitCode
from corral.contracts.problems import ContractError
from corral.contracts.registry import decode
from corral.eventstore.chain import ChainResult, verify_chain

_BATCH = 5000


@dataclass(frozen=True)
class Verified:
    """The audit's report, how many stored events did not decode, and the hash chain's check."""

    report: AuditReport
    undecodable: int
    chain: ChainResult

    @property
    def ok(self) -> bool:
        return self.report.ok and self.chain.ok


async def verify(dsn: str, grace_seconds: float) -> Verified:
    """Audit the log behind `dsn` and check its hash chain; CommandError (exit 3) when it cannot
    be read."""
    try:
        report, undecodable = await read_log(dsn, grace_seconds)
        chain = await verify_chain(dsn)
    except (TimeoutError, OSError, ConnectionError) as exc:
        raise CommandError(f"cannot read the event log at {dsn} ({type(exc).__name__}: {exc}); is `corral up` "
                           "running?", code=ExitCode.NO_CLUSTER) from None
    return Verified(report, undecodable, chain)


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


def verified_dict(verified: Verified) -> dict[str, Any]:
    """`corral audit verify --json`."""
    chain = verified.chain
    return {**report_dict(verified.report, verified.undecodable),
            "hash_chain": {"ok": chain.ok, "checked": chain.checked, "first_bad_position": chain.first_bad_position,
                           "message": chain.message}}
