"""`corral sim` and `corral sim compare`: replay a workload or trace through Corral's scheduling core.

Why typer like every other command: `corral sim` was an argparse island, so its help, its errors
and its flags looked different from the rest of the CLI. The flags are the same as before.
Why a progress line: a large trace replays for minutes, and a silent terminal looks hung; the
engine reports every few thousand cycles, shown with rich on a terminal (stderr), and nothing when
the output is piped or `--json` is asked for, so scripts see only the results.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer

from corral.cli.output import err_console

if TYPE_CHECKING:
    from corral.client import Client
    from corral.contracts.envelope import Event

PLOT_EXTRA = "plot"

sim_app = typer.Typer(
    name="sim", invoke_without_command=True, add_completion=False, pretty_exceptions_enable=False,
    help="Replay a workload or trace through Corral's scheduling core (no cluster needed).\n\n"
         "`corral sim --trace philly:FILE --cluster 64x8:H100 [--policy corral] [--json F] [--plot DIR]`; "
         "`corral sim compare ...` runs every policy side by side; `--from-log` replays the submissions "
         "recorded in this cluster's event log.")

Trace = Annotated[str | None, typer.Option(
    "--trace", help="philly:FILE, openb:FILE or a Corral JSONL workload (required unless --from-log).")]
ClusterOpt = Annotated[str | None, typer.Option(
    "--cluster", help="Cluster file, or shorthand NODESxGPUS:MODEL, e.g. 64x8:H100 (required unless --from-log).")]
Queues = Annotated[str | None, typer.Option(
    "--queues", help="Queues file (default: equal share for every workload queue).")]
Policy = Annotated[str | None, typer.Option(
    "--policy",
    help="One policy, or several comma-separated to compare (corral, fifo, priority, backfill, las, fair-las); "
         "default: corral, with --from-log the cluster's own (the log's PolicyInForce), for compare every one.")]
Baseline = Annotated[str | None, typer.Option(
    "--baseline", help="compare: the policy the verdict table's JCTs are divided by (default: the first).")]
Seed = Annotated[int, typer.Option("--seed", help="Seed of every random choice (node failures).")]
Limit = Annotated[int | None, typer.Option("--limit", help="Replay only the first N jobs.")]
Mtbf = Annotated[float | None, typer.Option("--failures-mtbf-hours", help="Enable seeded node failures.")]
Repair = Annotated[float, typer.Option("--repair-hours", help="Hours a failed node takes to come back.")]
JsonPath = Annotated[str | None, typer.Option("--json", help="Write summary and the exact schedule here.")]
PlotDir = Annotated[str | None, typer.Option(
    "--plot", help=f"Write PNG plots into this folder (needs matplotlib: pip install 'corral\\[{PLOT_EXTRA}]').")]
FromLog = Annotated[bool, typer.Option(
    "--from-log", help="Replay the submissions in this cluster's event log (what-if on its own history).")]
PipelineOpt = Annotated[str, typer.Option(
    "--pipeline", help="cycle: the single combined cycle (default); services: quota, placement and preemption "
                       "one after the other, as the live services decide.")]


@sim_app.callback()
def sim(ctx: typer.Context, trace: Trace = None, cluster: ClusterOpt = None, queues: Queues = None,
        policy: Policy = None, seed: Seed = 0, limit: Limit = None, failures_mtbf_hours: Mtbf = None,
        repair_hours: Repair = 4.0, json_path: JsonPath = None, plot_dir: PlotDir = None,
        from_log: FromLog = False, pipeline: PipelineOpt = "cycle") -> None:
    """Replay a workload through Corral's scheduling core and print the schedule's scores."""
    if ctx.invoked_subcommand is not None:
        return
    raise SystemExit(run(trace, cluster, queues, policy, seed, limit, failures_mtbf_hours, repair_hours,
                         json_path, plot_dir, from_log, compare_all=False, pipeline=pipeline))


@sim_app.command("compare")
def compare_command(trace: Trace = None, cluster: ClusterOpt = None, queues: Queues = None,
                    policy: Policy = None, seed: Seed = 0, limit: Limit = None,
                    failures_mtbf_hours: Mtbf = None, repair_hours: Repair = 4.0, json_path: JsonPath = None,
                    plot_dir: PlotDir = None, from_log: FromLog = False, pipeline: PipelineOpt = "cycle",
                    baseline: Baseline = None) -> None:
    """The same workload under every policy (or those of --policy), side by side, and the verdict
    table: each against --baseline on JCT, utilisation, fairness, preemption loss, the biggest gangs' wait."""
    raise SystemExit(run(trace, cluster, queues, policy, seed, limit, failures_mtbf_hours, repair_hours,
                         json_path, plot_dir, from_log, compare_all=True, pipeline=pipeline, baseline=baseline))


def run(trace: str | None, cluster: str | None, queues: str | None, policy: str | None, seed: int, limit: int | None,
        failures_mtbf_hours: float | None, repair_hours: float, json_path: str | None, plot_dir: str | None,
        from_log: bool, *, compare_all: bool, show_progress: bool | None = None, pipeline: str = "cycle",
        baseline: str | None = None) -> int:
    """The command's work; returns the exit code (0 ok, 2 bad input named with its fix)."""
    from corral.sim.api import DEFAULT_POLICIES, compare
    from corral.sim.engine import FailureModel
    from corral.sim.output import render_comparison, render_result, write_comparison_json, write_json
    from corral.sim.versus import render_verdict, verdict_rows

    if plot_dir and importlib.util.find_spec("matplotlib") is None:
        return _bad(f"--plot needs matplotlib, which this install lacks: pip install 'corral[{PLOT_EXTRA}]' "
                    "(or pip install matplotlib), or leave out --plot")
    if from_log:
        from corral.cli.session import with_client
        from corral.sim.from_log import export_inputs

        events = with_client(_log_events, bus=False)
        exported = export_inputs(events)
        trace = exported.trace
        cluster = cluster or exported.cluster
        queues = queues or exported.queues
        if policy is None and not compare_all:  # the rules the cluster decided by
            policy = exported.policy
    if not trace or not cluster:
        missing = " and ".join(f for f, v in (("--trace", trace), ("--cluster", cluster)) if not v)
        return _bad(f"{missing} required (or --from-log to replay this cluster's own log); "
                    "e.g. --trace philly:FILE --cluster 64x8:H100")
    if policy is None:
        policies = list(DEFAULT_POLICIES) if compare_all else ["corral"]
    else:
        policies = [p.strip() for p in policy.split(",") if p.strip()]
    if baseline is not None and baseline not in policies:
        return _bad(f"--baseline {baseline!r} is not one of the policies compared ({', '.join(policies)}); "
                    "name one of them, or add it to --policy")
    failures = FailureModel(failures_mtbf_hours, repair_hours) if failures_mtbf_hours else None
    wanted = progress_wanted(json_path, err_console.is_terminal) if show_progress is None else show_progress
    try:
        with _progress(wanted) as report:
            results = compare(trace, cluster, policies, queues=queues, seed=seed, failures=failures, limit=limit,
                              progress=report, pipeline=pipeline)
    except ValueError as error:  # bad input: the message names the field and the fix
        return _bad(str(error))
    verdict = verdict_rows(results, baseline) if compare_all else None
    print(render_result(results[0]) if len(results) == 1 and not compare_all else render_comparison(results))
    if verdict is not None:
        print()
        print(render_verdict(verdict))
    if json_path:
        if len(results) == 1 and not compare_all:
            write_json(results[0], json_path)
        else:
            write_comparison_json(results, json_path, verdict=verdict)
    if plot_dir:
        from corral.sim.plot import write_plots

        for path in write_plots(results, plot_dir):
            print(f"wrote {path}")
    return 0


async def _log_events(client: Client) -> list[Event]:
    """Every decodable event of the cluster's log, in log order (what `--from-log` replays)."""
    return [e for _, e in await client.events()]


def progress_wanted(json_path: str | None, terminal: bool) -> bool:
    """Progress on a terminal only, and not when a script asked for --json."""
    return terminal and json_path is None


ProgressReport = Callable[[str, float, object], None]


@contextmanager
def _progress(wanted: bool) -> Iterator[ProgressReport | None]:
    if not wanted:
        yield None
        return
    from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

    from corral.sim.output import duration

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=err_console.rich, transient=True) as bar:
        tasks: dict[str, TaskID] = {}

        def report(policy: str, now: float, stats: object) -> None:
            if policy not in tasks:
                tasks[policy] = bar.add_task(policy)
            placed = getattr(stats, "decisions", 0)
            bar.update(tasks[policy], description=f"{policy}: simulated {duration(now)}, {placed:,} placements")

        yield report


def _bad(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def sim_main(argv: Sequence[str] | None = None, *, compare_all: bool = False) -> int:
    """`corral sim ARGS` (or `corral sim compare ARGS`) as a function, for tests and scripts."""
    args = (["compare"] if compare_all else []) + list(sys.argv[1:] if argv is None else argv)
    command = typer.main.get_command(sim_app)
    try:  # standalone: usage errors print as on the command line and exit 2
        command.main(args=args, prog_name="corral sim", standalone_mode=True)
    except SystemExit as done:
        return int(done.code or 0)
    return 0
