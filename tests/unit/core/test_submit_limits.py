"""The submission limits per user (`corral.core.submit_limits`) against their plain definitions.

- count: a submission is refused LIMIT when, for some queue on its path with a limit L, the user
  already has L jobs submitted and not ended anywhere in that queue's subtree;
- rate: over any stretch of time, the admitted submissions of a user to a rated queue are at most
  `burst` + the rate times its length; a refused one is told a wait after which it is admitted;
- a verdict depends on the log alone: folding the same events again gives the same verdicts.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.core.submit_limits import OverCount, OverRate, SubmitLedger, UserLimits, path_of

QUEUES = ("a", "a/x", "a/y", "b")
USERS = ("alice", "bob")


def limits_from(table: dict[str, UserLimits]) -> Callable[[str], UserLimits | None]:
    return table.get


def in_subtree(leaf: str, queue: str) -> bool:
    return leaf == queue or leaf.startswith(queue + "/")


limit_tables = st.fixed_dictionaries({q: st.builds(UserLimits, max_submitted=st.one_of(st.none(), st.integers(1, 4)))
                                      for q in QUEUES})
# steps: submit (user, leaf) or end the n-th live job
steps = st.lists(st.one_of(st.tuples(st.just("submit"), st.sampled_from(USERS), st.sampled_from(("a/x", "a/y", "b"))),
                           st.tuples(st.just("end"), st.integers(0, 20), st.just(""))), max_size=40)


@settings(max_examples=300)
@given(limit_tables, steps)
def test_the_count_limit_is_its_plain_definition(table: dict[str, UserLimits], script: list[tuple[str, object, str]]
                                                 ) -> None:
    ledger, live = SubmitLedger(), []  # live: (job, user, leaf) submitted and not ended
    limits = limits_from(table)
    for n, (kind, a, b) in enumerate(script):
        if kind == "end":
            if live:
                job, _, _ = live.pop(int(a) % len(live))  # type: ignore[call-overload]
                ledger.ended(job)
            continue
        user, leaf = str(a), b
        over = [q for q in path_of(leaf) if (m := table[q].max_submitted) is not None
                and sum(1 for _, u, lf in live if u == user and in_subtree(lf, q)) >= m]
        verdict = ledger.refusal(user, leaf, float(n), limits)
        if over:
            assert isinstance(verdict, OverCount) and verdict.queue == over[0]  # the nearest queue first
            assert verdict.count == verdict.limit == table[over[0]].max_submitted
        else:
            assert verdict is None
            live.append((f"j{n}", user, leaf))
            ledger.submitted(f"j{n}", user, leaf)
            ledger.submitted(f"j{n}", user, leaf)  # folded twice (a redelivery): counted once


times = st.lists(st.floats(0, 30, allow_nan=False), min_size=1, max_size=60).map(
    lambda gaps: [sum(gaps[:i + 1]) for i in range(len(gaps))])


@settings(max_examples=300)
@given(st.floats(0.5, 120, allow_nan=False), st.integers(1, 10), times)
def test_the_rate_never_admits_more_than_burst_plus_rate_times_time(per_minute: float, burst: int,
                                                                    at: list[float]) -> None:
    table = {"b": UserLimits(rate_per_minute=per_minute, burst=burst)}
    ledger, admitted = SubmitLedger(), []
    for t in at:
        verdict = ledger.refusal("alice", "b", t, table.get)
        if verdict is None:
            ledger.admitted("alice", "b", t, table.get)
            admitted.append(t)
        else:
            assert isinstance(verdict, OverRate) and verdict.retry_after > 0
            # after the wait it is told, the same submission is admitted (nothing else came meanwhile)
            again = SubmitLedger()
            again.buckets = dict(ledger.buckets)
            assert again.refusal("alice", "b", t + verdict.retry_after + 1e-6, table.get) is None
    for i, start in enumerate(admitted):
        for j in range(i, len(admitted)):
            assert j - i + 1 <= burst + (admitted[j] - start) * per_minute / 60 + 1e-6


def test_a_burst_is_absorbed_then_one_token_per_period() -> None:
    table = {"b": UserLimits(rate_per_minute=6, burst=3)}  # a token every 10 s
    ledger = SubmitLedger()
    verdicts = []
    for t in (0.0, 0.1, 0.2, 0.3, 5.0, 10.3, 10.4):
        v = ledger.refusal("alice", "b", t, table.get)
        verdicts.append(v)
        if v is None:
            ledger.admitted("alice", "b", t, table.get)
    assert [v is None for v in verdicts] == [True, True, True, False, False, True, False]
    # the tokens refilled while the burst came (0.2 s at 0.1 a second) count: 9.7 s, not 10
    assert isinstance(verdicts[3], OverRate) and abs(verdicts[3].retry_after - 9.7) < 1e-6
    assert ledger.refusal("bob", "b", 0.4, table.get) is None  # a bucket per user


def test_a_parent_limit_binds_the_children_together_and_other_users_apart() -> None:
    table = {"a": UserLimits(max_submitted=2)}
    ledger = SubmitLedger()
    ledger.submitted("1", "alice", "a/x")
    ledger.submitted("2", "alice", "a/y")
    assert ledger.refusal("alice", "a/x", 0, table.get) == OverCount("a", 2, 2)
    assert ledger.refusal("alice", "b", 0, table.get) is None
    assert ledger.refusal("bob", "a/x", 0, table.get) is None
    ledger.ended("1")
    ledger.ended("1")
    assert ledger.refusal("alice", "a/x", 0, table.get) is None


@given(steps, st.floats(1, 60, allow_nan=False), st.integers(1, 5))
def test_folding_the_same_log_again_gives_the_same_verdicts(script: list[tuple[str, object, str]],
                                                            per_minute: float, burst: int) -> None:
    table = {"a": UserLimits(max_submitted=3, rate_per_minute=per_minute, burst=burst)}
    log: list[tuple[str, ...]] = []  # what a service appends: submitted, admitted or ended
    live_ledger, verdicts = SubmitLedger(), []
    for n, (kind, a, b) in enumerate(script):
        if kind == "end":
            log.append(("ended", f"j{int(a) % (n + 1)}"))  # type: ignore[call-overload]
            live_ledger.ended(log[-1][1])
            continue
        job, user, leaf, t = f"j{n}", str(a), b, n * 0.5
        verdict = live_ledger.refusal(user, leaf, t, table.get)
        verdicts.append(verdict)
        if verdict is None:
            for entry in (("submitted", job, user, leaf), ("admitted", job, user, leaf, str(t))):
                log.append(entry)
            live_ledger.submitted(job, user, leaf)
            live_ledger.admitted(user, leaf, t, table.get)
    replayed = SubmitLedger()
    for entry in log:
        if entry[0] == "submitted":
            replayed.submitted(entry[1], entry[2], entry[3])
        elif entry[0] == "admitted":
            replayed.admitted(entry[2], entry[3], float(entry[4]), table.get)
        else:
            replayed.ended(entry[1])
    assert replayed.counts == live_ledger.counts and replayed.buckets == live_ledger.buckets
