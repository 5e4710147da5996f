"""`corral.cli.fast`: the hot commands run without typer only when their arguments are plain,
with typer's defaults for everything else (the e2e `test_cli` compares both paths' output)."""

from __future__ import annotations

import typer
from typer.main import get_command

from corral.cli import fast
from corral.cli.main import app
from corral.cli.verdict_report import VERDICT_WAIT


def test_plain_hot_calls_are_taken() -> None:
    assert fast.parse(["jobs"]) == fast.Call("jobs")
    assert fast.parse(["jobs", "-a", "--json"]) == fast.Call("jobs", flags={"-a", "--json"})
    assert fast.parse(["--json", "show"]) is None  # a command's flag before it is typer's to refuse
    assert fast.parse(["show", "--json", "j1"]) == fast.Call("show", arguments=["j1"], flags={"--json"})
    assert fast.parse(["submit", "-"]) == fast.Call("submit", arguments=["-"])
    assert fast.parse(["--context", "/d", "--nats=nats://h:4222", "cancel", "j1"]) == fast.Call(
        "cancel", {"--context": "/d", "--nats": "nats://h:4222"}, ["j1"])
    assert fast.parse(["nodes"]) == fast.Call("nodes")
    assert fast.parse(["nodes", "--rack", "r1", "--state=lost", "--json"]) == fast.Call(
        "nodes", flags={"--json"}, options={"--rack": "r1", "--state": "lost"})
    assert fast.parse(["top", "--once"]) == fast.Call("top", flags={"--once"})
    assert fast.parse(["top", "--json"]) == fast.Call("top", flags={"--json"})


def test_anything_else_is_left_to_typer() -> None:
    for args in ([], ["--help"], ["jobs", "--help"], ["show"], ["show", "a", "b"], ["jobs", "extra"],
                 ["jobs", "--limit", "5"], ["jobs", "--stuck"], ["submit", "f", "--wait"], ["cancel", "j", "-h"],
                 ["cancel", "j", "--verdict-timeout", "3"], ["why", "j"], ["nodes", "x"], ["show", "--", "j"],
                 ["top"], ["top", "--once", "--interval", "1"], ["nodes", "--rack"], ["nodes", "--rack", "--json"],
                 ["nodes", "--rack", "a", "--rack", "b"], ["nodes", "--rack="], ["jobs", "--rack", "r"],
                 ["--nats"], ["--nats", "--json", "jobs"], ["--nats=", "jobs"], ["--nats", "a", "--nats", "b", "jobs"],
                 ["--bogus", "x", "jobs"], ["jobs", "--nats", "x"], ["show", "j", "--json=1"], ["jobs", "-aj"]):
        assert fast.parse(args) is None, args


def test_the_flags_taken_are_the_typer_commands_and_the_rest_keep_typer_defaults() -> None:
    """What the fast path passes for the options it does not take is each typer option's default."""
    group = get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    fixed = {"submit": {"wait": False, "until_done": False, "timeout": 600.0, "no_wait_admission": False},
             "jobs": {"queue": None, "state": None, "user": None, "stuck": False, "limit": None},
             "show": {}, "cancel": {"waited": VERDICT_WAIT}, "nodes": {}, "top": {"interval": 2.0}}
    for name, flags in fast.FLAGS.items():
        command = group.commands[name]
        options = {o: p for p in command.params for o in p.opts}
        flags = (*flags, *fast.VALUED.get(name, ()))
        assert set(flags) <= set(options), name
        arguments = [p for p in command.params if p.param_type_name == "argument"]
        assert len(arguments) == fast.ARGUMENTS[name]
        taken = {options[f].name for f in flags}
        rest = {p.name: p.default for p in command.params if p.param_type_name == "option" and p.name not in taken}
        assert rest == fixed[name], name
    callback = {o for p in group.params for o in p.opts}
    assert set(fast.CONNECTION) <= callback
    assert {p.envvar for p in group.params if p.envvar} == set(fast.CONNECTION.values())
