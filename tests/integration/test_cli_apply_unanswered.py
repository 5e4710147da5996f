"""`corral apply` when quota does not answer: one clear line and exit 5 (no verdict), never a traceback.

The problem (seen in CI): quota had not recorded a change within the 30 s `corral apply` waits, and
the command ended in a `TimeoutError` traceback instead of saying what happened and what to check.
Here no quota runs at all: the request is accepted by the bus and nobody records it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from corral.bus import Bus
from corral.cli.exit_codes import ExitCode
from corral.eventstore import EventStore


async def test_apply_that_quota_does_not_record_says_so_in_one_line(
        tmp_path: Path, nats_url: str, postgres_dsn: str) -> None:
    store = await EventStore.open(postgres_dsn)  # migrated: the log exists, no service runs
    bus = await Bus.connect(nats_url, "noquota")
    try:
        await bus.ensure_streams()
    finally:
        await bus.close()
        await store.close()
    queues = tmp_path / "queues.yaml"
    queues.write_text("queues:\n  - {name: team-a, guaranteed_gpus: 8}\n")
    env = {**os.environ, "CORRAL_NATS_URL": nats_url, "CORRAL_POSTGRES_DSN": postgres_dsn,
           "CORRAL_NAMESPACE": "noquota", "CORRAL_CONTEXT": "/nonexistent", "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "corral.cli.main", "apply", str(queues), "--timeout", "1"],
                          text=True, capture_output=True, env=env, timeout=120)
    assert proc.returncode == ExitCode.NO_VERDICT, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    said = " ".join(proc.stderr.split())
    assert "quota gave no verdict within 1 s" in said and "is quota running?" in said, said
    assert "may still be acted on" in said, said
