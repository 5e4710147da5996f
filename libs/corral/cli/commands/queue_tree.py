"""`corral apply` and `corral queues --history | --diff`: the queue tree's versions, a change to
it, its what-if, and the request that asks quota to apply it.

The evidence gate is quota's (`corral.services.quota.gate`): it checks the queues file's standing
gates and `--require`'s criteria and records the verdict; `apply_tree` only asks and returns the
checks quota recorded. `what_if` is a preview: it replays the recorded workload under the current
and the proposed tree here and checks the same criteria, recording nothing.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from corral.cli.commands import CommandError, Problem
from corral.client import Client
from corral.contracts import events as ev
from corral.contracts.envelope import Event
from corral.contracts.problems import SpecError
from corral.contracts.queues import QueueSpec, gate_criteria, load_queues_file, merged_tree, tree_problems
from corral.projection import ClusterView
from corral.verdicts import Verdict


@dataclass(frozen=True)
class Change:
    """What an apply asks for: the queues to set, and why."""

    queues: list[QueueSpec]
    message: str
    rollback_of: int | None = None
    #: the standing gates the file declares (None: those in force stay)
    gates: list[str] | None = None


@dataclass(frozen=True)
class Applied:
    """What became of an apply: quota's verdict (None when not waited for) and the checks it
    recorded with it; `version` is the verdict's (the one it will be when not waited for)."""

    names: list[str]
    version: int | None
    rollback_of: int | None
    verdict: Verdict | None
    evidence: list[ev.GateCheck] = field(default_factory=list)

    def fields(self) -> dict[str, Any]:
        """The command's own `--json` fields (the verdict's are added beside them)."""
        return {"applied": self.names, "version": self.version, "rollback_of": self.rollback_of,
                "evidence": evidence_json(self.evidence)}


@dataclass(frozen=True)
class WhatIf:
    """A change's preview: the replay under both trees and each criterion's check."""

    result: Any
    checks: list[ev.GateCheck]

    @property
    def refused(self) -> bool:
        return not all(c.passed for c in self.checks)


async def read_log(c: Client) -> tuple[ClusterView, list[Event]]:
    """The whole log folded, and its events (the what-if replays them)."""
    view = ClusterView()
    events = []
    for stored, event in await c.events():
        view.apply(event, stored.version, stored.position)
        events.append(event)
    return view, events


async def apply_tree(c: Client, file: str | None, *, rollback: bool, message: str, require: list[str],
                     since: datetime, wait: bool, timeout: float) -> Applied:
    """Ask quota to apply the queues file (or, `rollback`, version `file`'s tree) and, `wait`, its
    verdict within `timeout` seconds. `require` and `since` go with the request: quota checks the
    gates over the workload recorded since then. CommandError for a file or version that cannot be."""
    view, _ = await read_log(c)
    change = load_change(file, rollback, message, view)
    before = len(view.tree_versions)
    request = await c.request_queue_tree(change.queues, message=change.message, rollback_of=change.rollback_of,
                                         gates=change.gates, require=require, what_if_since=since)
    verdict = await c.await_verdict(request, timeout) if wait else None
    return Applied(names=[q.name for q in change.queues],
                   version=before + 1 if verdict is None else verdict.version,  # not waited: unless another comes
                   rollback_of=change.rollback_of, verdict=verdict, evidence=recorded_evidence(verdict))


async def what_if(c: Client, file: str | None, *, rollback: bool, message: str, require: list[str],
                  since: datetime) -> WhatIf:
    """The change's effect on the workload recorded since `since`, and the criteria quota would
    check it against (the standing gates, those the file declares, `require`)."""
    view, events = await read_log(c)
    change = load_change(file, rollback, message, view)
    result, checks = what_if_for(events, list(view.queues.values()), merged(view, change), since,
                                 gate_texts(view, change, require), view.policy)
    return WhatIf(result, checks)


async def history(c: Client) -> list[dict[str, Any]]:
    return history_rows(await c.live_view())


async def diff(c: Client, first: int, second: int) -> list[dict[str, Any]]:
    return diff_rows(await c.live_view(), first, second)


def load_change(file: str | None, rollback: bool, message: str, view: ClusterView) -> Change:
    """The queues file's tree, or (`--rollback [V]`) version V's tree; CommandError with the fix."""
    if not rollback:
        if file is None:
            raise CommandError("give a queues file (corral apply queues.yaml), or --rollback [VERSION]")
        try:
            loaded = load_queues_file(Path(str(file)))
            change = Change(loaded.resolved(existing=view.queues), message, gates=loaded.gates)
        except SpecError as exc:
            raise CommandError(f"{file} is not a valid queues file:",
                               [Problem(p.path, p.message, p.hint) for p in exc.problems]) from None
        except OSError as exc:
            raise CommandError(f"cannot read {file}: {exc.strerror}") from None
        tree = merged(view, change)
        problems = tree_problems(tree)
        if problems:
            raise CommandError(f"{file} over the current queue tree (corral queues) would be inconsistent:",
                               [Problem(_tree_path(p.path, tree), p.message, p.hint) for p in problems])
        return change
    versions = view.tree_versions
    if not versions:
        raise CommandError("no queue tree version is recorded yet: nothing to roll back to (apply a queues file "
                           "first)")
    if file is None:
        if len(versions) < 2:
            raise CommandError("only version 1 is recorded: there is no earlier version to roll back to")
        target = len(versions) - 1
    elif not file.isdigit() or not 1 <= int(file) <= len(versions):
        raise CommandError(f"--rollback {file}: give a version between 1 and {len(versions)} (corral queues "
                           "--history)")
    else:
        target = int(file)
    return Change(list(versions[target - 1].queues), message or f"rollback to v{target}", rollback_of=target)


def history_rows(view: ClusterView) -> list[dict[str, Any]]:
    rows = []
    previous: dict[str, QueueSpec] = {}
    for number, version in enumerate(view.tree_versions, start=1):
        tree = {q.name: q for q in version.queues}
        changed = sorted(n for n, q in tree.items() if previous.get(n) != q)
        rows.append({"version": number, "at": version.occurred_at.isoformat(), "user": version.user,
                     "message": version.message, "rollback_of": version.rollback_of, "changed": changed,
                     "evidence": evidence_json(version.evidence)})
        previous = tree
    return rows


def diff_rows(view: ClusterView, first: int, second: int) -> list[dict[str, Any]]:
    """Each field that differs between versions `first` and `second`, per queue."""
    count = len(view.tree_versions)
    for v in (first, second):
        if not 1 <= v <= count:
            raise CommandError(f"--diff: version {v} does not exist; versions are 1..{count} (corral queues "
                               "--history)")
    a = {q.name: _fields(q) for q in view.tree_versions[first - 1].queues}
    b = {q.name: _fields(q) for q in view.tree_versions[second - 1].queues}
    rows: list[dict[str, Any]] = []
    for name in sorted(set(a) | set(b)):
        old, new = a.get(name), b.get(name)
        if old is None or new is None:
            rows.append({"queue": name, "field": "(queue)", "before": "absent" if old is None else "present",
                         "after": "absent" if new is None else "present"})
            continue
        rows += [{"queue": name, "field": f, "before": old.get(f), "after": new.get(f)}
                 for f in sorted(set(old) | set(new)) if old.get(f) != new.get(f)]
    return rows


def what_if_for(events: list[Event], current: list[QueueSpec], proposed: list[QueueSpec],
                since: datetime | None, criteria: list[str], policy: str = "corral") -> tuple[Any, list[ev.GateCheck]]:
    """Replay the recorded workload under both trees and the cluster's `policy` (corral.sim.whatif)
    and check `criteria`;
    CommandError when the log holds nothing to replay (no submission, or no node to run it on)."""
    from corral.sim.from_log import export_inputs
    from corral.sim.whatif import parse_criterion, what_if

    with tempfile.TemporaryDirectory(prefix="corral-what-if-") as tmp:
        try:
            exported = export_inputs(events, Path(tmp), since=since)
        except SystemExit as exc:  # a log without submissions: `corral sim --from-log`'s own exit
            raise CommandError(str(exc.code).removeprefix("error: ")) from None
        if exported.cluster is None:
            raise CommandError("the log holds no registered nodes: nothing to replay the workload on")
        result = what_if(exported.trace, exported.cluster, current, proposed, policy=policy)
    return result, [parse_criterion(text).check(result) for text in criteria]


def gate_texts(view: ClusterView, change: Change, require: list[str]) -> list[str]:
    """The criteria quota will check this change against (`gate_criteria`)."""
    return gate_criteria(view.standing_gates(), change.gates, require)


def recorded_evidence(verdict: Verdict | None) -> list[ev.GateCheck]:
    """The checks quota recorded with its verdict (a version applied or a change refused)."""
    event = verdict.event if verdict is not None else None
    return list(event.evidence) if isinstance(event, ev.QueueTreeApplied | ev.QueueChangeRefused) else []


def merged(view: ClusterView, change: Change) -> list[QueueSpec]:
    return merged_tree(view.queues.values(), change.queues)


def evidence_json(checks: list[ev.GateCheck] | tuple[ev.GateCheck, ...]) -> list[dict[str, Any]]:
    return [check_json(c) for c in checks]


def what_if_json(preview: WhatIf) -> dict[str, Any]:
    return {"jobs": preview.result.jobs, "queues": preview.result.rows(), "checks": evidence_json(preview.checks)}


def check_json(c: ev.GateCheck) -> dict[str, Any]:
    return {"criterion": c.criterion, "queue": c.queue, "metric": c.metric, "op": c.op, "threshold": c.threshold,
            "before": c.before, "after": c.after, "passed": c.passed}


def _tree_path(path: str, tree: list[QueueSpec]) -> str:
    """`queues[3].max_gpus` of the merged tree, said by queue name (the file has other indexes)."""
    head, _, name_field = path.partition(".")
    try:
        name = tree[int(head.removeprefix("queues[").removesuffix("]"))].name
    except (ValueError, IndexError):
        return path
    return f"queue {name} {name_field}".rstrip()


def _fields(q: QueueSpec) -> dict[str, Any]:
    import msgspec

    out: dict[str, Any] = msgspec.to_builtins(q)
    out.pop("name", None)
    return out
