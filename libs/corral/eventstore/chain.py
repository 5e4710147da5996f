"""Verify the event log's hash chain: has anyone rewritten history behind the database's back?

Why: the append-only trigger and the service role stop the services, not a superuser (or someone
with the disk). Each row carries `hash` = sha256(previous hash || canonical text of the row),
computed by the database as the row is appended (migration 051_hash_chain). Recomputing the chain
from the rows names the first position where a row was changed, removed or inserted. The same
check runs offline on an exported bundle (`export_bundle` / `verify_bundle`): a JSON-lines file of
the rows with their hashes, which anyone can verify without the database.

`verify_rows` is pure; `verify_chain` / `export_bundle` read the store. For `corral audit verify`:
`result = await verify_chain(dsn)`; `result.ok`, `result.first_bad_position`, `result.message`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import asyncpg

_SELECT = ("SELECT position, stream, version, event_id, type, schema_version, correlation_id, causation_id, "
           "(extract(epoch FROM occurred_at) * 1000000)::bigint AS occurred_us, data::text AS data, hash "
           "FROM events WHERE position > $1 ORDER BY position LIMIT $2")
_PAGE = 5000


@dataclass(frozen=True)
class ChainRow:
    position: int
    stream: str
    version: int
    event_id: str
    type: str
    schema_version: int
    correlation_id: str | None
    causation_id: str | None
    occurred_us: int
    data: str
    hash: bytes | None


@dataclass(frozen=True)
class ChainResult:
    """`first_bad_position` None: every hashed row checks out (`checked` of them)."""

    checked: int
    first_bad_position: int | None = None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.first_bad_position is None

    @property
    def message(self) -> str:
        if self.ok:
            return f"hash chain intact: {self.checked} event(s) verified"
        return f"hash chain broken at position {self.first_bad_position}: {self.reason}"


def canonical(row: ChainRow) -> bytes:
    """The row's text as migration 051's `events_canonical` builds it."""
    fields = [str(row.position), row.stream, str(row.version), row.event_id, row.type, str(row.schema_version),
              row.correlation_id or "", row.causation_id or "", str(row.occurred_us), row.data]
    return "\n".join(fields).encode()


def chain_hash(previous: bytes | None, row: ChainRow) -> bytes:
    return hashlib.sha256((previous or b"") + canonical(row)).digest()


def verify_rows(rows: Iterable[ChainRow]) -> ChainResult:
    """Recompute the chain over rows in position order. Rows from before the chain existed (hash
    NULL, at the start of the log) are skipped; after the first hashed row, every row must follow
    its predecessor (no gap) and carry the recomputed hash."""
    previous: bytes | None = None
    last: int | None = None
    checked = 0
    for row in rows:
        if row.hash is None and checked == 0:
            last = row.position
            continue
        if last is not None and row.position != last + 1:
            return ChainResult(checked, last + 1, f"position {last + 1} is missing (next is {row.position})")
        if row.hash is None or chain_hash(previous, row) != bytes(row.hash):
            return ChainResult(checked, row.position, "the row's content does not match its hash (changed)"
                               if row.hash is not None else "the row has no hash (inserted behind the log)")
        previous, last, checked = bytes(row.hash), row.position, checked + 1
    return ChainResult(checked)


async def _rows(conn: asyncpg.Connection) -> list[ChainRow]:
    out: list[ChainRow] = []
    after = 0
    while True:
        page = await conn.fetch(_SELECT, after, _PAGE)
        if not page:
            return out
        out.extend(ChainRow(**dict(r)) for r in page)
        after = page[-1]["position"]


async def verify_chain(dsn: str) -> ChainResult:
    """Verify the log of the database at `dsn` (read-only)."""
    conn = await asyncpg.connect(dsn)
    try:
        return verify_rows(await _rows(conn))
    finally:
        await conn.close()


async def export_bundle(dsn: str, path: Path) -> int:
    """Write every event row with its hash as JSON lines; return how many. `verify_bundle` checks it."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await _rows(conn)
    finally:
        await conn.close()
    with path.open("w") as f:
        for row in rows:
            raw = dict(row.__dict__)
            raw["hash"] = row.hash.hex() if row.hash is not None else None
            f.write(json.dumps(raw, separators=(",", ":")) + "\n")
    return len(rows)


def verify_bundle(path: Path) -> ChainResult:
    """Verify an exported bundle offline (no database)."""
    def rows() -> Iterable[ChainRow]:
        with path.open() as f:
            for line in f:
                raw = json.loads(line)
                raw["hash"] = bytes.fromhex(raw["hash"]) if raw["hash"] is not None else None
                yield ChainRow(**raw)
    return verify_rows(rows())
