"""corral.sim: the trace simulator. It replays a workload through the same pure scheduling core
(`corral.core.schedule`) the live services call, on a virtual clock, and scores the schedule.

Entry points (wrapped by the CLI as `corral sim` and `corral sim compare`; `corral.cli.sim.sim_main`
is the command as a function: the simulator sits below the CLI and does not import it):
    run_simulation(workload, cluster, *, policy="corral", queues=None, seed=0, failures=None,
                   limit=None) -> SimResult
    compare(workload, cluster, policies=DEFAULT_POLICIES, *, queues=None, seed=0, ...) -> list[SimResult]
    render_result(result) / render_comparison(results) -> str
    write_json(result, path) / write_comparison_json(results, path)
    write_plots(results, directory) -> list[Path]      # corral.sim.plot
    check_schedule(jobs_json, cluster) -> list[Violation]   # corral.sim.checker
    load_workload("philly:FILE" | "openb:FILE" | "FILE.jsonl") -> Workload
"""

from corral.sim.api import DEFAULT_POLICIES, SimResult, compare, run_simulation
from corral.sim.checker import Violation, check_schedule
from corral.sim.engine import FailureModel, SimulationError, Simulator
from corral.sim.importers import load_workload
from corral.sim.output import (
    render_comparison,
    render_result,
    result_document,
    write_comparison_json,
    write_json,
)
from corral.sim.workload import SimJob, TopologySpec, Workload, WorkloadError, sim_job

__all__ = [
    "DEFAULT_POLICIES",
    "FailureModel",
    "SimJob",
    "SimResult",
    "SimulationError",
    "Simulator",
    "TopologySpec",
    "Violation",
    "Workload",
    "WorkloadError",
    "check_schedule",
    "compare",
    "load_workload",
    "render_comparison",
    "render_result",
    "result_document",
    "run_simulation",
    "sim_job",
    "write_comparison_json",
    "write_json",
]
