"""Turn a loose mapping (parsed YAML/JSON) into a frozen Struct, collecting every problem.

Why not just `msgspec.convert`: it stops at the first error and says nothing about unknown
fields beyond their name. People editing a job file want all problems at once, each with the
dotted path and a fix ("did you mean `gpus_per_replica`?"), so this walks the Struct's fields
first, converting each value on its own, and only then builds the whole object (which also runs
the cross-field checks in `__post_init__`).

Structs opt in to better hints with a `FIELD_HINTS: ClassVar[dict[str, str]]` mapping.
"""

from __future__ import annotations

import difflib
import json
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin

import msgspec

from corral.contracts.problems import Problem, SpecError, join_path, problem_from_validation_error

__all__ = ["convert_collecting", "parse_document", "utf8_text"]

T = TypeVar("T")

_MAX_REPR = 60


def utf8_text(data: bytes) -> str:
    """`data` as text, or SpecError naming the first byte that is not UTF-8 and where it is.

    A spec saved in Latin-1 or UTF-16 (or a binary file given by mistake) gave a
    UnicodeDecodeError traceback; a person needs the line and the fix.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[:exc.start]
        line = before.count(b"\n") + 1
        column = exc.start - (before.rfind(b"\n") + 1) + 1
        raise SpecError([Problem(
            path="", message=f"not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line}, column {column} "
                             f"(offset {exc.start}) is not valid UTF-8 ({exc.reason})",
            hint="save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 FILE`)")]) from None


def parse_document(text: str, fmt: Literal["yaml", "json"] | None = None) -> Any:
    """Parse YAML or JSON text (JSON when it looks like JSON and no format is given).

    YAML is a superset of JSON, but JSON errors are clearer from the JSON parser, hence the sniff.
    """
    if fmt is None:
        fmt = "json" if text.lstrip().startswith(("{", "[")) else "yaml"
    if fmt == "json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecError([Problem(path="", message=f"not valid JSON: {e.msg} at line {e.lineno} "
                                     f"column {e.colno}", hint="check brackets, commas and quotes")]) from e
    flat = flat_yaml(text)
    if flat is not None:
        return flat
    import yaml  # the YAML parser (tens of regular expressions) only for a YAML document

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError([Problem(path="", message=f"not valid YAML: {e}",
                                 hint="check indentation and that `key: value` pairs have a space "
                                      "after the colon")]) from e


#: A line of a flat YAML mapping read without the YAML parser: `key: value`, the value a decimal
#: integer or a word that YAML reads as a string.
_FLAT_LINE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*): +(0|-?[1-9][0-9]*|[A-Za-z][A-Za-z0-9_./-]*) *")
#: Words YAML 1.1 (PyYAML's resolvers) reads as booleans or null, whatever their case.
_YAML_WORDS = frozenset({"yes", "no", "true", "false", "on", "off", "null"})


def flat_yaml(text: str) -> dict[str, Any] | None:
    """A YAML document that is one flat mapping of names to integers and plain words (a small job
    spec: `name: train`, `gpus_per_replica: 8`), read as `yaml.safe_load` reads it; None for
    anything else (nesting, lists, quotes, comments after a value, another scalar), which is the
    YAML parser's. Importing that parser costs a `corral submit` about a sixth of its CPU."""
    out: dict[str, Any] = {}
    for line in text.split("\n"):
        line = line.rstrip("\r")
        if "\t" in line:
            return None
        if not line.strip(" ") or line.startswith("#"):
            continue
        match = _FLAT_LINE.fullmatch(line)
        if match is None:
            return None
        key, value = match.groups()
        if key.lower() in _YAML_WORDS or value.lower() in _YAML_WORDS or key in out:
            return None
        out[key] = int(value) if value[0] in "-0123456789" else value
    return out or None


def convert_collecting(obj: Any, cls: type[T], *, prefix: str = "") -> T:
    """Build `cls` from `obj`, or raise one SpecError listing every problem found.

    Valid input (the common case: simulator workloads load thousands of specs) takes the fast
    path, one `msgspec.convert`; only a failure pays for the field-by-field walk.
    """
    try:
        return msgspec.convert(obj, cls)
    except msgspec.ValidationError as e:
        first = e
    problems = problems_in(obj, cls, prefix)
    if problems:
        raise SpecError(problems) from first
    raise spec_error_from(first, prefix) from first


def spec_error_from(error: msgspec.ValidationError, prefix: str = "") -> SpecError:
    """Keep the structured problems of a SpecError raised inside a nested `__post_init__`."""
    located = problem_from_validation_error(error, prefix)
    cause = error.__cause__
    if isinstance(cause, SpecError):
        return cause.prefixed(located.path)
    return SpecError([located])


def _struct_in(tp: Any) -> type[msgspec.Struct] | None:
    """The Struct class a (possibly Optional / Annotated) type refers to, if any."""
    tp = _strip_annotated(tp)
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp
    if _is_union(tp):
        structs = [a for a in get_args(tp) if isinstance(a, type) and issubclass(a, msgspec.Struct)]
        if len(structs) == 1:
            return structs[0]
    return None


def _dict_types_in(tp: Any) -> tuple[Any, Any] | None:
    tp = _strip_annotated(tp)
    candidates = get_args(tp) if _is_union(tp) else (tp,)
    for c in candidates:
        c = _strip_annotated(c)
        if get_origin(c) is dict:
            key, value = get_args(c)
            return key, value
    return None


def _list_item_in(tp: Any) -> Any | None:
    tp = _strip_annotated(tp)
    candidates = get_args(tp) if _is_union(tp) else (tp,)
    for c in candidates:
        c = _strip_annotated(c)
        if get_origin(c) is list:
            (item,) = get_args(c)
            return item
    return None


def _strip_annotated(tp: Any) -> Any:
    while get_origin(tp) is typing.Annotated:
        tp = get_args(tp)[0]
    return tp


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (typing.Union, types.UnionType)


def problems_in(obj: Any, tp: Any, path: str) -> list[Problem]:
    """Every problem of `obj` as a value of type `tp`, found field by field."""
    struct = _struct_in(tp)
    if struct is not None and isinstance(obj, Mapping):
        return _struct_problems(obj, struct, path)
    item = _list_item_in(tp)
    if item is not None and _struct_in(item) is not None and isinstance(obj, list):
        found: list[Problem] = []
        for i, element in enumerate(obj):
            found.extend(problems_in(element, item, f"{path}[{i}]"))
        if found:
            return found
    return _leaf_problems(obj, tp, path, hint="")


def _struct_problems(obj: Mapping[Any, Any], struct: type[msgspec.Struct], path: str) -> list[Problem]:
    found: list[Problem] = []
    fields = {f.encode_name: f for f in msgspec.structs.fields(struct)}
    hints: Mapping[str, str] = getattr(struct, "FIELD_HINTS", {})
    tag_field = struct.__struct_config__.tag_field
    for key in obj:
        if not isinstance(key, str):
            found.append(Problem(path=join_path(path, str(key)), message="field names must be strings",
                                 hint="quote the key"))
        elif key not in fields and key != tag_field:
            close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
            hint = f"did you mean `{close[0]}`?" if close else "known fields: " + ", ".join(fields)
            found.append(Problem(path=join_path(path, key), message=f"unknown field `{key}`", hint=hint))
    for name, field in fields.items():
        where = join_path(path, name)
        required = field.default is msgspec.NODEFAULT and field.default_factory is msgspec.NODEFAULT
        if name not in obj:
            if required:
                found.append(Problem(path=where, message="missing required field",
                                     hint=hints.get(name, f"add `{name}`")))
            continue
        value = obj[name]
        sub = _struct_in(field.type)
        if sub is not None and isinstance(value, Mapping):
            found.extend(_struct_problems(value, sub, where))
            continue
        item = _list_item_in(field.type)
        if item is not None and _struct_in(item) is not None and isinstance(value, list):
            for i, element in enumerate(value):
                found.extend(problems_in(element, item, f"{where}[{i}]"))
            continue
        kv = _dict_types_in(field.type)
        if kv is not None and isinstance(value, Mapping):
            hint = hints.get(name, "")
            for k, v in value.items():
                at = join_path(where, str(k))
                key_problems = _leaf_problems(k, kv[0], at, hint=hint)
                found.extend(Problem(path=p.path, message=f"bad key: {p.message}", hint=p.hint)
                             for p in key_problems)
                found.extend(_leaf_problems(v, kv[1], at, hint=hint))
            continue
        found.extend(_leaf_problems(value, field.type, where, hint=hints.get(name, "")))
    return found


def _leaf_problems(value: Any, tp: Any, path: str, *, hint: str) -> list[Problem]:
    try:
        msgspec.convert(value, tp)
    except msgspec.ValidationError as e:
        problem = spec_error_from(e, path).problems[0]
        message = problem.message
        if isinstance(value, float) and not value.is_integer() and "Expected `int`" in message:
            message = f"must be a whole number, got {value}"
        elif message.startswith("Expected") and ", got `" not in message:
            message = f"{message}, got {_short(value)}"
        return [Problem(path=problem.path, message=message,
                        hint=problem.hint or hint or _hint_for_type(tp))]
    return []


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def _hint_for_type(tp: Any) -> str:
    """A generic fix derived from the type: the allowed values of a Literal, above all."""
    tp = _strip_annotated(tp)
    literals: list[str] = []
    for arg in get_args(tp) if _is_union(tp) else (tp,):
        arg = _strip_annotated(arg)
        if get_origin(arg) is Literal:
            literals.extend(str(v) for v in get_args(arg))
    if literals:
        return "use one of " + ", ".join(literals)
    return ""
