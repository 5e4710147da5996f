"""A command loads what it uses: `corral jobs` neither NATS nor the scheduling cycle.

Why: every `corral` call is a fresh Python process, and its imports were most of its cost
(bench/cli.py): `corral jobs` loaded nats-py, the whole core (cycle, backfill, the preemption
search) and every command's module before reading one row. Now `corral.cli.main` registers only
the module of the command named on the command line (`REGISTRARS`), and the packages that
re-export (corral.bus, corral.core) import each name on first use.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer

from corral.cli import main


def test_every_command_is_found_by_its_registrar() -> None:
    """REGISTRARS names exactly the commands each module registers (a new command is not lost)."""
    import importlib

    for module, function, names in main.REGISTRARS:
        app = typer.Typer()
        getattr(importlib.import_module(f"corral.cli.{module}"), function)(app)
        found = {c.name or (c.callback.__name__.replace("_", "-") if c.callback else "")
                 for c in app.registered_commands}
        found |= {g.name or "" for g in app.registered_groups}
        assert found == set(names), (module, function)


@pytest.mark.parametrize(("args", "name"), [
    (["jobs"], "jobs"), (["--context", "x", "show", "j1"], "show"), (["--nats=n", "submit", "-"], "submit"),
    (["--help"], None), ([], None), (["--namespace", "jobs", "cancel", "j"], "cancel"),
])
def test_the_command_name_skips_the_options_and_their_values(args: list[str], name: str | None) -> None:
    assert main.command_name(args) == name


def _runs_clean(code: str) -> None:
    """`code` run in a fresh interpreter (nothing imported yet) passes its own assertions."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_full_app_has_every_command() -> None:
    from typer.main import get_command

    group = get_command(main.app)
    expected = {n for _, _, names in main.REGISTRARS for n in names} | {"up", "server"}
    assert expected <= set(group.commands)  # type: ignore[attr-defined]


def test_a_read_only_command_loads_neither_nats_nor_the_cycle_nor_yaml() -> None:
    code = (
        "import sys\n"
        "from corral.cli.main import register_for\n"
        "register_for(['jobs'])\n"
        "import corral.client, corral.cli.jobs, corral.readmodel.snapshots\n"
        "loaded = [m for m in ('nats', 'corral.core.cycle', 'corral.core.backfill', 'corral.cli.agent', "
        "'corral.stack.up', 'yaml') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    _runs_clean(code)


def test_a_request_command_loads_neither_nats_nor_the_job_decoder() -> None:
    """`corral submit` publishes without nats-py (`corral.bus.request`) and decodes no stored job."""
    code = (
        "import sys\n"
        "from corral.cli.main import register_for\n"
        "register_for(['submit'])\n"
        "import corral.client, corral.cli.jobs, corral.bus.request\n"
        "from corral.readmodel import codec\n"
        "assert 'nats' not in sys.modules\n"
        "assert not codec._DECODERS, codec._DECODERS\n"
    )
    _runs_clean(code)


def test_the_hot_commands_load_neither_typer_nor_the_gateway_client_nor_the_core_model() -> None:
    """`corral.cli.fast` runs them without typer; decoding a stored job needs no core type
    (`JobView`'s caches are Any at run time); only a person without a credential of their own
    uses the gateway's client; they read and publish without an event loop, asyncpg or nats-py
    (`Client.blocking`)."""
    code = (
        "import sys\n"
        "import corral.cli.fast, corral.cli.job_commands, corral.eventstore.wire, corral.bus.request\n"
        "from corral.projection import JobView\n"
        "from corral.readmodel import codec\n"
        "codec._decoder(JobView); codec._decoder(codec.BaseView)\n"
        "loaded = [m for m in ('typer', 'click', 'corral.gateway.client', 'corral.gateway.protocol', "
        "'corral.core.model', 'nats', 'asyncio', 'asyncpg') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    _runs_clean(code)


def test_submit_and_cancel_load_neither_the_fold_nor_the_presentation() -> None:
    """`corral submit` and `corral cancel` send a request and read its verdict: no job is shown."""
    code = (
        "import sys\n"
        "import corral.cli.fast, corral.cli.job_commands, corral.eventstore.wire, corral.bus.request\n"
        "loaded = [m for m in ('corral.projection', 'corral.lifecycle', 'corral.readmodel.snapshots', "
        "'corral.cli.present', 'rich') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    _runs_clean(code)


def test_the_hot_commands_load_no_logging() -> None:
    """`logging` (with `traceback`, `string`) is a few ms of every call: the hot commands' modules
    do not load it; a service's pool, the bus over nats-py and tracing's set-up do."""
    code = (
        "import sys\n"
        "import corral.cli.fast, corral.cli.session, corral.cli.job_commands, corral.eventstore.wire, "
        "corral.bus.request\n"
        "loaded = [m for m in ('logging', 'traceback') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    _runs_clean(code)
