"""`corral credentials agent NODE...`: the NATS identities of a deployment, for its GPU nodes.

Why: on Kubernetes (and with systemd) the per-node agent credentials, the NATS servers' `auth.conf`
and the Secrets holding them are otherwise written by hand. This command keeps them in one directory
(`corral.stack.deploy_credentials`: existing passwords kept, nodes added or revoked) and prints what
to apply: the files (a table), the servers' `authorization` block (`--format nats-conf`) or the
Kubernetes Secrets (`--format k8s-secret`, for `kubectl apply -f -`).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated
from urllib.parse import urlsplit

import typer
import yaml

from corral.cli.exit_codes import ExitCode
from corral.cli.output import console, err_console, print_json, print_table
from corral.cli.session import ConnectionOptions

if TYPE_CHECKING:
    from corral.stack.deploy_credentials import DeployIdentities

EXIT_USAGE = ExitCode.USAGE


class Format(StrEnum):
    FILES = "files"
    NATS_CONF = "nats-conf"
    K8S_SECRET = "k8s-secret"


EXPORT_HELP = ("Also write the files each process mounts, one directory each (docker-compose): nats/auth.conf, "
               "services/credentials.json, agents/<node>/credentials.json; then make the NATS servers re-read "
               "auth.conf (SIGHUP).")

app = typer.Typer(no_args_is_help=True, help="NATS identities of a deployment not run by `corral up`.")


@app.command("agent")
def agent(
    nodes: Annotated[list[str] | None, typer.Argument(help="GPU nodes to add (their Kubernetes node names).")] = None,
    directory: Annotated[Path, typer.Option(
        "--dir", help="Where the deployment's identities are kept (0700; keep it safe).")] = Path("corral-credentials"),
    fmt: Annotated[Format, typer.Option(
        "--format", help="files: list the credentials files; nats-conf: the NATS servers' authorization block "
                         "(auth.conf); k8s-secret: the Secrets corral-nats-auth, corral-nats-services, "
                         "corral-nats-agents.")] = Format.FILES,
    revoke: Annotated[list[str] | None, typer.Option(
        "--revoke", help="Remove this node's identity (repeatable); apply the new auth.conf.")] = None,
    k8s_namespace: Annotated[str, typer.Option("--k8s-namespace", help="Namespace of the Secrets.")] = "corral",
    json_out: Annotated[bool, typer.Option("--json", help="With --format files: JSON.")] = False,
    export_dir: Annotated[Path | None, typer.Option("--export", help=EXPORT_HELP)] = None,
) -> None:
    """Give GPU nodes their agent identities, and print the deployment's in the chosen format. Each
    node's agent may report only for its own node; the identities sit beside the services'
    (svc-services) and the operator's (admin). Run it again to add nodes: existing passwords are
    kept."""
    from corral.stack import deploy_credentials as deploy

    try:
        ids = deploy.load(directory, ConnectionOptions.namespace or "corral", add=nodes or (), revoke=revoke or ())
    except ValueError as exc:
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise SystemExit(EXIT_USAGE) from None
    _show(ids, directory, fmt, k8s_namespace, json_out, export_dir)


@app.command("person")
def person(
    names: Annotated[list[str] | None, typer.Argument(help="People (or pipelines, admins) to add.")] = None,
    admin: Annotated[bool, typer.Option("--admin", help="Those added are admins.")] = False,
    pipeline: Annotated[bool, typer.Option("--pipeline", help="Those added are pipelines.")] = False,
    remove: Annotated[list[str] | None, typer.Option("--remove", help="Take this user's identity away.")] = None,
    rotate: Annotated[list[str] | None, typer.Option("--rotate", help="Give this user a new secret.")] = None,
    directory: Annotated[Path, typer.Option(
        "--dir", help="Where the deployment's identities are kept (0700; keep it safe).")] = Path("corral-credentials"),
    fmt: Annotated[Format, typer.Option("--format", help="As for `corral credentials agent`.")] = Format.FILES,
    k8s_namespace: Annotated[str, typer.Option("--k8s-namespace", help="Namespace of the Secrets.")] = "corral",
    json_out: Annotated[bool, typer.Option("--json", help="With --format files: JSON.")] = False,
    export_dir: Annotated[Path | None, typer.Option("--export", help=EXPORT_HELP)] = None,
) -> None:
    """Give people and pipelines of a deployment identities of their own, and print them (`corral
    user` does it for `corral up`). The deployment's identities are printed in the chosen format:
    apply the new auth.conf (the Secret corral-nats-auth) and the NATS servers re-read it, without
    a restart. Each one's credentials file is `<dir>/credentials/<name>.json`; `corral credentials
    postgres` gives each a Postgres login too."""
    from corral.stack import deploy_credentials as deploy
    from corral.stack.people import Kind, PeopleError

    if admin and pipeline:
        err_console.print("[red]error:[/red] --admin and --pipeline: a user is one of person, pipeline or admin")
        raise SystemExit(EXIT_USAGE)
    ns = ConnectionOptions.namespace or "corral"
    try:
        deploy.change_people(directory, ns, add=names or (), remove=remove or (), rotate=rotate or (),
                             kind=Kind.ADMIN if admin else Kind.PIPELINE if pipeline else Kind.PERSON)
        ids = deploy.load(directory, ns)
    except (PeopleError, ValueError) as exc:
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise SystemExit(ExitCode.FAILURE) from None
    _show(ids, directory, fmt, k8s_namespace, json_out, export_dir)


def _show(ids: DeployIdentities, directory: Path, fmt: Format, k8s_namespace: str, json_out: bool,
          export_dir: Path | None) -> None:
    from corral.stack import deploy_credentials as deploy

    if export_dir is not None:
        deploy.export(ids, export_dir)

    if fmt is Format.NATS_CONF:
        typer.echo(deploy.auth_conf(ids), nl=False)
    elif fmt is Format.K8S_SECRET:
        typer.echo(f"# Corral's NATS identities for nodes {', '.join(ids.nodes) or '(none)'} (from {directory}); "
                   "`kubectl apply -f -`\n" + secrets_yaml(deploy.kubernetes_secrets(ids, k8s_namespace)), nl=False)
    else:
        rows = [{"user": i.user, "role": i.role.value, "file": str(ids.keyring.path(i.user))}
                for i in ids.keyring.identities]
        if json_out:
            print_json({"directory": str(directory), "nodes": list(ids.nodes), "identities": rows})
            return
        print_table(f"{len(ids.nodes)} node(s) in {directory}", ["USER", "ROLE", "FILE"],
                    [(r["user"], r["role"], r["file"]) for r in rows])
        console.print("Next: --format nats-conf (the servers' auth.conf) or --format k8s-secret (kubectl apply -f -).",
                      highlight=False)


class PgFormat(StrEnum):
    FILES = "files"
    K8S_SECRET = "k8s-secret"


@app.command("postgres")
def postgres(
    owner_dsn: Annotated[str, typer.Option(
        "--owner-dsn", envvar="CORRAL_POSTGRES_OWNER_DSN",
        help="A DSN that may create roles (superuser or CREATEROLE): used once, never stored.")],
    directory: Annotated[Path, typer.Option(
        "--dir", help="Where the logins' password files are kept (0700; keep it safe).")] = Path("corral-credentials"),
    fmt: Annotated[PgFormat, typer.Option(
        "--format", help="files: the logins and their password files (a DSN with passfile=); k8s-secret: one "
                         "Secret per service and one for the CLI, corral-postgres-<name> (key dsn).")] = PgFormat.FILES,
    host: Annotated[str | None, typer.Option(
        "--host", help="HOST[:PORT] the services reach Postgres at, if not the owner DSN's.")] = None,
    k8s_namespace: Annotated[str, typer.Option("--k8s-namespace", help="Namespace of the Secrets.")] = "corral",
    json_out: Annotated[bool, typer.Option("--json", help="With --format files: JSON.")] = False,
) -> None:
    """Apply the migrations, then give each service and the CLI a Postgres login of its own. Each
    service's is in corral_service, the CLI's is read-only (corral_reader), as `corral up` does: no
    process of the deployment logs in as the owner. Run it again to re-apply: existing passwords
    are kept."""
    from corral.stack import pglogins
    from corral.stack.people_admin import Installation
    from corral.stack.up import SERVICES

    try:
        people = Installation(directory, ConnectionOptions.namespace or "corral").load().names()
        made = pglogins.provision(owner_dsn, directory, SERVICES, people=people)
    except (OSError, ValueError) as exc:
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise SystemExit(ExitCode.FAILURE) from None
    if made is None:
        err_console.print("[red]error:[/red] --owner-dsn's role may neither create roles nor grant them (it needs "
                          "SUPERUSER or CREATEROLE)", highlight=False)
        raise SystemExit(ExitCode.FAILURE)
    dsns = {name: pglogins.moved(dsn, host) if host else dsn for name, dsn in made.dsns.items()}
    if fmt is PgFormat.K8S_SECRET:
        docs: list[dict[str, object]] = [{"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": f"corral-postgres-{name}", "namespace": k8s_namespace,
                         "labels": {"app.kubernetes.io/part-of": "corral"}},
            "stringData": {"dsn": pglogins.with_stored_password(dsn)}} for name, dsn in dsns.items()]
        typer.echo(f"# Corral's Postgres logins (from {directory}); `kubectl apply -f -`\n" + secrets_yaml(docs),
                   nl=False)
        return
    rows = [{"component": name, "login": pglogins.login_of(dsn), "dsn": dsn} for name, dsn in dsns.items()]
    database = urlsplit(made.reader).path.lstrip("/")
    for name in people:  # each person's own login (in corral_person), for their context
        login = pglogins.person_login(database, name)
        dsn = pglogins.with_login(made.reader, login, pglogins.person_pgpass(directory, name))
        dsn = pglogins.moved(dsn, host) if host else dsn
        rows.append({"component": f"person {name}", "login": login, "dsn": dsn})
    if json_out:
        print_json({"directory": str(directory), "logins": rows})
        return
    print_table(f"{len(rows)} Postgres login(s) in {directory}", ["FOR", "LOGIN", "DSN"],
                [(r["component"], r["login"], r["dsn"]) for r in rows])


class _Literal(yaml.SafeDumper):
    """Multi-line values (auth.conf, credentials JSON) as YAML literal blocks: readable, diffable."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Literal.add_representer(str, _string)


def secrets_yaml(docs: list[dict[str, object]]) -> str:
    return yaml.dump_all(docs, Dumper=_Literal, sort_keys=False, width=1_000_000)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="credentials")
