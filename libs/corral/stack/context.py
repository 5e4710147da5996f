"""Where the cluster is: the context file written by `corral up` and read by every other command.

Why: a person types `corral jobs` in another terminal and expects it to find the cluster that
`corral up` started, as git finds its repository: from the project folder. A context shared by the
whole account (the old `~/.config/corral/context.json`, last cluster started wins, left behind
after it stopped) sent commands from any other folder to whichever cluster was started last — on a
shared account, someone else's. So the context lives only in the project folder, and a context
whose cluster is gone says so instead of sending requests into the void.

Resolution order: explicit flags (`--nats`, `--postgres`, `--namespace`), then the environment
(`CORRAL_NATS_URL`, `CORRAL_POSTGRES_DSN`, `CORRAL_NAMESPACE`; `CORRAL_CREDENTIALS` and
`CORRAL_NATS_CA` for the NATS identity and the CA that verifies the server; `CORRAL_GATEWAY` for a
local gateway's socket, enough on its own), then one context
file: the explicit `--context PATH` / `CORRAL_CONTEXT` (a context.json, or the data folder holding
one), else the nearest `.corral/context.json` in the current folder or its parents. There is no
global fallback.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from urllib.parse import quote

from corral import environment

DEFAULT_NAMESPACE = "corral"
#: Environment variable naming the gateway's socket (the service's, and a client's when its
#: context names none).
GATEWAY_SOCKET_ENV = "CORRAL_GATEWAY"
CONTEXT_FILE = "context.json"
LOCAL_CONTEXT = Path(".corral") / CONTEXT_FILE


class NoClusterError(RuntimeError):
    """No cluster could be found: the message says how to start or point at one."""


class StaleContextError(NoClusterError):
    """A context file names a cluster whose `corral up` is no longer running."""


@dataclass(frozen=True)
class Context:
    nats_url: str
    postgres_dsn: str
    namespace: str = DEFAULT_NAMESPACE
    data_dir: str | None = None
    log_dir: str | None = None
    pid: int | None = None  # the `corral up` process that runs this cluster
    host: str | None = None  # ... on this host
    #: NATS credentials file of this person's identity (written 0600 by `corral up`; see
    #: `corral.stack.credentials`). None: connect without credentials.
    credentials: str | None = None
    #: The CA file the nats-server's certificate must chain to (`<data_dir>/tls/ca.pem`, see
    #: `corral.stack.tls`). None: plain TCP (an external NATS, the test suite's).
    nats_ca: str | None = None
    #: Each process's telemetry endpoint (`/metrics`, `/healthz`, `/readyz`) by process name, e.g.
    #: {"placement": "http://127.0.0.1:40123"} (written by `corral up`; see corral.telemetry).
    metrics: dict[str, str] | None = None
    #: A person's context (`corral user add --out`) carries their secrets itself, so that one file
    #: (mode 0600) is all they need: their NATS identity (`credentials` then names this file), the
    #: CA's PEM text (then `nats_ca`) and their Postgres login's password (put in the DSN in
    #: memory only, by `resolve`).
    nats_identity: dict[str, str] | None = None
    nats_ca_pem: str | None = None
    postgres_password: str | None = None
    #: The local gateway's unix socket (`corral.services.gateway`): a person who cannot read
    #: `credentials` sends requests there, recorded as their OS account. No secret.
    gateway: str | None = None

    def save(self, *paths: Path) -> None:
        for path in paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
            tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Context:
        """The context in `path`; a NoClusterError naming the file when it cannot be read or is not one."""
        try:
            text = path.read_text()
        except OSError as exc:
            raise NoClusterError(f"{path} cannot be read ({exc.strerror}): point --context (CORRAL_CONTEXT) at "
                                 "a context file of your own, e.g. the one `corral user add --out` wrote") from None
        try:
            raw = json.loads(text)
            return cls(**{k: raw[k] for k in raw if k in cls.__dataclass_fields__})
        except (ValueError, TypeError, AttributeError) as exc:
            raise NoClusterError(f"{path} is not a Corral context ({exc}): use the file `corral up` or "
                                 "`corral user add --out` wrote, or pass --nats and --postgres") from None

    def gone(self) -> bool:
        """True when the process that runs this cluster is known to have exited (same host only)."""
        if self.pid is None or self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def owned_by_this_process(ctx: Context) -> Context:
    """`ctx` marked as run by the current process (its `corral up`), so it can be found gone later."""
    return replace(ctx, pid=os.getpid(), host=socket.gethostname())


def context_file(path: Path) -> Path:
    """`--context` takes a context.json or the data folder that holds one (`.corral-demo`)."""
    return path / CONTEXT_FILE if path.is_dir() else path


def project_context(start: Path | None = None) -> Path | None:
    """The nearest `.corral/context.json` in `start` (default: the current folder) or a parent."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / LOCAL_CONTEXT
        if candidate.is_file():
            return candidate
    return None


def locate(explicit: Path | str | None = None) -> Path | None:
    """The context file to use: `explicit`, else `CORRAL_CONTEXT`, else the project's; None if none."""
    given = explicit or environment.get("CORRAL_CONTEXT") or None
    return context_file(Path(given)) if given else project_context()


def resolve(nats_url: str | None = None, postgres_dsn: str | None = None,
            namespace: str | None = None, context_path: Path | str | None = None, *,
            need_postgres: bool = True) -> Context:
    """Find the cluster from flags, environment or the context file; raise NoClusterError if none.

    `need_postgres` False: the NATS address is enough (`corral logs` reads only the bus); the
    context's DSN is then empty when none is known.

    A context file is read only when flags or environment leave the NATS URL or the DSN unknown;
    then a missing explicit file, or a file whose `corral up` has exited, is a NoClusterError that
    says which file and what to do.
    """
    nats = nats_url or environment.get("CORRAL_NATS_URL")
    dsn = postgres_dsn or environment.get("CORRAL_POSTGRES_DSN")
    path = locate(context_path)
    saved: Context | None = None
    if path is not None and path.is_file():
        saved = Context.load(path)
    gateway = environment.get("CORRAL_GATEWAY")
    if gateway and saved is None and not (nats and dsn):
        # A login node's person: the local gateway is all their CLI reaches (corral.gateway.client).
        return Context(nats_url=nats or "", postgres_dsn=dsn or "", namespace=namespace or DEFAULT_NAMESPACE,
                       gateway=gateway)
    if not nats or (need_postgres and not dsn):
        if path is None:
            raise NoClusterError(
                f"no Corral cluster found: no {LOCAL_CONTEXT} in {Path.cwd()} or its parents. Start one here "
                "with `corral up`, or point at one with --context PATH (CORRAL_CONTEXT), or --nats URL and "
                "--postgres DSN (CORRAL_NATS_URL, CORRAL_POSTGRES_DSN)")
        if saved is None:
            raise NoClusterError(f"no Corral cluster found: the context file {path} does not exist; start a "
                                 "cluster with `corral up` (it writes <data-dir>/context.json)")
        if saved.gone():
            restart = "corral up" + (f" --data-dir {saved.data_dir}" if saved.data_dir else "")
            raise StaleContextError(
                f"the cluster of {path} is gone: its `corral up` (pid {saved.pid}) is no longer running. "
                f"Start it again with `{restart}` (its events are kept), or delete {path}")
    nats = nats or (saved.nats_url if saved else None)
    dsn = dsn or (saved.postgres_dsn if saved else None)
    dsn = dsn or ""
    assert nats and (dsn or not need_postgres)
    ns = namespace or environment.get("CORRAL_NAMESPACE") or (saved.namespace if saved else DEFAULT_NAMESPACE)
    same = saved is not None and saved.nats_url == nats and saved.postgres_dsn == dsn
    embedded = saved if same and saved is not None and saved.nats_identity else None
    if same and saved is not None and saved.postgres_password:
        dsn = with_password(dsn, saved.postgres_password)
    return Context(nats_url=nats, postgres_dsn=dsn, namespace=ns,
                   data_dir=saved.data_dir if same and saved else None,
                   log_dir=environment.get("CORRAL_LOG_DIR") or (saved.log_dir if same and saved else None),
                   pid=saved.pid if same and saved else None, host=saved.host if same and saved else None,
                   credentials=environment.get("CORRAL_CREDENTIALS") or (
                       str(path) if embedded else saved.credentials if same and saved else None),
                   nats_ca=environment.get("CORRAL_NATS_CA") or (
                       embedded.nats_ca_pem if embedded else saved.nats_ca if same and saved else None),
                   metrics=saved.metrics if same and saved else None,
                   gateway=saved.gateway if same and saved else None)


def with_password(dsn: str, password: str) -> str:
    """`dsn` with `password` for its user (in memory only: never saved, never printed)."""
    scheme, sep, rest = dsn.partition("://")
    user, at, where = rest.partition("@")
    if not sep or not at or ":" in user:
        return dsn
    return f"{scheme}://{user}:{quote(password, safe='')}@{where}"


def redacted(dsn: str) -> str:
    """`dsn` without its password, to show."""
    scheme, sep, rest = dsn.partition("://")
    user, at, where = rest.rpartition("@")
    if not sep or not at or ":" not in user:
        return dsn
    return f"{scheme}://{user.partition(':')[0]}:***@{where}"
