"""The attempt folders of a node's run folder, by job: which attempts were launched here, and the
removal of the folders nothing needs any more.

Why an index: a redelivered reservation must not launch its attempt again (`Supervisor.start`);
the folders say what was launched here, and one listing of the run folder, kept up to date, spares
a look at the disk per new job. A removed folder stays in the index (a launched attempt without a
folder): within this process a reservation of it is still known as launched here.

Why removal: a folder per attempt would fill the disk of a long-lived machine and make every
adoption list them all. A folder goes once it is reported (every report of it published: nothing
left to adopt or report) and it completed here or the log holds the attempt's end
(`Supervisor.attempts_over`).
"""

from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from pathlib import Path

from .step_files import attempt_dir, attempt_folders, read_launch, remove_attempt

FOLDERS_KEPT = 100_000  # jobs whose attempt folders the index knows by name (the oldest go)


class RunFolders:
    """job -> attempt -> its folder (None once removed), for every attempt folder in `run_dir`."""

    def __init__(self, run_dir: Path, kept: int = FOLDERS_KEPT) -> None:
        self.run_dir = run_dir
        self._kept = kept
        self._known: OrderedDict[str, dict[int, Path | None]] | None = None
        self._trimmed = False  # some jobs were forgotten for room

    def seed(self, found: list[tuple[str, int, Path]]) -> None:
        """Build the index from a listing made anyway (adoption's), unless it is built already."""
        if self._known is None:
            self._known = OrderedDict()
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
        """Remove `folder`; the index keeps the attempt as launched here."""
        remove_attempt(folder)
        if folder.parent != self.run_dir:  # the nested layout: its job's folder, once empty
            with contextlib.suppress(OSError):
                os.rmdir(folder.parent)
        known = self._index()
        known.setdefault(job_id, {})[attempt] = None
        self._trim()
