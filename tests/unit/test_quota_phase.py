"""`JobView.quota_phase` is the one answer to "does this job hold quota, for what": placement
places the RESERVED, quota gives back the OWED, quota's rounds count from it."""

from __future__ import annotations

import itertools

from corral.contracts.jobspec import validate_job_spec
from corral.projection import JobState, JobView, QuotaPhase
from corral.services.quota.round_inputs import Kind, classify

SPEC = validate_job_spec({"name": "j", "queue": "q", "replicas": 1, "gpus_per_replica": 1, "runtime": "sim",
                          "duration_seconds": 1})


def _jobs() -> list[JobView]:
    return [JobView(job_id="j", spec=spec, state=state, quota_gpus=quota, quota_stale=stale, holding=holding)
            for state, spec, quota, stale, holding in itertools.product(JobState, (SPEC, None), (0, 2), (False, True),
                                                                         (False, True))]


def test_placement_places_exactly_the_jobs_holding_quota_for_this_attempt() -> None:
    for j in _jobs():
        waits_holding_quota = (j.state is JobState.PENDING and bool(j.quota_gpus) and not j.quota_stale
                               and j.spec is not None)
        assert (j.quota_phase is QuotaPhase.RESERVED) == waits_holding_quota, j


def test_quota_gives_back_exactly_what_an_ended_or_released_attempt_holds() -> None:
    for j in _jobs():
        owed = bool(j.quota_gpus) and (j.state.terminal or j.quota_stale)
        assert (j.quota_phase is QuotaPhase.OWED) == owed, j


def test_a_round_counts_quota_not_given_back_while_its_gpus_do_not_count() -> None:
    for j in _jobs():
        if j.state is JobState.PENDING and j.spec is not None:
            want = (Kind.WAITING if not j.quota_gpus else (Kind.NONE if j.holding else Kind.HELD) if j.quota_stale
                    else Kind.RESERVED)
        elif j.quota_gpus and not j.holding and (j.state is not JobState.PENDING or j.quota_stale):
            want = Kind.HELD
        else:
            want = Kind.NONE
        assert classify(j) is want, j
