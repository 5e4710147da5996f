"""Where the cluster is: the context file written by `corral up` and read by every other command.

Why: a person types `corral jobs` in another terminal and expects it to find the cluster that
`corral up` started, as kubectl finds its kubeconfig. Resolution order: explicit flags, then the
environment (`CORRAL_NATS_URL`, `CORRAL_POSTGRES_DSN`, `CORRAL_NAMESPACE`), then `./.corral/context.json`,
then `~/.config/corral/context.json` (the last cluster started by this user).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

DEFAULT_NAMESPACE = "corral"
LOCAL_CONTEXT = Path(".corral") / "context.json"


def user_context_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "corral" / "context.json"


class NoClusterError(RuntimeError):
    """No cluster could be found: the message says how to start or point at one."""


@dataclass(frozen=True)
class Context:
    nats_url: str
    postgres_dsn: str
    namespace: str = DEFAULT_NAMESPACE
    data_dir: str | None = None
    log_dir: str | None = None
    #: NATS credentials file of this person's identity (written 0600 by `corral up`; see
    #: `corral.stack.credentials`). None: connect without credentials.
    credentials: str | None = None

    def save(self, *paths: Path) -> None:
        for path in paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
            tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Context:
        raw = json.loads(path.read_text())
        return cls(**{k: raw[k] for k in raw if k in cls.__dataclass_fields__})


def resolve(nats_url: str | None = None, postgres_dsn: str | None = None,
            namespace: str | None = None) -> Context:
    """Find the cluster from flags, environment or context files; raise NoClusterError if none."""
    saved: Context | None = None
    for path in (Path(os.environ["CORRAL_CONTEXT"]) if os.environ.get("CORRAL_CONTEXT") else None,
                 LOCAL_CONTEXT, user_context_path()):
        if path is not None and path.exists():
            saved = Context.load(path)
            break
    nats = nats_url or os.environ.get("CORRAL_NATS_URL") or (saved.nats_url if saved else None)
    dsn = postgres_dsn or os.environ.get("CORRAL_POSTGRES_DSN") or (saved.postgres_dsn if saved else None)
    ns = namespace or os.environ.get("CORRAL_NAMESPACE") or (saved.namespace if saved else DEFAULT_NAMESPACE)
    if not nats or not dsn:
        raise NoClusterError(
            "no Corral cluster found: start one with `corral up`, or pass --nats URL and --postgres DSN "
            "(or set CORRAL_NATS_URL and CORRAL_POSTGRES_DSN)"
        )
    same = saved is not None and saved.nats_url == nats and saved.postgres_dsn == dsn
    return Context(nats_url=nats, postgres_dsn=dsn, namespace=ns,
                   data_dir=saved.data_dir if same and saved else None,
                   log_dir=os.environ.get("CORRAL_LOG_DIR") or (saved.log_dir if same and saved else None),
                   credentials=os.environ.get("CORRAL_CREDENTIALS") or (saved.credentials if same and saved else None))
