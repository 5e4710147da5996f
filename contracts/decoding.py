"""An event class's own JSON decoding and the round trip that validates a new event.

Apart from the registry because the envelope validates what `Event.create` makes, and the
registry imports every event class: the envelope reaches this module, never the registry.
Each class's decoder is built on first use: building one resolves every annotation of the class
and its fields (~1 ms each), which a process that decodes a few types (a CLI command) should not
pay for all of them at import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from corral.contracts.problems import ContractError, problem_from_validation_error

if TYPE_CHECKING:
    from corral.contracts.envelope import Event

E = TypeVar("E", bound="Event")

_ENCODER = msgspec.json.Encoder()
_DECODERS: dict[type, msgspec.json.Decoder[Any]] = {}


def decoder_for(cls: type[E]) -> msgspec.json.Decoder[Any]:
    """`cls`'s JSON decoder, built on first use and kept."""
    decoder = _DECODERS.get(cls)
    if decoder is None:
        decoder = _DECODERS[cls] = msgspec.json.Decoder(cls)
    return decoder


def utf8_where(data: bytes | bytearray | memoryview | str) -> str:
    """Where a payload stops being UTF-8 (' (byte 0xe9 at offset 312)'), or '' when it is UTF-8."""
    if isinstance(data, str):
        return ""
    raw = bytes(data)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f" (the payload is not UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start})"
    return ""


def decode_as(cls: type[E], raw: bytes | str) -> E:
    """`raw` decoded as `cls`; a ContractError naming the field (a nested spec's first problem)."""
    try:
        event: E = decoder_for(cls).decode(raw)
        return event
    except msgspec.ValidationError as e:
        problem = problem_from_validation_error(e)
        cause = e.__cause__
        inner = getattr(cause, "problems", None)
        if inner:  # a nested spec's __post_init__ listed problems: name the first one
            first = inner[0]
            field = f"{problem.path}.{first.path}" if problem.path and first.path else (
                problem.path or first.path)
            problem = type(problem)(path=field, message=first.message, hint=first.hint)
        where = f" at `{problem.path}`" if problem.path else ""
        raise ContractError(f"invalid {cls.type_name()} v{cls.version()}{where}: {problem.message}",
                            field=problem.path, event_type=cls.type_name(),
                            schema_version=cls.version()) from e
    except msgspec.DecodeError as e:
        raise ContractError(f"malformed JSON: {e}{utf8_where(raw)}") from e


def validated(event: E) -> E:
    """`event` after a round trip through its contract: Struct constructors do not check types
    or constraints, decoding does. Raises ContractError naming the field."""
    cls = type(event)
    try:
        data = _ENCODER.encode(event)
    except (TypeError, ValueError, OverflowError) as e:
        raise ContractError(f"cannot encode {cls.type_name()}: {e}", event_type=cls.type_name()) from e
    try:
        result: E = decoder_for(cls).decode(data)
        return result
    except msgspec.ValidationError:
        return decode_as(cls, data)  # raises ContractError with the field
