"""Offline commands: validate a spec, export the contracts' schemas. No cluster needed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from corral.cli.jobs import read_spec
from corral.cli.output import console, print_json


def register(app: typer.Typer) -> None:
    @app.command()
    def validate(
        file: Annotated[str, typer.Argument(help="Job spec (YAML or JSON), or - for stdin.")],
        json_out: Annotated[bool, typer.Option("--json", help="Print the normalised spec as JSON.")] = False,
    ) -> None:
        """Check a job spec without submitting it; each problem names its field and a fix."""
        spec = read_spec(file)
        if json_out:
            import msgspec

            print_json(msgspec.to_builtins(spec))
        else:
            console.print(f"{file}: valid — {spec.replicas}x{spec.gpus_per_replica} GPUs in queue {spec.queue}, "
                          f"priority {spec.priority}", highlight=False)

    @app.command()
    def schemas(
        out: Annotated[Path, typer.Argument(help="Directory to write JSON Schemas and asyncapi.json into.")],
        json_out: Annotated[bool, typer.Option("--json", help="Print the written paths as JSON.")] = False,
    ) -> None:
        """Export a JSON Schema per event and spec (and an AsyncAPI document) for other languages."""
        from corral.contracts.schema import export_schemas

        paths = [str(p) for p in export_schemas(out)]
        if json_out:
            print_json(paths)
        else:
            console.print(f"Wrote {len(paths)} schema files to {out}", highlight=False)


def register_sim(app: typer.Typer) -> None:
    """`corral sim` and `corral sim compare` (corral.cli.sim)."""
    from corral.cli.sim import sim_app

    app.add_typer(sim_app, name="sim")
