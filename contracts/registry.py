"""Event registry: (type, schema_version) -> class, JSON encode/decode, upcasters.

Why one decoder: consumers must never crash on a bad message (a foreign pipeline's typo, an
old version, random bytes on the subject). Every failure becomes one `ContractError` naming
the field, which a consumer can dead-letter; any other exception from `decode` is a bug.

Upcasters turn an old version's JSON object into the next version's, so old events in the log
stay readable after a contract changes: register `(type, from_version) -> fn(dict) -> dict`;
`decode` chains them up to the registered class's version.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import msgspec

from corral.contracts.decoding import decode_as, decoder_for, validated
from corral.contracts.envelope import Event
from corral.contracts.events import ALL_EVENTS, UPCASTERS
from corral.contracts.problems import ContractError, problem_from_validation_error

__all__ = ["REGISTRY", "EventRegistry", "Upcaster", "decode", "encode", "validated"]

E = TypeVar("E", bound=Event)
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

_ENCODER = msgspec.json.Encoder()
_MAX_UPCASTS = 64


class _Header(msgspec.Struct):
    """Just enough of an event to pick its class; other keys are ignored here."""

    type: str
    schema_version: int


class EventRegistry:
    def __init__(self, classes: Iterable[type[Event]] = ()) -> None:
        self._classes: dict[tuple[str, int], type[Event]] = {}
        self._current: dict[str, int] = {}
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        for cls in classes:
            self.register(cls)

    def register(self, cls: type[Event]) -> type[Event]:
        """Add an event class (usable as a decorator); the latest version becomes the current one."""
        key = (cls.type_name(), cls.version())
        if key in self._classes and self._classes[key] is not cls:
            raise ValueError(f"{key[0]} v{key[1]} is already registered to {self._classes[key]!r}")
        self._classes[key] = cls
        self._current[key[0]] = max(self._current.get(key[0], 0), key[1])
        return cls

    def decoder(self, cls: type[Event]) -> msgspec.json.Decoder[Any]:
        """`cls`'s JSON decoder, built on first use (`corral.contracts.decoding`)."""
        return decoder_for(cls)

    def register_upcaster(self, type_name: str, from_version: int, upcaster: Upcaster) -> None:
        """`upcaster` turns a `from_version` JSON object into `from_version + 1` (it must set the
        new `schema_version`)."""
        self._upcasters[(type_name, from_version)] = upcaster

    def classes(self) -> list[type[Event]]:
        return list(self._classes.values())

    def class_for(self, type_name: str, schema_version: int) -> type[Event]:
        try:
            return self._classes[(type_name, schema_version)]
        except KeyError:
            raise self._unknown(type_name, schema_version) from None

    def encode(self, event: Event) -> bytes:
        return _ENCODER.encode(event)

    def decode(self, data: bytes | bytearray | memoryview | str) -> Event:
        """Decode one JSON event; any failure is a ContractError naming the field."""
        try:
            raw = bytes(data) if isinstance(data, (bytearray, memoryview)) else data
            header = _decode_header(raw)
            key = (header.type, header.schema_version)
            cls = self._classes.get(key)
            if cls is not None:
                return self._decode_as(cls, raw)
            if key in self._upcasters:
                return self._upcast(header, raw)
            raise self._unknown(*key)
        except ContractError:
            raise
        except Exception as e:  # a decoder must never leak another error type
            raise ContractError(f"cannot decode event: {type(e).__name__}: {e}") from e

    def _decode_as(self, cls: type[E], raw: bytes | str) -> E:
        return decode_as(cls, raw)

    def _upcast(self, header: _Header, raw: bytes | str) -> Event:
        try:
            doc = msgspec.json.decode(raw)
        except msgspec.DecodeError as e:
            raise ContractError(f"malformed JSON: {e}") from e
        type_name, version = header.type, header.schema_version
        for _ in range(_MAX_UPCASTS):
            if (type_name, version) in self._classes:
                return self._decode_as(self._classes[(type_name, version)], _ENCODER.encode(doc))
            upcaster = self._upcasters.get((type_name, version))
            if upcaster is None:
                raise self._unknown(type_name, version)
            try:
                doc = upcaster(dict(doc))
            except Exception as e:
                raise ContractError(f"cannot upcast {type_name} v{version}: {type(e).__name__}: {e}",
                                    event_type=type_name, schema_version=version) from e
            if not isinstance(doc, dict) or doc.get("schema_version") != version + 1:
                raise ContractError(f"upcaster of {type_name} v{version} must return a dict with "
                                    f"schema_version {version + 1}", event_type=type_name,
                                    schema_version=version)
            version += 1
        raise ContractError(f"{type_name}: too many upcasts from v{header.schema_version}")

    def _unknown(self, type_name: str, schema_version: int) -> ContractError:
        known = self._current.get(type_name)
        if known is None:
            msg = f"unknown event type `{type_name}`"
            field = "type"
        else:
            msg = f"unknown schema_version {schema_version} of `{type_name}` (current is {known})"
            field = "schema_version"
        return ContractError(msg, field=field, event_type=type_name, schema_version=schema_version)


def _decode_header(raw: bytes | str) -> _Header:
    try:
        return msgspec.json.decode(raw, type=_Header)
    except msgspec.ValidationError as e:
        problem = problem_from_validation_error(e)
        raise ContractError(f"not an event: {problem.message}" +
                            (f" at `{problem.path}`" if problem.path else ""),
                            field=problem.path) from e
    except msgspec.DecodeError as e:
        raise ContractError(f"malformed JSON: {e}") from e


REGISTRY = EventRegistry(ALL_EVENTS)
for _type, _version, _upcaster in UPCASTERS:
    REGISTRY.register_upcaster(_type, _version, _upcaster)


def encode(event: Event) -> bytes:
    """JSON bytes of an event (the bytes stored in the event log and published on the bus)."""
    return REGISTRY.encode(event)


def decode(data: bytes | bytearray | memoryview | str) -> Event:
    """The event in `data`, or ContractError naming the field. Never raises anything else."""
    return REGISTRY.decode(data)
