"""`corral apply` with evidence and rollback; `corral queues --history | --diff`.

A queue tree decides who waits and who works: every apply is a numbered version of the whole tree
in the log (who, when, why); `--what-if` replays the recorded workload under the current and the
proposed tree and prints each queue's waits, GPU-hours, fair share and preemptions side by side.
The evidence gate is quota's (`corral.services.quota.gate`): it checks the queues file's standing
gates and `--require`'s criteria and records the verdict; this module only asks and shows the
checks quota recorded. `--rollback [V]` restores an earlier version as a new one.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from corral.cli.exit_codes import ExitCode
from corral.cli.output import console, err_console, print_json, print_table
from corral.cli.session import EXIT_FAILURE
from corral.client import Client
from corral.contracts import events as ev
from corral.contracts.envelope import Event
from corral.contracts.problems import SpecError
from corral.contracts.queues import QueueSpec, gate_criteria, load_queues_file, merged_tree, tree_problems
from corral.projection import ClusterView
from corral.verdicts import Verdict

#: Exit code when the evidence gate refuses a change (the what-if missed a `--require`): 4, not
#: 3, which means no cluster reachable (`corral.cli.exit_codes`).
EXIT_REFUSED = ExitCode.REFUSED


@dataclass(frozen=True)
class Change:
    """What an apply asks for: the queues to set, and why."""

    queues: list[QueueSpec]
    message: str
    rollback_of: int | None = None
    #: the standing gates the file declares (None: those in force stay)
    gates: list[str] | None = None


def load_change(file: str | None, rollback: bool, message: str, view: ClusterView) -> Change:
    """The queues file's tree, or (`--rollback [V]`) version V's tree; SystemExit with the fix."""
    if not rollback:
        if file is None:
            _fail("give a queues file (corral apply queues.yaml), or --rollback [VERSION]")
        try:
            loaded = load_queues_file(Path(str(file)))
            change = Change(loaded.resolved(existing=view.queues), message, gates=loaded.gates)
        except SpecError as exc:
            err_console.print(f"[red]error:[/red] {file} is not a valid queues file:", highlight=False)
            for p in exc.problems:
                err_console.print(f"  [bold]{p.path}[/bold]: {p.message}" + (f"\n    hint: {p.hint}" if p.hint else ""),
                                  highlight=False)
            raise SystemExit(EXIT_FAILURE) from None
        except OSError as exc:
            _fail(f"cannot read {file}: {exc.strerror}")
        problems = tree_problems(merged(view, change))
        if problems:
            err_console.print(f"[red]error:[/red] {file} over the current queue tree (corral queues) would be "
                              "inconsistent:", highlight=False)
            for p in problems:
                err_console.print(f"  [bold]{_tree_path(p.path, merged(view, change))}[/bold]: {p.message}"
                                  + (f"\n    hint: {p.hint}" if p.hint else ""), highlight=False)
            raise SystemExit(EXIT_FAILURE)
        return change
    versions = view.tree_versions
    if not versions:
        _fail("no queue tree version is recorded yet: nothing to roll back to (apply a queues file first)")
    if file is None:
        if len(versions) < 2:
            _fail("only version 1 is recorded: there is no earlier version to roll back to")
        target = len(versions) - 1
    elif not file.isdigit() or not 1 <= int(file) <= len(versions):
        _fail(f"--rollback {file}: give a version between 1 and {len(versions)} (corral queues --history)")
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
                     "evidence": [_check_json(c) for c in version.evidence]})
        previous = tree
    return rows


def diff_rows(view: ClusterView, first: int, second: int) -> list[dict[str, Any]]:
    """Each field that differs between versions `first` and `second`, per queue."""
    count = len(view.tree_versions)
    for v in (first, second):
        if not 1 <= v <= count:
            _fail(f"--diff: version {v} does not exist; versions are 1..{count} (corral queues --history)")
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


def print_history(rows: list[dict[str, Any]]) -> None:
    print_table("queue tree versions", ["VERSION", "AT", "BY", "CHANGED", "ROLLBACK OF", "GATE", "MESSAGE"],
                [(r["version"], r["at"][:19], r["user"], ", ".join(r["changed"]) or "-",
                  r["rollback_of"] or "", _gate(r["evidence"]), r["message"]) for r in rows])


def print_diff(first: int, second: int, rows: list[dict[str, Any]]) -> None:
    if not rows:
        console.print(f"versions {first} and {second} are the same tree", highlight=False)
        return
    print_table(f"v{first} -> v{second}", ["QUEUE", "FIELD", f"V{first}", f"V{second}"],
                [(r["queue"], r["field"], _show(r["before"]), _show(r["after"])) for r in rows])


def what_if_for(events: list[Event], current: list[QueueSpec], proposed: list[QueueSpec],
                since: datetime | None, criteria: list[str]) -> tuple[Any, list[ev.GateCheck]]:
    """Replay the recorded workload under both trees (corral.sim.whatif) and check `criteria`;
    SystemExit when the log holds nothing to replay."""
    from corral.sim.from_log import export_inputs
    from corral.sim.whatif import parse_criterion, what_if

    with tempfile.TemporaryDirectory(prefix="corral-what-if-") as tmp:
        exported = export_inputs(events, Path(tmp), since=since)
        if exported.cluster is None:
            _fail("the log holds no registered nodes: nothing to replay the workload on")
        result = what_if(exported.trace, exported.cluster, current, proposed)
    return result, [parse_criterion(text).check(result) for text in criteria]


def print_what_if(whatif: Any, checks: list[ev.GateCheck]) -> None:
    def wait(v: float | None) -> str:
        return "-" if v is None else _duration(v)

    def pair(row: dict[str, Any], metric: str, fmt: Any) -> str:
        return f"{fmt(row[metric + '_before'])} -> {fmt(row[metric + '_after'])}"

    print_table(f"what-if: {whatif.jobs} recorded jobs replayed, current tree -> proposed tree",
                ["QUEUE", "JOBS", "AVG WAIT", "P95 WAIT", "GPU-HOURS", "FAIR SHARE", "PREEMPTIONS"],
                [(r["queue"], r["jobs"], pair(r, "avg_wait", wait), pair(r, "p95_wait", wait),
                  pair(r, "gpu_hours", lambda v: "-" if v is None else f"{v:.1f}"),
                  pair(r, "fair_share", lambda v: "-" if v is None else f"{v:.2f}"),
                  pair(r, "preemptions", lambda v: "-" if v is None else str(int(v)))) for r in whatif.rows()])
    print_checks(checks)


def print_checks(checks: list[ev.GateCheck]) -> None:
    for c in checks:
        mark = "[green]pass[/green]" if c.passed else "[red]MISS[/red]"
        console.print(f"  {mark}  {c.criterion}: measured {_measured(c)}", highlight=False)


def gate_texts(view: ClusterView, change: Change, require: list[str]) -> list[str]:
    """The criteria quota will check this change against (`gate_criteria`)."""
    return gate_criteria(view.standing_gates(), change.gates, require)


def recorded_evidence(verdict: Verdict | None) -> list[ev.GateCheck]:
    """The checks quota recorded with its verdict (a version applied or a change refused)."""
    event = verdict.event if verdict is not None else None
    return list(event.evidence) if isinstance(event, ev.QueueTreeApplied | ev.QueueChangeRefused) else []


def evidence_json(checks: list[ev.GateCheck]) -> list[dict[str, Any]]:
    return [_check_json(c) for c in checks]


async def read_log(c: Client) -> tuple[ClusterView, list[Event]]:
    view = ClusterView()
    events = []
    for stored, event in await c.events():
        view.apply(event, stored.version, stored.position)
        events.append(event)
    return view, events


def merged(view: ClusterView, change: Change) -> list[QueueSpec]:
    return merged_tree(view.queues.values(), change.queues)


def _tree_path(path: str, tree: list[QueueSpec]) -> str:
    """`queues[3].max_gpus` of the merged tree, said by queue name (the file has other indexes)."""
    head, _, field = path.partition(".")
    try:
        name = tree[int(head.removeprefix("queues[").removesuffix("]"))].name
    except (ValueError, IndexError):
        return path
    return f"queue {name} {field}".rstrip()


def what_if_json(whatif: Any, checks: list[ev.GateCheck]) -> dict[str, Any]:
    return {"jobs": whatif.jobs, "queues": whatif.rows(), "checks": [_check_json(c) for c in checks]}


def _check_json(c: ev.GateCheck) -> dict[str, Any]:
    return {"criterion": c.criterion, "queue": c.queue, "metric": c.metric, "op": c.op, "threshold": c.threshold,
            "before": c.before, "after": c.after, "passed": c.passed}


def _measured(c: ev.GateCheck) -> str:
    def show(v: float | None) -> str:
        if v is None:
            return "-"
        return _duration(v) if c.metric.endswith("_wait") else f"{v:g}"
    return f"{show(c.before)} now -> {show(c.after)} proposed (needs {c.op} {show(c.threshold)})"


def _fields(q: QueueSpec) -> dict[str, Any]:
    import msgspec

    out: dict[str, Any] = msgspec.to_builtins(q)
    out.pop("name", None)
    return out


def _gate(evidence: list[dict[str, Any]]) -> str:
    return f"{sum(1 for e in evidence if e['passed'])}/{len(evidence)} passed" if evidence else ""


def _show(v: Any) -> str:
    return "-" if v is None else str(v)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _fail(message: str) -> NoReturn:
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    raise SystemExit(EXIT_FAILURE)


__all__ = ["EXIT_REFUSED", "Change", "diff_rows", "evidence_json", "gate_texts", "history_rows", "load_change",
           "merged",
           "print_checks", "print_diff", "print_history", "print_json", "print_what_if", "read_log",
           "recorded_evidence", "what_if_for", "what_if_json"]
