"""Workload importers: Corral's own JSONL and public traces (Philly, Alibaba OpenB).

`load_workload("philly:FILE")`, `load_workload("openb:FILE")` or `load_workload("FILE.jsonl")`
all return the same `Workload`, so the engine never knows where jobs came from.
"""

from __future__ import annotations

from pathlib import Path

from corral.sim.importers.jsonl import load_jsonl
from corral.sim.importers.openb import load_openb
from corral.sim.importers.philly import load_philly
from corral.sim.workload import Workload, WorkloadError

IMPORTERS = {"philly": load_philly, "openb": load_openb, "jsonl": load_jsonl}


def load_workload(spec: str | Path) -> Workload:
    """Read a workload named as `KIND:FILE` (kind: philly, openb, jsonl) or a plain JSONL path."""
    text = str(spec)
    kind, sep, rest = text.partition(":")
    if sep and kind in IMPORTERS:
        return IMPORTERS[kind](Path(rest))
    if sep and len(kind) > 1 and not Path(text).exists():
        raise WorkloadError(
            f"trace {text!r}: unknown importer {kind!r}; use one of "
            f"{', '.join(sorted(IMPORTERS))} as in 'philly:FILE', or give a JSONL file path"
        )
    return load_jsonl(Path(text))


__all__ = ["IMPORTERS", "load_jsonl", "load_openb", "load_philly", "load_workload"]
