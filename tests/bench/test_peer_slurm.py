"""bench/peer_slurm.py runs end to end in its smoke size when Slurm is installed, and says what to
install when it is not. Sizes are tiny: this checks the script, never how fast either system is
(the figures are the full-size runs', bench/README.md)."""

from __future__ import annotations

import os
import sys

import pytest

from tests.bench.test_bench_smoke import BENCH, run

sys.path.insert(0, str(BENCH))
import slurm_local  # bench/ is a folder of scripts, not a package

MISSING = slurm_local.missing_programs()


def test_missing_slurm_names_what_to_install() -> None:
    assert slurm_local.missing_programs("/nonexistent") == list(slurm_local.PROGRAMS)
    assert "apt-get install" in slurm_local.INSTALL_HINT and "slurm-wlm" in slurm_local.INSTALL_HINT


@pytest.mark.skipif(bool(MISSING), reason=f"Slurm is not installed (missing {', '.join(MISSING)}): "
                    f"{slurm_local.INSTALL_HINT}")
@pytest.mark.skipif(os.geteuid() != 0, reason="the fake GPUs are device files (mknod) and munged runs forced: root")
def test_peer_bench_runs_both_systems() -> None:
    out = run("bench/peer_slurm.py", "--smoke", timeout=600)
    for name in ("A:", "B1:", "B2:", "L:"):
        assert name in out
    assert "corral/slurm" in out and "slurmstepd" in out and "node-agents" in out and "acceptance" in out
    assert "probe:   python" in out and "(did not finish)" not in out
    assert "Corral L: submit -> ..." in out and "quota" in out and "placed" in out  # the hop breakdown
