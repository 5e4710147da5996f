"""`corral sim` is a typer command like the rest: same flags, help, errors; progress only on a terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import app
from corral.cli.sim import progress_wanted, run


def _workload(tmp_path: Path) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"name": f"j{i}", "queue": "q", "submit_at": i, "duration_seconds": 50,
                                        "replicas": 1, "gpus_per_replica": 2}) + "\n" for i in range(6)))
    return path


def test_sim_help_and_flags_through_the_corral_cli(tmp_path: Path) -> None:
    runner = CliRunner()
    helped = runner.invoke(app, ["sim", "--help"])
    assert helped.exit_code == 0 and "--trace" in helped.output and "compare" in helped.output
    ran = runner.invoke(app, ["sim", "--trace", str(_workload(tmp_path)), "--cluster", "1x8:H100", "--limit", "4"])
    assert ran.exit_code == 0, ran.output
    assert "avg JCT" in ran.output
    both = runner.invoke(app, ["sim", "compare", "--trace", str(_workload(tmp_path)), "--cluster", "1x8:H100",
                               "--policy", "fifo,las"])
    assert both.exit_code == 0 and "fifo" in both.output and "las" in both.output
    assert runner.invoke(app, ["sim"]).exit_code == 2
    assert runner.invoke(app, ["sim", "--seed", "many"]).exit_code == 2
    services = runner.invoke(app, ["sim", "--trace", str(_workload(tmp_path)), "--cluster", "1x8:H100",
                                   "--pipeline", "services"])
    assert services.exit_code == 0 and "pipeline services" in services.output, services.output
    wrong = runner.invoke(app, ["sim", "--trace", str(_workload(tmp_path)), "--cluster", "1x8:H100",
                                "--pipeline", "kueue"])
    assert wrong.exit_code == 2 and "choose one of cycle, services" in wrong.output


def test_progress_only_on_a_terminal_and_never_with_json() -> None:
    assert progress_wanted(None, terminal=True)
    assert not progress_wanted(None, terminal=False)
    assert not progress_wanted("out.json", terminal=True)


def test_plot_without_matplotlib_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    code = run(str(_workload(tmp_path)), "1x8:H100", None, "corral", 0, None, None, 4.0, None, str(tmp_path / "p"),
               False, compare_all=False)
    assert code == 2
    assert "pip install 'corral[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_progress_reports_each_policy(tmp_path: Path) -> None:
    """The engine's callback reaches the progress display (every cycle here, to see it)."""
    from corral.cli import sim as sim_cli
    from corral.sim import engine

    seen: list[str] = []
    original = engine.Simulator.__init__

    def every_cycle(self: engine.Simulator, *args: object, **kwargs: object) -> None:
        kwargs["progress_every"] = 1
        original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine.Simulator, "__init__", every_cycle)
        with sim_cli._progress(True) as report:
            assert report is not None

            def spy(policy: str, now: float, stats: object) -> None:
                seen.append(policy)
                report(policy, now, stats)

            from corral.sim.api import compare

            compare(str(_workload(tmp_path)), "1x8:H100", ["fifo", "las"], progress=spy)
    assert {"fifo", "las"} <= set(seen)


def test_compare_prints_the_verdict_table_against_the_baseline_and_its_json(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "cmp.json"
    ran = runner.invoke(app, ["sim", "compare", "--trace", str(_workload(tmp_path)), "--cluster", "1x4:H100",
                              "--policy", "fifo,fair-las", "--baseline", "fifo", "--json", str(out)])
    assert ran.exit_code == 0, ran.output
    assert "normalised to fifo" in ran.output and "Jain (queues)" in ran.output and "2-GPU class wait" in ran.output
    assert "fragmentation" in ran.output and "quota ceilings" in ran.output and "utilisation bound" in ran.output
    verdict = json.loads(out.read_text())["verdict"]
    assert [v["policy"] for v in verdict] == ["fifo", "fair-las"] and verdict[0]["avg_jct_vs_baseline"] == 1.0
    assert 0 < verdict[1]["utilisation_bound"] <= 1
    assert set(verdict[1]["idle_share"]) == {"nothing_waiting", "held", "quota_ceilings", "fragmentation",
                                             "gangs_larger_than_idle"}
    wrong = runner.invoke(app, ["sim", "compare", "--trace", str(_workload(tmp_path)), "--cluster", "1x4:H100",
                                "--policy", "fifo", "--baseline", "las"])
    assert wrong.exit_code == 2 and "--baseline 'las' is not one of the policies compared" in wrong.output
    single = runner.invoke(app, ["sim", "--trace", str(_workload(tmp_path)), "--cluster", "1x4:H100"])
    assert "idle GPU time (share of capacity)" in single.output and "utilisation bound" in single.output
