"""The NATS identities of a cluster that `corral up` does not run (Kubernetes, systemd, compose).

Why: `corral up` makes every identity itself, and a real deployment needs the same: an
`auth.conf` for the NATS servers, the services' and each GPU node's credentials file, the
Kubernetes Secrets holding them. Written by hand, agents end up sharing one password, and one typo
in a node's permissions makes its agent fail with a bare timeout.

Here one directory holds the deployment's identities (`<dir>/credentials/<user>.json`, 0600 in a
0700 directory, as `corral.stack.credentials` keeps `corral up`'s) and the GPU nodes known so far
(`<dir>/nodes.json`): the services' identity `svc-services` (one for every service, as the
manifests mount it), `admin` for the operator's CLI, `gateway` for the local gateway of a login
node (`corral service gateway`: people there submit as their Unix account), and one per node
`agent-node-agent-<node>` allowed to report only for that node (`corral.bus.auth`). Each run adds
nodes (or revokes them) and keeps every existing password, so its output can be applied again: the
`authorization` block for the NATS servers (`auth_conf`) and the Kubernetes Secrets
(`kubernetes_secrets`):
`corral-nats-auth` (that block, for the NATS chart), `corral-nats-services` and
`corral-nats-agents` (one `<node>.json` per node, what the agent DaemonSet mounts), or the same
split as directories (`export`, what docker-compose mounts: each container sees only its own). People and
pipelines (`corral credentials person`) are kept there as `corral up` keeps them
(`corral.stack.people_admin`): `<dir>/people.json` and one identity each in the `auth_conf`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.bus import auth
from corral.bus.naming import durable_name
from corral.stack import credentials
from corral.stack.people import Kind, PeopleError, Person, Registry, check_name
from corral.stack.people_admin import Installation, now

SERVICES = "services"  # one identity, svc-services, for every service (the manifests mount one file)
ADMIN = "admin"
NODES_FILE = "nodes.json"
AUTH_SECRET, SERVICES_SECRET, AGENTS_SECRET = "corral-nats-auth", "corral-nats-services", "corral-nats-agents"


def agent_user(node: str) -> str:

    return f"agent-{durable_name([node])}"


@dataclass(frozen=True)
class DeployIdentities:
    """A deployment's identities and the nodes they cover."""

    directory: Path
    namespace: str
    keyring: credentials.Keyring
    nodes: tuple[str, ...]

    def credentials_json(self, user: str) -> str:
        return self.keyring.path(user).read_text()

    def agent_file(self, node: str) -> Path:
        return self.keyring.path(agent_user(node))


def check_node(node: str) -> str:
    """`node` if it is a node name (what NodeRegistered carries, a Secret key), else a ValueError."""
    import msgspec

    from corral.contracts.cluster import NodeName

    try:
        return msgspec.convert(node, NodeName)
    except msgspec.ValidationError:
        raise ValueError(f"node {node!r}: not a node name (letters, digits, '.', '_' and '-', at most 63, "
                         "starting with a letter or digit: its Kubernetes node name)") from None


def load(directory: Path, namespace: str, add: Iterable[str] = (), revoke: Iterable[str] = ()) -> DeployIdentities:
    """Create or load the identities in `directory` with `add` nodes added and `revoke` ones removed
    (their credentials deleted: give the new `auth_conf` to the NATS servers)."""

    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    known = _known_nodes(directory)
    gone = set(revoke)
    nodes = sorted((set(known) | set(add)) - gone)
    for node in nodes:
        check_node(node)
    for node in gone & set(known):
        (directory / "credentials" / f"{agent_user(node)}.json").unlink(missing_ok=True)
    keyring = credentials.generate(directory, namespace, services=(SERVICES,),
                                   agents=[([n], durable_name([n])) for n in nodes], admin=ADMIN, gateway=True)
    people = Installation(directory, namespace)
    keyring.identities += [people.person_identity(p) for p in people.load().people]
    (directory / NODES_FILE).write_text(json.dumps(nodes, indent=2) + "\n")
    return DeployIdentities(directory, namespace, keyring, tuple(nodes))


def change_people(directory: Path, namespace: str, *, add: Iterable[str] = (), kind: Kind = Kind.PERSON,
                  remove: Iterable[str] = (), rotate: Iterable[str] = ()) -> Registry:
    """The deployment's people (`<dir>/people.json`, as `corral up`'s registry) with `add` added
    as `kind`, `remove` removed (their credentials deleted) and `rotate` given new secrets; give
    the new `auth_conf` to the NATS servers (the chart's reloader makes them re-read it)."""
    people = Installation(directory, namespace)
    with people.locked():
        registry = people.load()
        for name in add:
            if name == ADMIN:
                raise PeopleError(f"{ADMIN!r} is the operator's identity of a deployment: choose another name")
            person = Person(check_name(name), kind, created=now(), added_by=ADMIN)
            registry = registry.add(person)
            people.person_identity(person, rotate=True)
        for name in rotate:
            registry = registry.rotated(name, now())
            people.person_identity(next(p for p in registry.people if p.name == name), rotate=True)
        for name in remove:
            registry = registry.remove(name)
            people.credentials_file(name).unlink(missing_ok=True)
        people.save(registry)
        return registry


def _known_nodes(directory: Path) -> list[str]:
    try:
        raw = json.loads((directory / NODES_FILE).read_text())
    except OSError:
        return []
    except ValueError:
        raise ValueError(f"{directory / NODES_FILE}: not JSON; it lists the nodes, e.g. [\"gpu-01\"]") from None
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        raise ValueError(f"{directory / NODES_FILE}: expected a list of node names")
    return raw


def auth_conf(ids: DeployIdentities) -> str:
    """The NATS servers' `authorization` block (an `auth.conf` to include), passwords literal."""
    header = (f"# Who may connect to Corral's NATS (namespace {ids.namespace}): generated by `corral credentials "
              f"agent` from {ids.directory}.\n# Nodes: {', '.join(ids.nodes) or '(none)'}. It holds passwords: "
              "keep it as secret as the credentials files.\n")
    return header + ids.keyring.authorization()


def export(ids: DeployIdentities, out: Path) -> list[Path]:
    """Write the files each kind of process mounts, one directory each, as the Secrets split them:
    `nats/auth.conf` (the NATS servers), `services/credentials.json`, `agents/<node>/credentials.json`
    (only that node's agent). Each file is replaced whole (a reader never sees half of one), mode
    0600; a revoked node's directory is emptied. Returns the files written."""
    services = auth.service(ids.namespace, SERVICES, "x").user
    files = {Path("nats", "auth.conf"): auth_conf(ids),
             Path("services", "credentials.json"): ids.credentials_json(services),
             **{Path("agents", n, "credentials.json"): ids.agent_file(n).read_text() for n in ids.nodes}}
    for old in sorted((out / "agents").glob("*/credentials.json")):
        if old.relative_to(out) not in files:
            old.unlink()
    written = []
    for rel, text in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.touch(mode=0o600)
        tmp.chmod(0o600)
        tmp.write_text(text)
        tmp.replace(path)
        written.append(path)
    return written


def _secret(name: str, k8s_namespace: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": k8s_namespace, "labels": {"app.kubernetes.io/part-of": "corral"}},
            "stringData": data}


def kubernetes_secrets(ids: DeployIdentities, k8s_namespace: str = "corral") -> list[dict[str, Any]]:
    """The Secrets deploy/kubernetes and the NATS chart's values (nats-values.yaml) mount."""
    services = auth.service(ids.namespace, SERVICES, "x").user
    return [
        # the NATS servers' users: nats-values.yaml includes it
        _secret(AUTH_SECRET, k8s_namespace, {"auth.conf": auth_conf(ids)}),
        _secret(SERVICES_SECRET, k8s_namespace, {"credentials.json": ids.credentials_json(services)}),
        # one identity per GPU node, <node>.json: the agent DaemonSet mounts it
        _secret(AGENTS_SECRET, k8s_namespace, {f"{n}.json": ids.agent_file(n).read_text() for n in ids.nodes}),
    ]
