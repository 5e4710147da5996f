"""`corral user add|list|remove|rotate` and `corral whoami`: who may use the cluster, and as whom.

`corral user` is the operator's: it changes the data folder of `corral up` (the registry, the
credentials, the bus's authorization; `corral.stack.people_admin`), so it runs with that folder as
its context and needs to read its `credentials/`. The bus is never restarted: it re-reads its
authorization. `corral whoami` is anyone's: the name this CLI's requests are recorded under, and
where that identity comes from.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from corral import environment
from corral.cli.exit_codes import ExitCode
from corral.cli.output import console, err_console, print_json, print_table
from corral.cli.session import ConnectionOptions, context
from corral.gateway.local import GatewayError
from corral.stack.context import Context, locate

app = typer.Typer(no_args_is_help=True, help="People and pipelines who may use this cluster (the operator's).")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _fail(message: str, code: ExitCode = ExitCode.FAILURE) -> None:
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    raise SystemExit(code)


def _installation() -> tuple[Any, Context]:
    """The installation whose people this CLI may manage: the data folder of its context, if this
    account can read its credentials (the operator of `corral up`)."""
    from corral.stack.people import PeopleError
    from corral.stack.people_admin import Installation

    ctx = context()
    if not ctx.data_dir:
        _fail("managing people needs the data folder of `corral up` (its context, e.g. `corral --context "
              ".corral user ...` where it ran); this context is a person's, not the operator's")
    inst = Installation(Path(str(ctx.data_dir)), ctx.namespace)
    try:
        os.listdir(inst.keys)
        inst.load()
    except PermissionError:
        _fail(f"only the operator of this cluster may manage people: {inst.keys} (the data folder's credentials) "
              "is not readable by this account")
    except FileNotFoundError:
        _fail(f"{inst.data_dir} has no credentials folder: start the cluster with `corral up` there first")
    except PeopleError as exc:
        _fail(str(exc))
    return inst, ctx


def _operator(ctx: Context) -> str:
    from corral.stack.credentials import NatsCredentials, admin_name

    if ctx.credentials:
        try:
            return NatsCredentials.load(ctx.credentials).user
        except (OSError, ValueError, KeyError):
            pass
    return admin_name()


def _check_out(out: Path | None) -> None:
    """`--out` names a file: a folder is refused before anything changes."""
    if out is not None and out.is_dir():
        _fail(f"--out {out} is a folder: name the file, e.g. --out {out / 'context.json'}", ExitCode.USAGE)


def _write_context(out: Path, change: Any, ctx: Context) -> None:
    import json

    from corral.stack.credentials import write_private
    from corral.stack.people_admin import person_context

    doc = person_context(nats_url=ctx.nats_url, namespace=ctx.namespace, ident=change.identity,
                         kind=change.person.kind, ca_file=ctx.nats_ca, postgres_dsn=ctx.postgres_dsn,
                         login=change.login)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_private(out, json.dumps(doc, indent=2) + "\n")
    except OSError as exc:
        name = change.person.name
        _fail(f"{name}'s identity is made, but their context could not be written to {out} ({exc.strerror}): "
              f"`corral user rotate {name} --out FILE` writes one (with new secrets)")


def _report(change: Any, inst: Any, out: Path | None, verb: str, json_out: bool) -> None:
    p = change.person
    row = {**p.as_dict(), "credentials": str(inst.credentials_file(p.name)), "context": str(out) if out else None,
           "postgres_login": change.login.login if change.login else None, "bus_reloaded": change.reloaded}
    if json_out:
        print_json(row)
        return
    console.print(f"{verb} {p.kind.value} [bold]{p.name}[/bold].", highlight=False)
    if not change.reloaded:
        console.print("The cluster's NATS is not running: it takes the change when `corral up` starts it.",
                      highlight=False)
    if out:
        console.print(f"Their context: {out} (mode 0600; it holds their secrets). Give it to {p.name}, who runs "
                      f"`corral --context {out.name} ...` (or CORRAL_CONTEXT={out.name}).", highlight=False)


@app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="Their name: a Unix-style account name (lower case).")],
    admin: Annotated[bool, typer.Option("--admin", help="An admin: may apply queues and act on every job.")] = False,
    pipeline: Annotated[bool, typer.Option("--pipeline", help="A pipeline (a service account), not a person.")] = False,
    out: Annotated[Path | None, typer.Option(
        "--out", help="Write their context file here (their NATS credential, the CA, the cluster's addresses "
                      "and their own Postgres read login), mode 0600.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Give a person (or a pipeline, or an admin) an identity of their own.

    The bus is not restarted; their requests are recorded under their name from now on."""
    from corral.stack import people_admin
    from corral.stack.people import Kind

    if admin and pipeline:
        _fail("--admin and --pipeline: a user is one of person, pipeline or admin", ExitCode.USAGE)
    kind = Kind.ADMIN if admin else Kind.PIPELINE if pipeline else Kind.PERSON
    _change(lambda inst, by: people_admin.add(inst, name, kind, by=by), out, "Added", json_out)


def _change(apply: Any, out: Path | None, verb: str, json_out: bool) -> None:
    """One change of the registry (`apply(installation, by)`), its context file and its report;
    a refusal is one line and exit 1, with nothing changed."""
    from corral.stack.people import PeopleError

    _check_out(out)
    inst, ctx = _installation()
    try:
        change = apply(inst, _operator(ctx))
    except (PeopleError, RuntimeError, OSError) as exc:
        _fail(str(exc))
        return
    if out is not None:
        _write_context(out, change, ctx)
    _report(change, inst, out, verb, json_out)


@app.command("list")
def list_(json_out: JsonOpt = False) -> None:
    """Everyone who may use this cluster: name, kind (person, pipeline, admin), when added."""
    inst, _ = _installation()
    people = [p.as_dict() for p in inst.load().people]
    if json_out:
        print_json(people)
        return
    print_table(f"{len(people)} user(s)", ["NAME", "KIND", "CREATED", "ADDED BY", "ROTATED"],
                [(p["name"], p["kind"], p["created"], p["added_by"], p["rotated"] or "-") for p in people])


@app.command("remove")
def remove(
    name: Annotated[str, typer.Argument(help="Who may no longer use the cluster.")],
    json_out: JsonOpt = False,
) -> None:
    """Take a user's access away at once.

    Their NATS connections are closed and their credential refused, their Postgres login dropped.
    Their jobs stay as they are (cancel them if need be)."""
    from corral.stack import people_admin

    _change(lambda inst, by: people_admin.remove(inst, name, by=by), None, "Removed", json_out)


@app.command("rotate")
def rotate(
    name: Annotated[str, typer.Argument(help="Whose secrets to replace.")],
    out: Annotated[Path | None, typer.Option("--out", help="Write their new context file here (mode 0600).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """New secrets for a user (NATS and Postgres).

    The old ones are refused from now on, and connections made with them are closed."""
    from corral.stack import people_admin

    _change(lambda inst, by: people_admin.rotate(inst, name, by=by), out, "Rotated the secrets of", json_out)


def identity_of(ctx: Context, context_file: Path | None) -> dict[str, Any]:
    """Who a CLI with `ctx` acts as, and from what."""
    import getpass
    import json

    from corral.gateway.client import who
    from corral.gateway.local import gateway_socket

    socket_path = gateway_socket(ctx)
    if socket_path is not None:
        return {"user": who(socket_path), "kind": "unix account", "role": None, "source": f"gateway {socket_path}",
                "context": str(context_file) if context_file else None}
    if not ctx.credentials:
        user = environment.get("USER") or getpass.getuser()
        return {"user": user, "kind": None, "role": None, "source": "$USER (no identity: an open bus)",
                "context": str(context_file) if context_file else None}
    raw = json.loads(Path(ctx.credentials).read_text())
    raw = (raw.get("nats_identity") or raw) if isinstance(raw, dict) else raw
    if not isinstance(raw, dict) or not isinstance(raw.get("user"), str):
        raise ValueError('not a credentials file (a JSON object with "user" and "password")')
    env = environment.get("CORRAL_CREDENTIALS")
    source = f"CORRAL_CREDENTIALS={env}" if env else ctx.credentials
    role = raw.get("role")
    return {"user": raw["user"], "kind": raw.get("kind") or ("admin" if role == "admin" else "person"),
            "role": role, "source": source, "context": str(context_file) if context_file else None}


def whoami(json_out: JsonOpt = False) -> None:
    """The name this CLI's requests are recorded under, its kind, and where that comes from.

    It comes from a credentials file, a person's context file, or the environment."""
    ctx = context(need_postgres=False)
    try:
        me = identity_of(ctx, locate(ConnectionOptions.context))
    except (OSError, ValueError, KeyError) as exc:
        _fail(f"cannot read the identity {ctx.credentials}: {exc}")
        return
    except GatewayError as exc:
        _fail(str(exc), ExitCode.NO_CLUSTER if exc.code == "UNREACHABLE" else ExitCode.FAILURE)
        return
    if json_out:
        print_json(me)
        return
    if me["kind"] == "unix account":
        console.print(f"[bold]{me['user']}[/bold] (unix account, via {me['source']})", highlight=False)
        return
    console.print(f"[bold]{me['user']}[/bold]" + (f" ({me['kind']})" if me["kind"] else ""), highlight=False)
    console.print(f"  from {me['source']}" + (f", context {me['context']}" if me["context"] else ""),
                  highlight=False)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="user")
    root.command("whoami")(whoami)
