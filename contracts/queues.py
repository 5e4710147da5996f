"""QueueSpec and QueuesFile: the queue tree applied with `corral apply queues.yaml`.

Why the tree is checked here: a tree whose children are promised more GPUs than their parent,
or whose ceiling is under its guarantee, can never be honoured by the fair-share core; catching
it at `apply` names the line to fix instead of producing a quota that silently cannot hold.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import msgspec

from corral.contracts.jobspec import PRIORITY_CLASSES, PRIORITY_HINT, Priority, PriorityClass, QueuePath
from corral.contracts.problems import Problem, SpecError
from corral.contracts.validation import convert_collecting, parse_document, utf8_text

__all__ = ["GATE_METRICS", "Gate", "QueueSpec", "QueuesFile", "SubmitRate", "duration_seconds", "gate_criteria",
           "load_queues_file", "load_queues_text", "merged_tree", "parent_of", "parse_gate", "validate_queues"]

Gpus = Annotated[int, msgspec.Meta(ge=0)]
#: A duration written with units: `90s`, `30m`, `4h`, `2d`, `1h30m` (`s`, `m`, `h`, `d`).
DurationText = Annotated[str, msgspec.Meta(pattern=r"^(?:[0-9]+(?:\.[0-9]+)?[smhd])+$",
                                           description="a duration such as 90s, 30m, 4h, 1h30m or 2d")]
PositiveSeconds = Annotated[float, msgspec.Meta(gt=0, description="seconds")]
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration_seconds(text: str) -> float:
    """`1h30m` -> 5400.0 (the text already matched `DurationText`)."""
    return sum(float(n) * _UNIT_SECONDS[unit] for n, unit in re.findall(r"([0-9.]+)([smhd])", text))


#: What a gate may bound, per queue, over the what-if replay (`corral.sim.whatif`).
GATE_METRICS = ("avg_wait", "p95_wait", "gpu_hours", "fair_share", "preemptions")
GATE_OPS = ("<=", ">=", "==", "<", ">")
_GATE = re.compile(r"^\s*queue\s+(?P<queue>\S+)\s+(?P<metric>[a-z_0-9]+)\s*(?P<op><=|>=|==|<|>)\s*"
                   r"(?P<value>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[smhd]?)\s*$")


class Gate(msgspec.Struct, frozen=True, kw_only=True):
    """`queue Q METRIC OP VALUE[s|m|h|d]`: a bound the proposed tree's what-if must meet (a standing
    gate of the queues file, or `corral apply --require`)."""

    text: str
    queue: str
    metric: str
    op: str
    threshold: float


def parse_gate(text: str, where: str = "--require") -> Gate:
    """A gate from its text; ValueError names what is wrong and how to write it."""
    match = _GATE.match(text)
    if match is None:
        raise ValueError(f"{where} {text!r}: write it as 'queue NAME METRIC OP VALUE', e.g. "
                         f"'queue team-a p95_wait <= 2h' (METRIC one of {', '.join(GATE_METRICS)}; OP one of "
                         f"{', '.join(GATE_OPS)}; waits take s, m, h or d)")
    metric = match["metric"]
    if metric not in GATE_METRICS:
        raise ValueError(f"{where} {text!r}: unknown metric {metric!r}; use one of {', '.join(GATE_METRICS)}")
    unit = match["unit"]
    if unit and not metric.endswith("_wait"):
        raise ValueError(f"{where} {text!r}: only waits take a unit ({unit!r} given for {metric})")
    threshold = float(match["value"]) * _UNIT_SECONDS.get(unit or "s", 1.0)
    return Gate(text=text.strip(), queue=match["queue"], metric=metric, op=match["op"], threshold=threshold)


def gate_criteria(standing: Iterable[str], declared: Iterable[str] | None, require: Iterable[str]) -> list[str]:
    """What a change of the tree must pass: the gates in force, the ones it declares (which stand
    after it) and its own `require`, each once. Nothing a change says removes a gate in force from
    its own check."""
    return list(dict.fromkeys(text.strip() for text in (*standing, *(declared or ()), *require)))


def parent_of(name: str) -> str | None:
    """`research/nlp` -> `research`; a root queue has no parent."""
    return name.rsplit("/", 1)[0] if "/" in name else None


class SubmitRate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A token bucket per user: `burst` submissions at once, refilled at `per_minute`."""

    per_minute: Annotated[float, msgspec.Meta(gt=0, description="submissions a minute, sustained")]
    burst: Annotated[int, msgspec.Meta(ge=1, description="submissions at once before the rate applies")]

    FIELD_HINTS: ClassVar[dict[str, str]] = {
        "per_minute": "sustained submissions a minute per user, a number > 0, e.g. 60",
        "burst": "submissions a user may make at once before the rate applies, a whole number >= 1, e.g. 500",
    }


class QueueSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One queue. `max_gpus=None`: no ceiling beyond the cluster; `lend_limit=None`: lends all unused;
    `max_priority=None`: jobs may ask for any priority (0..10000), else admission rejects a job
    above it (a class name is stored as its integer). `max_wait`: how long a job of this queue
    (or of a queue below it that sets none) may wait before quota records a WaitExceeded for it
    (`corral jobs --stuck`); seconds, or a duration such as `4h` (stored as seconds); None: never.

    Limits per user (None: none), each counted over the queue's whole subtree, so one set on a
    parent binds a user's jobs in all its children together (a job must be within the limits of
    its queue and of every queue above it): `max_submitted_per_user` jobs pending or running
    (admission refuses more: LIMIT_SUBMITTED), `max_gpus_per_user` GPUs held at once (quota keeps
    the job waiting: MAX_GPUS_PER_USER), `submit_rate_per_user` submissions (a token bucket:
    admission refuses past it with RATE_LIMITED and when to retry)."""

    name: QueuePath
    guaranteed_gpus: Gpus = 0
    max_gpus: Gpus | None = None
    lend_limit: Gpus | None = None
    weight: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    if TYPE_CHECKING:  # after __post_init__ the value is always an int (or None)
        max_priority: int | None = None
    else:
        max_priority: Priority | PriorityClass | None = None
    #: Who may submit to this queue (user names, as their NATS identities); None: everyone.
    submitters: list[Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]+$")]] | None = None
    #: Whether a job of this queue may run as root (a submitter whose OS account is uid 0) on node
    #: agents that run each job as its submitter's OS user (`--run-as submitter`); refused if not.
    allow_root: bool = False
    if TYPE_CHECKING:  # after __post_init__ the value is always seconds (or None)
        max_wait: float | None = None
    else:
        max_wait: PositiveSeconds | DurationText | None = None
    max_submitted_per_user: Annotated[int, msgspec.Meta(ge=1)] | None = None
    max_gpus_per_user: Annotated[int, msgspec.Meta(ge=1)] | None = None
    submit_rate_per_user: SubmitRate | None = None

    FIELD_HINTS: ClassVar[dict[str, str]] = {
        "name": "a queue path such as research/nlp",
        "guaranteed_gpus": "whole GPUs this queue can always get back, e.g. 16",
        "max_gpus": "ceiling in whole GPUs, borrowing included (leave out for none)",
        "lend_limit": "how many unused guaranteed GPUs siblings may borrow (leave out for all)",
        "weight": "share of the surplus, a number > 0 (default 1)",
        "max_priority": f"the highest priority a job of this queue may ask for: {PRIORITY_HINT[4:]}",
        "submitters": "user names allowed to submit here, e.g. [alice, bob] (leave out for everyone)",
        "allow_root": "true to let jobs of this queue run as root (uid 0) on the nodes; default false",
        "max_wait": "how long a job may wait before it is escalated: seconds > 0 or a duration such as 30m, 4h, "
                    "1h30m (leave out for never)",
        "max_submitted_per_user": "how many jobs one user may have pending or running in this queue and the "
                                  "queues below it, a whole number >= 1 (leave out for no limit)",
        "max_gpus_per_user": "how many GPUs one user's jobs of this queue and the queues below it may hold "
                             "at once, a whole number >= 1 (leave out for no limit)",
        "submit_rate_per_user": "a mapping {per_minute: 60, burst: 500}: submissions per user (leave out "
                                "for no limit)",
    }

    def __post_init__(self) -> None:
        if isinstance(self.max_priority, str):
            msgspec.structs.force_setattr(self, "max_priority", PRIORITY_CLASSES[self.max_priority])
        if isinstance(self.max_wait, str):
            msgspec.structs.force_setattr(self, "max_wait", duration_seconds(self.max_wait))
        problems = []
        if self.max_wait is not None and self.max_wait <= 0:
            problems.append(Problem(path="max_wait", message=f"max_wait {self.max_wait} is not a positive duration",
                                    hint="give a duration such as 30m or 4h, or leave max_wait out"))
        if self.max_gpus is not None and self.max_gpus < self.guaranteed_gpus:
            problems.append(Problem(path="max_gpus", message=f"max_gpus {self.max_gpus} is below "
                                    f"guaranteed_gpus {self.guaranteed_gpus}",
                                    hint=f"raise max_gpus to at least {self.guaranteed_gpus} or lower the "
                                         "guarantee"))
        if self.lend_limit is not None and self.lend_limit > self.guaranteed_gpus:
            problems.append(Problem(path="lend_limit", message=f"lend_limit {self.lend_limit} exceeds "
                                    f"guaranteed_gpus {self.guaranteed_gpus}",
                                    hint="a queue can lend at most its own guarantee"))
        if problems:
            raise SpecError(problems)


class QueuesFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The queue tree and, in `gates`, the standing evidence gates: criteria every later change of
    the tree must pass (quota replays the recorded workload under the proposed tree and refuses a
    change that misses one). Without `gates`, the gates in force stay as they are."""

    queues: list[QueueSpec]
    gates: list[str] | None = None

    FIELD_HINTS: ClassVar[dict[str, str]] = {"queues": "a list of {name, guaranteed_gpus, ...}",
                                             "gates": "a list of 'queue NAME METRIC OP VALUE'"}

    def __post_init__(self) -> None:
        problems = tree_problems(self.queues)
        for i, text in enumerate(self.gates or ()):
            try:
                parse_gate(text, where="gate")
            except ValueError as exc:
                problems.append(Problem(path=f"gates[{i}]", message=str(exc),
                                        hint="e.g. 'queue team-a p95_wait <= 2h'"))
        if problems:
            raise SpecError(problems)

    def resolved(self, existing: Collection[str] = ()) -> list[QueueSpec]:
        """Every queue of the tree, parents first, implied parents added.

        An implied parent (`research` when only `research/nlp` is written) guarantees the sum of
        its children's guarantees and has no ceiling. A parent in `existing` (the current tree,
        for a file applied over it) is not implied: a file naming only `research/nlp` replaced the
        real `research` with an implied one, dropping its guarantee, ceiling, max_wait and
        submitters.
        """
        by_name = {q.name: q for q in self.queues}
        implied: dict[str, int] = {}
        for q in self.queues:
            child = q.name
            parent = parent_of(child)
            while parent is not None and parent not in by_name and parent not in existing:
                implied[parent] = implied.get(parent, 0)
                child, parent = parent, parent_of(parent)
        for name in implied:
            implied[name] = sum(q.guaranteed_gpus for q in self.queues if parent_of(q.name) == name)
        # nested implied parents sum the implied children too (deepest first)
        for name in sorted(implied, key=lambda n: -n.count("/")):
            inner = sum(implied[c] for c in implied if parent_of(c) == name)
            implied[name] += inner
        everything = {**by_name, **{n: QueueSpec(name=n, guaranteed_gpus=g) for n, g in implied.items()}}
        return [everything[n] for n in sorted(everything, key=lambda n: (n.count("/"), n))]


def merged_tree(current: Iterable[QueueSpec], change: Iterable[QueueSpec]) -> list[QueueSpec]:
    """The whole tree after applying `change` over `current`, parents first: queues are added or
    changed, never deleted (a job may still be waiting in a queue a file no longer names)."""
    tree = {q.name: q for q in current}
    tree.update({q.name: q for q in change})
    return [tree[n] for n in sorted(tree, key=lambda n: (n.count("/"), n))]


def tree_problems(queues: list[QueueSpec]) -> list[Problem]:
    """Unique names; children's guarantees fit in an explicit parent's; none above the parent's ceiling."""
    found: list[Problem] = []
    index: dict[str, int] = {}
    for i, q in enumerate(queues):
        if q.name in index:
            found.append(Problem(path=f"queues[{i}].name", message=f"queue `{q.name}` is also "
                                 f"queues[{index[q.name]}]", hint="list every queue once"))
        else:
            index[q.name] = i
    for name, i in index.items():
        parent = queues[i]
        children = [queues[j] for n, j in index.items() if parent_of(n) == name]
        if not children:
            continue
        promised = sum(c.guaranteed_gpus for c in children)
        if promised > parent.guaranteed_gpus:
            found.append(Problem(
                path=f"queues[{i}].guaranteed_gpus",
                message=f"children of `{name}` are guaranteed {promised} GPUs but `{name}` only "
                        f"{parent.guaranteed_gpus}",
                hint=f"raise `{name}` guaranteed_gpus to at least {promised} or lower its children's"))
        if parent.max_gpus is not None:
            for c in children:
                if c.max_gpus is not None and c.max_gpus > parent.max_gpus:
                    found.append(Problem(
                        path=f"queues[{index[c.name]}].max_gpus",
                        message=f"max_gpus {c.max_gpus} of `{c.name}` exceeds its parent's {parent.max_gpus}",
                        hint=f"lower it to at most {parent.max_gpus}"))
    return found


def validate_queues(obj: Any) -> QueuesFile:
    if isinstance(obj, list):  # a bare list of queues is accepted too
        obj = {"queues": obj}
    if not isinstance(obj, dict):
        raise SpecError([Problem(path="", message=f"a queues file is a mapping, got {type(obj).__name__}",
                                 hint="start the file with `queues:`")])
    return convert_collecting(obj, QueuesFile)


def load_queues_text(text: str, fmt: Literal["yaml", "json"] | None = None) -> QueuesFile:
    return validate_queues(parse_document(text, fmt))


def load_queues_file(path: str | Path) -> QueuesFile:
    """Read a YAML/JSON queues file given by the caller (`.json` is JSON, otherwise YAML)."""
    p = Path(path)
    fmt: Literal["yaml", "json"] = "json" if p.suffix.lower() == ".json" else "yaml"
    return load_queues_text(utf8_text(p.read_bytes()), fmt)
