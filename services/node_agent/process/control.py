"""The agent's side of the control channel: checkpoint reports a rank appends to its control file.

Why a file and not a socket: it survives the agent restarting, needs nothing in the workload but
`open`/`write`, and a rank's report is still there to read after the rank has exited. Each rank
has its own file per attempt (`CORRAL_CONTROL`), so writers never interleave; `corral.worker`
appends whole JSON lines with one write, and this reader only consumes complete lines.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from corral.contracts.worker import ControlKind

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointReport:
    """A rank says: the checkpoint for `step` is complete at `path`."""

    rank: int
    attempt: int
    path: Path
    step: int


class ControlChannel:
    """Tails one rank's control file, returning the reports that arrived since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = os.fspath(path)
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[CheckpointReport]:
        try:
            with open(self._file, "rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        reports = []
        for line in lines:
            report = _parse(line, self.path)
            if report is not None:
                reports.append(report)
        return reports


def _parse(line: bytes, path: Path) -> CheckpointReport | None:
    if not line.strip():
        return None
    try:
        record = json.loads(line)
        if record.get("kind") != ControlKind.CHECKPOINT:
            return None
        return CheckpointReport(rank=int(record["rank"]), attempt=int(record["attempt"]),
                                path=Path(record["path"]), step=int(record["step"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        # A workload bug must not take the agent down; say so in the agent's log.
        log.warning("ignoring malformed control line in %s: %r", path, line[:200])
        return None
