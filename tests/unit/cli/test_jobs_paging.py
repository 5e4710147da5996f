"""`corral jobs` shows a page: the oldest N matching jobs, and a line saying how many more match.

With 20,000 jobs waiting, printing them all took seconds and nobody reads them; squeue users
filter. The page is the first N by submission (ties by id), built without sorting the rest.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from corral.cli.jobs import more_hint
from corral.projection import JobState, JobView
from corral.readmodel.pages import JobFilter, first_by_submission, selected

T0 = datetime(2026, 12, 7, tzinfo=UTC)


def view(n: int, at: int | None, state: JobState = JobState.PENDING, user: str = "alice") -> JobView:
    return JobView(job_id=f"j{n:03d}", user=user, state=state,
                   submitted_at=None if at is None else T0 + timedelta(seconds=at))


@given(st.lists(st.one_of(st.none(), st.integers(0, 50)), max_size=40), st.integers(0, 45))
def test_the_page_is_the_first_n_of_the_whole_sorted_listing(times: list[int | None], n: int) -> None:
    jobs = [view(i, at) for i, at in enumerate(times)]
    whole = sorted(jobs, key=lambda j: (j.submitted_at or datetime.max.replace(tzinfo=UTC), j.job_id))
    assert first_by_submission(jobs, n or len(jobs)) == whole[:n or len(jobs)]


def test_the_more_line_says_how_many_and_how_to_see_them() -> None:
    assert more_hint(100, 100) is None
    line = more_hint(100, 20_000)
    assert line is not None and "19,900 more" in line and "20,000 match" in line
    assert "--limit 0" in line and "--user" in line


def test_selection_by_state_user_and_queue() -> None:
    jobs = [view(1, 1), view(2, 2, JobState.COMPLETED), view(3, 3, user="bob"), view(4, 4, JobState.RUNNING)]
    assert [j.job_id for j in selected(jobs, JobFilter())] == ["j001", "j003",
                                                                                                       "j004"]
    assert [j.job_id for j in selected(jobs, JobFilter(user="bob", all_jobs=True))] == ["j003"]
    assert [j.job_id for j in selected(jobs, JobFilter(states={"COMPLETED"}))] == ["j002"]
    assert selected(jobs, JobFilter(queue="team-a", all_jobs=True)) == []
