"""The attempt folders of a node's run folder, by job: which attempts were launched here, and the
removal of the folders nothing needs any more.

Why an index: a redelivered reservation must not launch its attempt again (`Supervisor.start`);
the folders say what was launched here, and one listing of the run folder, kept up to date, spares
a look at the disk per new job. A removed folder stays in the index (a launched attempt without a
folder), and on disk in the run folder's record of removed attempts (`REMOVED`, a line each,
written before the folder goes): a reservation whose ack was lost comes again after the agent
restarts, and the next agent knows it as launched here too.

Why the record is pruned by the consumer's position, not by the log's end of the job: the end of
a completed gang is never sent to its nodes, and a reservation not acknowledged is delivered
again after whatever the log says later. At adoption the record keeps only the attempts whose
reservation the agents' consumer may still deliver (`redeliverable`: in the stream, past its ack
floor); between two restarts it keeps the newest `kept` (the index's own bound).

Why removal: a folder per attempt would fill the disk of a long-lived machine and make every
adoption list them all. A folder goes once it is reported (every report of it published: nothing
left to adopt or report) and it completed here or the log holds the attempt's end
(`Supervisor.attempts_over`).
"""

from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from .step_files import attempt_dir, attempt_folders, read_launch, remove_attempt

FOLDERS_KEPT = 100_000  # jobs whose attempt folders the index knows by name (the oldest go)
REMOVED = ".removed"  # the run folder's record of removed attempts: "<attempt> <job>" a line, oldest first


class RunFolders:
    """job -> attempt -> its folder (None once removed), for every attempt folder in `run_dir`."""

    def __init__(self, run_dir: Path, kept: int = FOLDERS_KEPT) -> None:
        self.run_dir = run_dir
        self._kept = kept
        self._known: OrderedDict[str, dict[int, Path | None]] | None = None
        self._trimmed = False  # some jobs were forgotten for room
        self._recorded = 0  # lines in the record of removed attempts

    def seed(self, found: list[tuple[str, int, Path]],
             redeliverable: Callable[[str, int], bool] | None = None) -> None:
        """Build the index from a listing made anyway (adoption's) and the record of removed
        attempts, unless it is built already. `redeliverable(job, attempt)`: whether a reservation
        of that attempt may still be delivered (None: any may); the record forgets the others."""
        if self._known is not None:
            return
        self._known = OrderedDict()
        removed = self._read_removed()
        kept = removed if redeliverable is None else [(j, n) for j, n in removed if redeliverable(j, n)]
        if len(kept) < len(removed):
            self._write_removed(kept)
        self._recorded = len(kept)
        for job, number in kept:
            self._known.setdefault(job, {})[number] = None
        for job, number, folder in found:
            self._known.setdefault(job, {})[number] = folder
        self._trim()

    def _index(self) -> OrderedDict[str, dict[int, Path | None]]:
        if self._known is None:
            self.seed(attempt_folders(self.run_dir))
        assert self._known is not None
        return self._known

    def _trim(self) -> None:
        assert self._known is not None
        while len(self._known) > self._kept:
            self._known.popitem(last=False)
            self._trimmed = True

    def added(self, job_id: str, attempt: int, folder: Path) -> None:
        """`folder` was made for `attempt` of `job_id` (only an index already built is updated)."""
        if self._known is not None:
            self._known.setdefault(job_id, {})[attempt] = folder
            self._trim()

    def launched_here(self, job_id: str, attempt: int) -> bool:
        """Whether this or a later attempt of `job_id` was launched here: a folder of it holds a
        whole launch.json, or it was removed (launched, reported and over)."""
        known = self._index().get(job_id)
        if known is None and self._trimmed:  # forgotten for room: its own folder is looked at
            known = {attempt: attempt_dir(self.run_dir, job_id, attempt)}
        for number, folder in (known or {}).items():
            if number < attempt:
                continue
            if folder is None:
                return True
            launch = read_launch(folder)
            if launch is not None and launch.assignment.attempt >= attempt:
                return True
        return False

    def folders(self, job_id: str, up_to_attempt: int | None) -> list[tuple[int, Path]]:
        """The folders on disk of `job_id`'s attempts up to `up_to_attempt` (None: every one)."""
        known = self._index().get(job_id)
        if known is None and self._trimmed and up_to_attempt is not None:
            known = {up_to_attempt: attempt_dir(self.run_dir, job_id, up_to_attempt)}
        return [(n, f) for n, f in (known or {}).items()
                if f is not None and (up_to_attempt is None or n <= up_to_attempt) and os.path.isdir(f)]

    def remove(self, job_id: str, attempt: int, folder: Path) -> None:
        """Remove `folder`; the index and the record of removed attempts keep the attempt as
        launched here (recorded first: a folder not recorded stays)."""
        known = self._index()
        try:
            with open(self.run_dir / REMOVED, "a", encoding="utf-8") as record:
                record.write(f"{attempt} {job_id}\n")
        except OSError:
            return  # tried again at adoption
        self._recorded += 1
        if self._recorded > 2 * self._kept:
            self._write_removed(self._read_removed()[-self._kept:])
        remove_attempt(folder)
        if folder.parent != self.run_dir:  # the nested layout: its job's folder, once empty
            with contextlib.suppress(OSError):
                os.rmdir(folder.parent)
        known.setdefault(job_id, {})[attempt] = None
        self._trim()

    def _read_removed(self) -> list[tuple[str, int]]:
        """(job, attempt) of each line of the record, oldest first (none: no record)."""
        try:
            text = (self.run_dir / REMOVED).read_text(encoding="utf-8")
        except OSError:
            return []
        out = []
        for line in text.splitlines():
            number, _, job = line.partition(" ")
            if job and number.isdigit():
                out.append((job, int(number)))
        return out

    def _write_removed(self, removed: list[tuple[str, int]]) -> None:
        """Replace the record with `removed` (whole, or not at all)."""
        path = self.run_dir / REMOVED
        tmp = path.with_name(f"{REMOVED}.{os.getpid()}.tmp")
        with contextlib.suppress(OSError):
            tmp.write_text("".join(f"{n} {job}\n" for job, n in removed), encoding="utf-8")
            os.replace(tmp, path)
            self._recorded = len(removed)
