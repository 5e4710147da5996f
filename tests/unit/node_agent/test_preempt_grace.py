"""A preemption's grace is measured by the clock of the one deciding, never by the node's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from corral.contracts import events as ev
from corral.contracts.envelope import Reason, job_stream
from corral.services.node_agent.service import preempt_grace


def _preempt(grace: float, decided: datetime) -> ev.PreemptRequested:
    return ev.PreemptRequested.new(stream=job_stream("j1"), actor="preemption", victim_job_id="j1", for_job_id="j2",
                                   now=decided, deadline=decided + timedelta(seconds=grace),
                                   reason=Reason(code="PREEMPTED", message="for j2"))


@given(st.floats(0, 3600), st.floats(-30, 30))
def test_the_grace_is_the_deciders_whatever_this_nodes_clock_says(grace: float, minutes_off: float) -> None:
    """This node's clock is `minutes_off` minutes off the decider's (the decision is stamped by
    the decider's clock): measured by its own clock, a node ahead would SIGKILL at once, one behind
    overrun."""
    decided = datetime.now(UTC) - timedelta(minutes=minutes_off)
    assert abs(preempt_grace(_preempt(grace, decided)) - grace) < 1e-3


def test_a_deadline_before_the_decision_is_no_grace() -> None:
    assert preempt_grace(_preempt(-5.0, datetime.now(UTC))) == 0.0


@given(st.floats(0, 3600), st.floats(-1800, 1800))
def test_a_stepd_gives_the_grace_the_agent_names_whatever_its_own_clock_says(grace: float, off: float) -> None:
    """The agent and a stepd it adopted may read different clocks (one started before a step of
    the node's clock): the command's grace holds; its wall deadline is only for an older agent's."""
    from unittest import mock

    from corral.services.node_agent.process.stepd import command_grace

    sent = {"op": "preempt", "grace": grace, "deadline": 1_000_000.0 + grace}
    with mock.patch("time.time", return_value=1_000_000.0 + off):
        assert command_grace(sent) == grace
        assert abs(command_grace({"op": "preempt", "deadline": 1_000_000.0 + grace}) - (grace - off)) < 1e-6
