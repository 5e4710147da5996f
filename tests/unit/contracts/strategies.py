"""Hypothesis strategies built from msgspec types, so every contract gets generated instances.

Why a builder: `st.from_type` cannot read msgspec Structs or their `Meta` constraints; walking
`msgspec.inspect.type_info` gives patterns, bounds and literal values, so generated values are
valid by construction and new events are covered without writing a strategy by hand.
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

import msgspec
import msgspec.inspect as mi
from hypothesis import strategies as st

from corral.contracts.envelope import Event

# hypothesis imports its regex strategy lazily, on the first `from_regex` it validates, and pytest
# rewrites that module's asserts as it is imported. Imported deep inside hypothesis' recursive
# validation of a struct strategy, CPython 3.11.7's compile() failed with "SystemError: AST
# constructor recursion depth mismatch" (the fuzz test, first in its xdist worker). Validated here,
# at import, the module is loaded from a shallow stack.
st.from_regex(r"^a$", fullmatch=True).validate()

_INT_BOUND = 2**53
_MAX_ITEMS = 3

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-_INT_BOUND, _INT_BOUND),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=_MAX_ITEMS),
                            st.dictionaries(st.text(max_size=8), inner, max_size=_MAX_ITEMS)),
    max_leaves=8,
)


def _bounds(t: Any) -> tuple[Any, Any]:
    low = t.ge if t.ge is not None else t.gt
    high = t.le if t.le is not None else t.lt
    return low, high


def strategy_for(t: mi.Type) -> st.SearchStrategy[Any]:
    """A strategy of valid Python values for one msgspec inspect type."""
    if isinstance(t, mi.Metadata):
        return strategy_for(t.type)
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.IntType):
        low, high = _bounds(t)
        low = -_INT_BOUND if low is None else (low + 1 if t.gt is not None and t.ge is None else low)
        high = _INT_BOUND if high is None else (high - 1 if t.lt is not None and t.le is None else high)
        return st.integers(low, high)
    if isinstance(t, mi.FloatType):
        low, high = _bounds(t)
        return st.floats(min_value=low, max_value=high, allow_nan=False, allow_infinity=False,
                         exclude_min=t.gt is not None, exclude_max=t.lt is not None)
    if isinstance(t, mi.StrType):
        if t.pattern is not None:
            base = st.from_regex(t.pattern, fullmatch=True)
        else:
            base = st.text(min_size=t.min_length or 0, max_size=min(t.max_length or 16, 16))
        return base.filter(lambda s: (t.min_length is None or len(s) >= t.min_length)
                           and (t.max_length is None or len(s) <= t.max_length))
    if isinstance(t, mi.DateTimeType):
        return st.datetimes(timezones=st.just(UTC))
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(list(t.values))
    if isinstance(t, mi.UnionType):
        return st.one_of(*(strategy_for(u) for u in t.types))
    if isinstance(t, mi.ListType):
        low = t.min_length or 0
        return st.lists(strategy_for(t.item_type), min_size=low, max_size=max(low, _MAX_ITEMS))
    if isinstance(t, mi.DictType):
        return st.dictionaries(strategy_for(t.key_type), strategy_for(t.value_type), max_size=_MAX_ITEMS)
    if isinstance(t, mi.AnyType):
        return json_values
    if isinstance(t, mi.StructType):
        return struct_strategy(t.cls)
    raise NotImplementedError(f"no strategy for {t!r}: extend tests/unit/contracts/strategies.py")


def _build(cls: type[msgspec.Struct], kwargs: dict[str, Any]) -> Any:
    """Construct, or None when a cross-field rule (`__post_init__`) refuses the combination."""
    try:
        return cls(**kwargs)
    except (ValueError, TypeError):
        return None


def struct_strategy(cls: type[msgspec.Struct]) -> st.SearchStrategy[Any]:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for f in info.fields:
        if f.name == "schema_version" and issubclass(cls, Event):
            fields[f.name] = st.just(cls.version())
        else:
            fields[f.name] = strategy_for(f.type)
    return (st.fixed_dictionaries(fields)
            .map(lambda kwargs: _build(cls, kwargs))
            .filter(lambda built: built is not None))
