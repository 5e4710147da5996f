"""`corral gpu drain|undrain NODE:INDEX`: take one GPU out of service, or put it back (admins).

Why: a GPU that misbehaves in ways NVML does not report (slow, flaky NVLink, a user's complaint)
must be kept from new work without draining its whole node. The request goes to the admin's inbox
subject; placement records it on the node's stream, places nothing new on the GPU, and lets what
runs there go on. `corral nodes` shows it; the command waits for placement's verdict.
"""

from __future__ import annotations

from typing import Annotated

import typer

from corral.cli.commands import operator as commands
from corral.cli.operator import JsonOpt, Message, VerdictWait
from corral.cli.session import require_admin, with_client
from corral.cli.verdict_report import VERDICT_WAIT, report

Target = Annotated[str, typer.Argument(metavar="NODE:INDEX", help="The GPU: its node and its index there, e.g. "
                                                                 "node-3:5.")]


def parse_target(target: str) -> tuple[str, int]:
    """`NODE:INDEX` as (node, index); a usage error naming the form otherwise."""
    node, sep, index = target.rpartition(":")
    if not sep or not node or not index.isdigit():
        raise typer.BadParameter(f"{target!r}: give NODE:INDEX, e.g. node-3:5 (corral nodes lists them)")
    return node, int(index)


def _drain_gpu(target: str, undrain: bool, message: str, json_out: bool, waited: float) -> None:
    require_admin("corral gpu undrain" if undrain else "corral gpu drain")
    node, gpu = parse_target(target)
    verdict = with_client(lambda c: commands.drain_gpu(c, node, gpu, undrain=undrain, message=message,
                                                       waited=waited))
    state = "in service" if undrain else "drained"
    done = (f"GPU {node}:{gpu} takes new work again" if undrain else
            f"GPU {node}:{gpu} drained: no new work on it; what runs there goes on")
    report(verdict, target, fields={"node": node, "gpu": gpu, "state": state}, waited=waited, json_out=json_out,
           done=done, unchanged=f"GPU {node}:{gpu} is already {state}", unchanged_ok=True)


def register(app: typer.Typer) -> None:
    gpu = typer.Typer(no_args_is_help=True, help="One GPU: take it out of service or put it back (admins).")
    app.add_typer(gpu, name="gpu")

    @gpu.command("drain")
    def drain(target: Target, message: Message = "", json_out: JsonOpt = False,
              waited: VerdictWait = VERDICT_WAIT) -> None:
        """No new work on GPU NODE:INDEX (what runs there goes on to its end)."""
        _drain_gpu(target, False, message, json_out, waited)

    @gpu.command("undrain")
    def undrain(target: Target, message: Message = "", json_out: JsonOpt = False,
                waited: VerdictWait = VERDICT_WAIT) -> None:
        """GPU NODE:INDEX takes new work again."""
        _drain_gpu(target, True, message, json_out, waited)
