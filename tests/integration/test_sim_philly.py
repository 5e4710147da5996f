"""A slice of the real Philly trace through the simulator: the exact schedule it writes passes the
independent checker, and the same seed gives the same bytes. Skipped when the traces folder
(../shared/traces from the project root) is not there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.sim import FailureModel, check_schedule, result_document, run_simulation, write_json

PHILLY = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "philly_2017_sep_oct.csv"

pytestmark = pytest.mark.skipif(not PHILLY.is_file(), reason=f"Philly trace not found at {PHILLY}")


def test_philly_slice_schedule_passes_the_independent_checker() -> None:
    result = run_simulation(f"philly:{PHILLY}", "40x8:H100", policy="corral", limit=400)
    document = json.loads(json.dumps(result_document(result)))  # exactly what --json writes
    assert check_schedule(document["jobs"], result.cluster) == []
    assert result.summary.finished == 400
    assert result.summary.avg_wait > 0  # the cluster is loaded enough that jobs queue


def test_same_seed_gives_identical_output_bytes(tmp_path: Path) -> None:
    failures = FailureModel(mtbf_hours=24 * 7, repair_hours=2)
    paths = []
    for n in range(2):
        result = run_simulation(f"philly:{PHILLY}", "24x8:H100", policy="las", limit=200, seed=7, failures=failures)
        paths.append(write_json(result, tmp_path / f"run{n}.json"))
        assert result.stats.node_failures > 0
        assert check_schedule(result_document(result), result.cluster) == []
    assert paths[0].read_bytes() == paths[1].read_bytes()
