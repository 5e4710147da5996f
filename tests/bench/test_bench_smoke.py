"""Every benchmark in bench/ runs in a smoke size here, so none can silently break.

Why: bench/core.py had stopped running (it called `_Cycle.decide` with an old signature) and no
test noticed: the figures in bench/README.md are only as good as the scripts that print them.
Sizes are tiny: these check that each script runs end to end and prints its figures, never how
fast (speed targets are met in the full-size runs, bench/README.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
TRACES = BENCH.parent.parent / "shared" / "traces"  # ../shared/traces from the project root, as bench/ reads it
PHILLY = TRACES / "philly_2017_sep_oct.csv"
OPENB = (TRACES / "openb_node_list_gpu_node.csv", TRACES / "openb_pod_list_default.csv")


def run(script: str, *args: str, timeout: float = 300, env: dict[str, str] | None = None) -> str:
    """Run `script` (a path from the project root, e.g. "bench/core.py") and return what it printed."""
    done = subprocess.run([sys.executable, str(ROOT / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=None if env is None else {**os.environ, **env})
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_core_cycle_bench_runs() -> None:
    assert "decisions/s" in run("bench/core.py", "--smoke")
    assert "64x8 rack gang ms" in run("bench/core.py", "--smoke", "--scaling")


@pytest.mark.skipif(not all(p.is_file() for p in OPENB), reason=f"the OpenB traces are not under {TRACES}")
def test_openb_fill_bench_runs() -> None:
    assert "best-fit" in run("bench/openb_fill.py", "--smoke", "--traces", str(TRACES))


def test_eventstore_bench_runs() -> None:
    assert "events/s" in run("bench/eventstore.py", "--smoke")


def test_relay_holder_bench_runs() -> None:
    out = run("bench/relay_holder.py", "--smoke")
    assert "relay + projector holder" in out and "commits" in out


def test_bus_bench_runs() -> None:
    out = run("bench/bus.py", "--smoke")
    assert "deliver" in out and "us/msg" in out and "per job" in out


@pytest.mark.skipif(not PHILLY.is_file(), reason=f"the Philly trace is not at {PHILLY}")
def test_philly_replay_bench_runs() -> None:
    out = run("bench/sim_philly.py", "--smoke")
    assert "Jain's fairness" in out


def test_live_system_bench_runs() -> None:
    out = run("bench/e2e.py", "--smoke")
    assert "placements/s" in out and "CPU per job" in out and "ceiling/s" in out
    assert "probe:   python" in out and "fdatasync p50" in out  # the machine, measured (bench/machine_probe.py)


def test_kueue_shaped_bench_runs() -> None:
    out = run("bench/kueue_baseline.py", "--smoke")
    assert "avg time to admission" in out and "waiting under each reason" in out and "quota in use" in out
    assert "arriving (" in out and "draining (" in out and "per workload:" in out  # CPU by phase and process


def test_kueue_shaped_sim_bench_runs() -> None:
    assert "before quota, by reason" in run("bench/kueue_sim.py", "--smoke")


def test_compiled_core_builds() -> None:
    """bench/compiled.py builds the core with mypyc and the build is the one imported. At -O0, in
    build/mypyc-O0/: the C compiler is what takes the time (~1 min at the benchmarks' -O3, from
    scratch as in CI), and this checks the build, not the speed of what it builds."""
    site = run("bench/compiled.py", "--smoke", timeout=600).strip().splitlines()[-1]
    assert "mypyc-O0" in site
    imported = subprocess.run([sys.executable, "-c", "import corral.core.cycle as m; print(m.__file__)"],
                              capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": site})
    assert imported.stdout.strip().startswith(site) and imported.stdout.strip().endswith(".so"), imported


def test_read_model_bench_runs() -> None:
    """10,000 events: the CLI's questions from the read model agree with the whole log's answers."""
    out = run("bench/readmodel.py", "--smoke")
    assert "why (waiting job)" in out and "before" in out and "fresh process" in out


def test_cli_bench_runs() -> None:
    """Whole `corral` processes timed against a live stack (submit waits for admission's verdict)."""
    out = run("bench/cli.py", "--smoke")
    for command in ("help", "submit", "jobs", "show", "cancel"):
        assert f"  {command} " in out
    assert "CPU p50 ms" in out and "probe:   python" in out


def test_live_system_benches_run_real_processes() -> None:
    """`--runtime process`: every rank a real process (/bin/sleep under a stepd), in both live benches."""
    out = run("bench/e2e.py", "--smoke", "--runtime", "process")
    assert "process runtime" in out and "placements/s" in out and "node-agents" in out
    out = run("bench/kueue_baseline.py", "--smoke", "--runtime", "process")
    assert "process runtime" in out and "avg time to admission" in out


def test_memory_bench_runs() -> None:
    out = run("bench/memory.py", "--smoke", timeout=600)
    assert "steady MiB" in out and "postgres (PSS)" in out and "placement-standby" in out
    assert "probe:   python" in out  # the machine and its load, measured (bench/machine_probe.py)


def test_jobs_page_bench_runs() -> None:
    """`corral jobs` (a page) against `--limit 0` (every row) on a filled stack."""
    out = run("bench/jobs_page.py", "--smoke")
    assert "filled 200 jobs" in out and "corral jobs" in out and "CPU p50" in out


def test_scale_bench_runs() -> None:
    """bench/scale.py --smoke: 10 and 20 nodes, each its own connection, identity and durable."""
    out = run("bench/scale.py", "--smoke", timeout=480)
    assert "deliveries per job" in out and "submit->placed" in out and "nats-server RSS" in out
    assert "probe:   python" in out and "services' backlog growing" in out and "agents (1 processes) CPU" in out
    for read in ("corral nodes ms", "corral top --once ms", "corral jobs ms"):
        line = next(line for line in out.splitlines() if line.startswith(read))
        assert "-" not in line.split()[-2:], out  # each read answered
    bound = next(line for line in out.splitlines() if line.startswith("deliveries <= 3 x touched"))
    assert bound.split()[-2:] == ["True", "True"], out


def test_gpu_health_bench_runs(fake_nvml_lib: Path) -> None:
    # fake_nvml_lib: skipped, saying so, where no C compiler builds the fake NVML the script builds too
    assert "fault -> report p50" in run("bench/gpu_health.py", "--smoke", timeout=120)


def test_quota_playout_bench_runs() -> None:
    assert "quota round ms mean" in run("bench/quota_playout.py", "--smoke")


@pytest.mark.skipif(not PHILLY.is_file(), reason=f"the Philly trace is not at {PHILLY}")
def test_sim_services_ratio_bench_runs() -> None:
    out = run("bench/sim_services_ratio.py", "--smoke", "--policies", "corral")
    assert "ratio services / cycle" in out and "records " in out


def test_stepd_cost_bench_runs() -> None:
    assert "launcher+stepds+jobs" in run("bench/stepd_cost.py", "--smoke")


def test_log_ship_cost_bench_runs() -> None:
    assert "probe:" in run("bench/log_ship_cost.py", "--smoke")


@pytest.mark.skipif(not PHILLY.is_file(), reason=f"the Philly trace is not at {PHILLY}")
def test_sim_slice_bench_runs() -> None:
    out = run("bench/sim_slice.py", "--smoke", "--trace", str(PHILLY))
    assert "corral" in out and "fair-las:4r" in out and "jain" in out
