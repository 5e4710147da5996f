"""How a command reports the owning service's verdict on its request (`corral.verdicts`).

One report for cancel, hold, release, requeue, drain, undrain and apply: what was done, on
stdout; a refusal with its reason, what changed nothing, or no verdict within the wait, on
stderr, each with its exit code (`ExitCode`): a refused request is never a success, and a script
can tell "refused" (4) from "no answer yet, it may still happen" (5). With `--json`, stdout holds
the command's fields and the verdict whatever it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.cli.exit_codes import ExitCode
from corral.cli.output import console, err_console, print_json
from corral.verdicts import OWNERS, Verdict, VerdictKind

#: Seconds a command waits for its request's verdict (`--verdict-timeout`).
VERDICT_WAIT = 15.0


def exit_code(verdict: Verdict, *, unchanged_ok: bool = False) -> ExitCode:
    """DONE: 0; REFUSED: 4; UNCHANGED: 1 (0 when the request asks for what already holds, e.g.
    drain a draining node); NO_VERDICT: 5."""
    if verdict.kind is VerdictKind.DONE or (verdict.kind is VerdictKind.UNCHANGED and unchanged_ok):
        return ExitCode.OK
    return {VerdictKind.REFUSED: ExitCode.REFUSED, VerdictKind.UNCHANGED: ExitCode.FAILURE,
            VerdictKind.NO_VERDICT: ExitCode.NO_VERDICT}[verdict.kind]


def report(verdict: Verdict, subject: str, *, fields: Mapping[str, Any], done: str, unchanged: str,
           waited: float, json_out: bool, unchanged_ok: bool = False) -> None:
    """Print the verdict on the request about `subject` (a job id, a node) and exit with its code.
    `done` and `unchanged` are the words for those outcomes; `fields` the command's JSON fields."""
    code = exit_code(verdict, unchanged_ok=unchanged_ok)
    if json_out:
        print_json({**fields, **verdict.as_json()})
    elif verdict.kind is VerdictKind.DONE:
        console.print(done, highlight=False)
    elif verdict.kind is VerdictKind.UNCHANGED and unchanged_ok:
        console.print(unchanged, highlight=False)
    else:
        err_console.print(f"[red]error:[/red] {problem(verdict, subject, unchanged, waited)}", highlight=False)
    if code is not ExitCode.OK:
        raise SystemExit(code)


def problem(verdict: Verdict, subject: str, unchanged: str, waited: float) -> str:
    """The one line that says why the request did not happen (or not yet)."""
    owner = OWNERS[verdict.request.type]
    reason = verdict.reason
    if verdict.kind is VerdictKind.REFUSED:
        said = f"{reason.code}: {reason.message}" if reason is not None else "see `corral events`"
        return f"{subject}: refused by {owner}: {said}"
    if verdict.kind is VerdictKind.UNCHANGED:
        return f"{subject}: nothing was done: {unchanged}"
    return (f"{subject}: the request was sent, but {owner} gave no verdict within {waited:g} s (is {owner} "
            f"running?); it waits in {owner}'s inbox and may still be acted on")
