"""The two error types of the contracts: one for people's files, one for wire payloads.

Why two: a spec written by a person (a job file, a cluster file, queues.yaml) deserves every
problem at once, each with the field path and a fix, so one edit fixes the file (`SpecError`).
A payload on the wire is produced by a program; the first problem is enough, but it must name the
field and never leak a library exception to the caller (`ContractError`).
"""

from __future__ import annotations

import re

import msgspec

__all__ = ["ContractError", "Problem", "SpecError", "problem_from_validation_error"]


class Problem(msgspec.Struct, frozen=True, kw_only=True):
    """One thing wrong with an input: where (`path`, e.g. `topology.gang`), what, and how to fix it."""

    path: str
    message: str
    hint: str = ""

    def __str__(self) -> str:
        where = self.path or "(document)"
        text = f"{where}: {self.message}"
        return f"{text} (hint: {self.hint})" if self.hint else text


class SpecError(ValueError):
    """A person's spec is wrong; `problems` lists every problem found, each with path and hint."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems: list[Problem] = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) in spec:\n{lines}")

    def prefixed(self, prefix: str) -> SpecError:
        """The same problems seen from an enclosing document (e.g. `nodes[3]` + `.gpus`)."""
        return SpecError([Problem(path=join_path(prefix, p.path), message=p.message, hint=p.hint)
                          for p in self.problems])


class ContractError(ValueError):
    """A wire payload is not a valid event; `field` is the offending path ('' if the whole document)."""

    def __init__(self, message: str, *, field: str = "", event_type: str | None = None,
                 schema_version: int | None = None) -> None:
        self.field = field
        self.event_type = event_type
        self.schema_version = schema_version
        super().__init__(message)


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `(?P<where>[^`]*)`(?: in `(?P<outer>[^`]*)`)?)?$", re.S)


_NAMED_FIELD = re.compile(r"^Object (?:missing required|contains unknown) field `([^`]*)`")


def join_path(prefix: str, path: str) -> str:
    if not prefix:
        return path
    if not path:
        return prefix
    return prefix + path if path.startswith("[") else f"{prefix}.{path}"


def _msgspec_path(where: str | None) -> str:
    """`$.nodes[0].gpus` -> `nodes[0].gpus`; msgspec's `$` is the document root."""
    if not where:
        return ""
    path = where[1:] if where.startswith("$") else where
    return path[1:] if path.startswith(".") else path


def problem_from_validation_error(error: msgspec.ValidationError | msgspec.DecodeError,
                                  prefix: str = "") -> Problem:
    """Turn msgspec's one-line message into a Problem with a dotted path."""
    m = _AT.match(str(error))
    assert m is not None  # the pattern matches any string
    message = m.group("msg")
    where, outer = m.group("where"), m.group("outer")
    if outer is not None:  # "at `key` in `$.env`": a mapping key is wrong
        path = _msgspec_path(outer)
        message = f"{message} (in a key)"
    else:
        path = _msgspec_path(where)
    named = _NAMED_FIELD.match(message)
    if named is not None:  # "Object missing required field `actor`": the field is the location
        path = join_path(path, named.group(1))
    return Problem(path=join_path(prefix, path), message=message)
