"""Each event type's wiring is declared once, on its class (`flow`), and everything derives from it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from corral.contracts import events as ev
from corral.contracts import flow as fl
from corral.contracts import routes as rt
from corral.contracts import subjects as sj
from corral.projection import _HANDLERS
from corral.services.admission.service import Admission
from corral.services.placement.service import Placement
from corral.services.preemption.service import Preemption
from corral.services.quota.service import Quota

ROOT = Path(__file__).resolve().parents[3]
SERVICES = {fl.ADMISSION: Admission, fl.QUOTA: Quota, fl.PLACEMENT: Placement, fl.PREEMPTION: Preemption}
WRITERS = {*fl.CONSUMERS, fl.RELAY, fl.ADMIN_CLI}


def test_every_event_declares_a_known_writer_and_a_stream() -> None:
    for cls in ev.ALL_EVENTS:
        flow = fl.flow_of(cls)
        assert flow.writers, cls
        assert set(flow.writers) <= WRITERS, (cls, flow.writers)
    with pytest.raises(ValueError, match="at least one writer"):
        fl.Flow(writers=(), stream="job")
    with pytest.raises(ValueError, match="consumers"):
        fl.Flow(writers=(fl.QUOTA,), stream="job", consumers=("quotaa",))


def test_services_consume_and_own_exactly_what_the_declarations_say() -> None:
    for name, service in SERVICES.items():
        assert service.name == name
        assert set(service.consumes or ()) == set(fl.names(rt.consumed_by(name))), name
        assert set(service.inbox) == set(rt.inbox_of(name)), name
    from corral.services.node_agent.service import CONSUMED_TYPES

    assert set(CONSUMED_TYPES) == set(fl.names(rt.consumed_by(fl.NODE_AGENT)))


def test_subjects_and_permissions_derive_from_the_declarations() -> None:
    assert set(sj.INBOX_TYPES) == {c.type_name() for c in ev.ALL_EVENTS if fl.flow_of(c).inbox}
    for kind, types in (("node", sj.NODE_REPORT_TYPES), ("user", sj.USER_REQUEST_TYPES),
                        ("admin", sj.ADMIN_REQUEST_TYPES)):
        assert set(types) == {c.type_name() for c in ev.ALL_EVENTS if kind in fl.flow_of(c).inbox}, kind
    for cls in ev.ALL_EVENTS:  # a request's owner records it: its inbox is the owner's
        flow = fl.flow_of(cls)
        if flow.inbox:
            assert cls.type_name() in SERVICES[flow.writers[0]].inbox, cls


def test_a_consumer_folds_every_event_it_is_sent() -> None:
    """A deciding service folds through the projection; an event it is sent that the projection
    does not fold costs a delivery and changes nothing it decides on."""
    for name in SERVICES:
        unfolded = [c.type_name() for c in rt.consumed_by(name) if c not in _HANDLERS]
        assert not unfolded, (name, unfolded)
    agent = ROOT / "services" / "node_agent"
    used = {node.id for path in agent.rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Name)}
    unhandled = [c.type_name() for c in rt.consumed_by(fl.NODE_AGENT) if c.__name__ not in used]
    assert not unhandled, unhandled


def test_what_a_service_reacts_to_is_what_it_folds() -> None:
    for name, service in SERVICES.items():
        folded = set(rt.consumed_by(name)) | set(rt.written_by(name))
        assert set(service.events) <= folded, (name, set(service.events) - folded)
    for triggers in (Placement.place_triggers, Placement.lifecycle_triggers):
        folded = set(rt.consumed_by(fl.PLACEMENT)) | set(rt.written_by(fl.PLACEMENT))
        assert triggers <= folded, triggers - folded


def test_a_service_is_not_sent_what_it_alone_writes() -> None:
    """It folds its own events when it appends them: the bus's copy would be a duplicate."""
    for name in (fl.QUOTA, fl.PLACEMENT):
        own = [c for c in rt.written_by(name) if fl.flow_of(c).writers == (name,)]
        echoed = [c.type_name() for c in own if c in set(rt.consumed_by(name))]
        assert not echoed, (name, echoed)


def test_the_relay_publishes_what_some_process_is_sent_and_nothing_else() -> None:
    """An event no process is sent stays in the log alone; every type node work is made of is
    published (the relay's resume takes any other for one never published)."""
    from corral.contracts.node_work import JOB_WORK, NODE_EVENTS

    relayed = rt.relayed_types()
    assert relayed == {c.type_name() for c in ev.ALL_EVENTS if fl.flow_of(c).consumers}
    assert set(fl.names((*JOB_WORK, *NODE_EVENTS, ev.GangReserved))) <= relayed
    for cls in (ev.GpusAllocated, ev.GpusReleased, ev.WorkerStarted, ev.WorkerExited):
        assert cls.type_name() not in relayed, cls


def _bare_event_names(root: Path) -> list[str]:
    known = {cls.type_name() for cls in ev.ALL_EVENTS}
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    return found


def test_no_event_type_is_wired_by_a_bare_string() -> None:
    """Services and libraries name event types by class (`ev.JobSubmitted`, `type_name()`,
    `corral.contracts.flow.names`): a renamed or removed type is then an import error, never a
    filter that silently matches nothing."""
    found = _bare_event_names(ROOT / "services") + _bare_event_names(ROOT / "libs" / "corral")
    assert not found, "\n".join(found)
