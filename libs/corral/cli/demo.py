"""`corral demo` (what `make demo` runs): start the embedded cluster, run the examples, show them.

Why: the first thing a newcomer runs should show the four behaviours Corral exists for — gang,
preemption with checkpoint, topology, fair share — progressing to the end on their own machine.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.table import Table

from corral.cli.output import console, make_table
from corral.client import Client
from corral.contracts.jobspec import load_job_spec
from corral.contracts.queues import load_queues_file
from corral.projection import ClusterView, JobState

# The repository's examples/ (editable install), else ./examples (run from a checkout).
EXAMPLES = next((p for p in (Path(__file__).resolve().parents[3] / "examples", Path.cwd() / "examples")
                 if (p / "queues.yaml").exists()), Path.cwd() / "examples")

# (example file, seconds after start to submit it, what it shows)
SCRIPT: list[tuple[str, float, str]] = [
    ("low-priority-train.yaml", 0, "a long, preemptible, low-priority job"),
    ("team-b-share.yaml", 0, "team B uses its guarantee"),
    ("gang-32.yaml", 2, "32-GPU gang: waits, holding nothing, for 32 GPUs"),
    ("nvlink-8.yaml", 4, "8 ranks inside one NVLink domain"),
    ("urgent.yaml", 8, "urgent: preempts the low-priority job"),
]


def _table(view: ClusterView, ids: dict[str, str]) -> Table:
    rows = []
    for job_id, example in ids.items():
        j = view.jobs.get(job_id)
        if j is None:
            rows.append([job_id, example, "SUBMITTED", "", "", ""])
            continue
        quiet = j.reason is None or j.state in (JobState.RUNNING, JobState.COMPLETED)
        reason = "" if quiet or j.reason is None else f"{j.reason.code}: {j.reason.message}"
        rows.append([job_id, example, j.state.value, str(j.gpus), ",".join(j.nodes) if j.holding else "",
                     reason[:90]])
    table = make_table(None, ["JOB", "EXAMPLE", "STATE", "GPUS", "NODES", "REASON"], rows)
    for row in rows:
        table.add_row(*row)
    return table


async def _run(client: Client, timeout: float) -> dict[str, str]:
    await client.apply_queues(load_queues_file(EXAMPLES / "queues.yaml"))
    await client.wait_for(lambda v: {"team-a", "team-b"} <= set(v.queues), 30)
    ids: dict[str, str] = {}
    started = time.monotonic()
    pending = list(SCRIPT)
    with Live(console=console.rich, refresh_per_second=4) as live:
        while True:
            while pending and time.monotonic() - started >= pending[0][1]:
                name, _, _ = pending.pop(0)
                spec = load_job_spec((EXAMPLES / name).read_text())
                ids[await client.submit(spec, user="demo")] = name.removesuffix(".yaml")
            view = await client.view()
            live.update(_table(view, ids))
            done = [view.jobs[j].state.terminal for j in ids if j in view.jobs]
            if not pending and len(done) == len(ids) and all(done):
                return ids
            if time.monotonic() - started > timeout:
                console.print("[yellow]demo timed out; the table shows where each job is[/yellow]")
                return ids
            await asyncio.sleep(0.5)


def corral_command() -> str:
    """How this `corral` was invoked, for hints a person can paste (`.venv/bin/corral` from make)."""
    import sys

    exe = Path(sys.argv[0])
    if exe.name != "corral":
        return "corral"
    try:
        return str(exe.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return "corral" if exe.parent == Path() else str(exe)


def closing_lines(data_dir: Path, job_id: str) -> list[str]:
    """The demo's last words: its cluster stopped, but its log is kept and can be asked `why`."""
    corral = corral_command()
    return [
        "",
        f"Every decision is in the event log, kept in {data_dir}/.",
        "To ask it about these jobs, start the demo's cluster again:",
        f"  {corral} up --data-dir {data_dir}",
        "and in another terminal:",
        f"  {corral} --context {data_dir} why {job_id}",
    ]


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        data_dir: Annotated[Path, typer.Option("--data-dir")] = Path(".corral-demo"),
        timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 300.0,
    ) -> None:
        """Start a 4x8 H100 cluster (simulated), run the examples to the end, then stop."""
        import shutil

        from corral.cluster_ready import wait_for_nodes
        from corral.stack.up import Stack, StackOptions

        shutil.rmtree(data_dir, ignore_errors=True)
        stack = Stack(StackOptions(data_dir=data_dir, cluster="4x8:H100", runtime="sim", write_user_context=False))
        try:
            console.print("Starting Corral (NATS, Postgres, 5 services, 4 simulated nodes)…")
            ctx = stack.start()
            nodes = wait_for_nodes(ctx, stack, timeout=60)
            console.print(f"{len(nodes)} nodes registered. Submitting the examples:")
            for name, at, what in SCRIPT:
                console.print(f"  t+{at:>2.0f}s  {name.removesuffix('.yaml'):<19} {what}", highlight=False)

            async def go() -> None:
                client = await Client.connect(ctx)
                try:
                    ids = await _run(client, timeout)
                    view = await client.view()
                    console.print("")
                    for j in ids:
                        job = view.jobs[j]
                        if job.preempted_by:
                            console.print(f"{ids[j]} was preempted, for:", highlight=False)
                            for p in sorted(job.preempted_by):
                                console.print(f"  {ids.get(p, p)} ({p})", highlight=False)
                            console.print("It checkpointed, and resumed from its checkpoint:", highlight=False)
                            console.print(f"  {job.checkpoint}", highlight=False, soft_wrap=True)
                    for line in closing_lines(data_dir, next(iter(ids), "JOB")):
                        console.print(line, highlight=False, soft_wrap=True)
                finally:
                    await client.close()

            asyncio.run(go())
        finally:
            console.print("Stopping…")
            stack.stop()
