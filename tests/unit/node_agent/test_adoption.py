"""The log's verdict on an adopted gang: keep it only while the log holds it reserved on this node."""

from __future__ import annotations

from corral.contracts.envelope import Event, Reason, job_stream
from corral.contracts.events import GangReleased, GangReserved, JobCancelled, JobRequeued, RankPlacement
from corral.services.node_agent.process.adoption import ReservationLedger, Verdict, should_stop

R = Reason(code="X", message="x")


def reserved(job: str, attempt: int, *nodes: str) -> GangReserved:
    return GangReserved.new(stream=job_stream(job), actor="placement", job_id=job, attempt=attempt,
                            ranks=[RankPlacement(rank=i, node=n, gpus=[0]) for i, n in enumerate(nodes)],
                            world_size=len(nodes), master_addr="127.0.0.1", master_port=29500)


def ledger(*events: Event) -> ReservationLedger:
    book = ReservationLedger()
    for e in events:
        book.fold(e)
    return book


def test_a_reserved_attempt_on_this_node_is_kept() -> None:
    book = ledger(reserved("j", 0, "n0", "n1"))
    assert book.verdict("j", 0, "n1") is Verdict.KEEP
    assert book.verdict("j", 0, "n2") is Verdict.ELSEWHERE
    assert not should_stop(Verdict.KEEP, history_complete=True)


def test_released_requeued_superseded_and_ended_attempts_are_stopped() -> None:
    released = ledger(reserved("j", 0, "n0"), GangReleased.new(stream="job-j", actor="p", job_id="j", attempt=0,
                                                               reason=R))
    assert released.verdict("j", 0, "n0") is Verdict.RELEASED
    requeued = ledger(reserved("j", 0, "n0"), JobRequeued.new(stream="job-j", actor="p", job_id="j", attempt=1,
                                                              reason=R))
    assert requeued.verdict("j", 0, "n0") is Verdict.RELEASED
    newer = ledger(reserved("j", 0, "n0"), reserved("j", 1, "n1"))
    assert newer.verdict("j", 0, "n0") is Verdict.SUPERSEDED and newer.verdict("j", 1, "n1") is Verdict.KEEP
    ended = ledger(reserved("j", 0, "n0"), JobCancelled.new(stream="job-j", actor="p", job_id="j", reason=R))
    assert ended.verdict("j", 0, "n0") is Verdict.ENDED
    assert all(should_stop(v, history_complete=False)
               for v in (Verdict.RELEASED, Verdict.SUPERSEDED, Verdict.ENDED, Verdict.ELSEWHERE))


def test_a_gang_the_log_never_mentions_is_stopped_only_if_the_history_is_complete() -> None:
    book = ledger(reserved("other", 0, "n0"))
    assert book.verdict("j", 0, "n0") is Verdict.UNKNOWN
    assert should_stop(Verdict.UNKNOWN, history_complete=True)
    assert not should_stop(Verdict.UNKNOWN, history_complete=False)
