"""Who may publish and subscribe to what on the bus: NATS identities with subject permissions.

Why: with an open NATS, anyone who reaches port 4222 could publish `corral.events.GangReserved` and
a node agent would run the command of a forged JobSubmitted as root (and forged WorkerExited,
PreemptRequested, GangReleased... were obeyed the same way). Here each party gets an identity whose
permissions the nats-server enforces before a message reaches any stream:

- a **service** (admission, quota, placement, preemption): publishes `<ns>.events.>` (every service
  process may run the outbox relay, see `corral.services.relay`; a service already appends to the
  log, which is the truth, so relaying it gives it no new power) and `<ns>.dlq.>`, and the JetStream
  API. Nobody else may publish an event: node agents obey only what the relay published.
- a **node agent** process hosting nodes N: publishes only `<ns>.inbox.node.<n>.<Report>`,
  `<ns>.heartbeat.<n>` and its ranks' output `<ns>.logs.<job>.<attempt>.<n>.<rank>` for n in N
  (so no node can forge another's log lines), its own DLQ subject, and the JetStream calls of exactly two
  consumers named after its durable: the durable (create, info, pull, ack) and its one-shot history
  consumer (`corral.bus.naming.history_consumer`: create, info, pull, delete). It cannot create
  streams, create, pull from, redefine or delete any other consumer, or ack others' messages.
  Placement still checks that a report's node is the one its subject names and that this node
  holds the gang (`corral.services.placement`).
- a **submitter** `<user>`: publishes only `<ns>.inbox.user.<user>.<Request>` for its requests
  (`USER_REQUEST_TYPES`: submit, cancel, hold, release; admission records `<user>`, whatever the
  spec says) and reads stream info.
- the **gateway** (`corral.services.gateway`): publishes exactly the user request subjects
  `<ns>.inbox.user.*.<Request>` and nothing else: it proves a local person's uid (SO_PEERCRED)
  and speaks for that account, so it may name any user but may do nothing a user could not.
- an **admin**: a submitter that may also apply queues (`<ns>.inbox.QueueConfigured`), manage
  streams and consumers (the whole JetStream API) and read every subject; admission lets an admin
  cancel any job.

Every identity receives replies only on its own inbox prefix (`_INBOX.<user>.>`), so it cannot read
another client's replies or pull-consumer deliveries. Pure and I/O-free: `corral.stack.credentials`
stores the passwords and `corral.stack.servers.NatsServer` writes `nats_authorization()` to its
config.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from corral.bus.naming import DLQ, EVENTS, INBOX, LOGS, Namespace, history_consumer
from corral.contracts.subjects import USER_REQUEST_TYPES

_USER = re.compile(r"^[A-Za-z0-9_-]+$")


class Role(StrEnum):
    SERVICE = "service"
    AGENT = "agent"
    SUBMITTER = "submitter"
    ADMIN = "admin"
    #: The local gateway: publishes people's requests under the account it proved.
    GATEWAY = "gateway"
    #: Everything: the test suite's session NATS and single-user tools only.
    SUPERUSER = "superuser"


@dataclass(frozen=True)
class Identity:
    """One NATS user: its name, secret, role and the subjects it may publish and subscribe to."""

    user: str
    password: str
    role: Role
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]

    @property
    def inbox_prefix(self) -> str:
        return inbox_prefix(self.user)

    def credentials_json(self) -> str:
        """What a process needs to connect as this identity (stored 0600 by `corral.stack.credentials`)."""
        return json.dumps({"user": self.user, "password": self.password, "role": self.role.value,
                           "inbox_prefix": self.inbox_prefix}, indent=2) + "\n"


def inbox_prefix(user: str) -> str:
    return f"_INBOX.{user}"


def _check_user(user: str) -> str:
    if not _USER.match(user):
        raise ValueError(f"NATS identity {user!r}: use letters, digits, '_' or '-' (it is a subject token)")
    return user


def _token(name: str) -> str:
    return name.replace(".", "~")  # same encoding as corral.contracts.subjects for node names


def _js_read(ns: Namespace) -> list[str]:
    """JetStream calls that only read: account info and stream info of this namespace's streams."""
    return ["$JS.API.INFO", *(f"$JS.API.STREAM.INFO.{ns.stream(k)}" for k in (EVENTS, INBOX, DLQ, LOGS))]


def service(namespace: str, name: str, password: str) -> Identity:
    ns = Namespace(namespace)
    user = _check_user(f"svc-{name}")
    return Identity(
        user, password, Role.SERVICE,
        publish=(ns.wildcard(EVENTS), ns.wildcard(DLQ), "$JS.API.>", "$JS.ACK.>", "$JS.FC.>"),
        subscribe=(f"{ns.name}.>", f"{inbox_prefix(user)}.>"),
    )


def agent(namespace: str, nodes: Sequence[str], durable: str, password: str, *, name: str | None = None) -> Identity:
    """A node-agent process hosting `nodes`, consuming events with durable `durable`."""
    if not nodes:
        raise ValueError("a node-agent identity hosts at least one node")
    ns = Namespace(namespace)
    user = _check_user(name or f"agent-{durable}")
    events = ns.stream(EVENTS)
    publish = [
        *(f"{ns.name}.{INBOX}.node.{_token(n)}.>" for n in nodes),
        *(f"{ns.name}.heartbeat.{_token(n)}" for n in nodes),
        # its ranks' output: `<ns>.logs.<job>.<attempt>.<node>.<rank>` of its own nodes only
        *(f"{ns.name}.{LOGS}.*.*.{_token(n)}.*" for n in nodes),
        f"{ns.name}.{DLQ}.{events}.*",  # dead letters of events-stream messages (one per message)
        *_js_read(ns),
        f"$JS.ACK.{events}.{durable}.>",
    ]
    # Its durable, and its one-shot history consumer (`history_consumer`), by exact name only: the
    # name is a token of each API subject, and the server refuses a create whose body names another
    # consumer than the subject does. No wildcard and no nameless (legacy) create: a legacy create
    # whose body names an existing durable redefines it (tested: tests/e2e/test_security.py).
    history = history_consumer(durable)
    for consumer in (durable, history):
        publish += [
            f"$JS.API.CONSUMER.CREATE.{events}.{consumer}",
            f"$JS.API.CONSUMER.CREATE.{events}.{consumer}.>",
            f"$JS.API.CONSUMER.INFO.{events}.{consumer}",
            f"$JS.API.CONSUMER.MSG.NEXT.{events}.{consumer}",
        ]
    publish += [f"$JS.API.CONSUMER.DURABLE.CREATE.{events}.{durable}",
                f"$JS.API.CONSUMER.DELETE.{events}.{history}"]
    return Identity(user, password, Role.AGENT, publish=tuple(publish),
                    subscribe=(f"{inbox_prefix(user)}.>",))


def submitter(namespace: str, user: str, password: str, *, admin: bool = False) -> Identity:
    ns = Namespace(namespace)
    _check_user(user)
    own = [f"{ns.name}.{INBOX}.user.{user}.{request}" for request in USER_REQUEST_TYPES]
    if not admin:
        return Identity(user, password, Role.SUBMITTER, publish=(*own, *_js_read(ns)),
                        subscribe=(f"{inbox_prefix(user)}.>",))
    return Identity(
        user, password, Role.ADMIN,
        # The whole inbox: `corral dlq replay` republishes a dead-lettered request to the subject it
        # came on (a user's or a node's). The admin is the operator, who holds every credential of
        # the installation anyway (`<data_dir>/credentials/`).
        publish=(*own, f"{ns.name}.{INBOX}.>", "$JS.API.>", "$JS.ACK.>"),
        subscribe=(f"{ns.name}.>", f"{inbox_prefix(user)}.>", "$JS.EVENT.>"),
    )


#: The gateway's NATS user name (one per installation).
GATEWAY_USER = "gateway"


def gateway(namespace: str, password: str, *, name: str = GATEWAY_USER) -> Identity:
    """The local gateway: it may publish a request under any user's subject, and nothing else
    (no event, no node report, no queue change, no JetStream API call, no subscription but its
    own inbox for the acks)."""
    ns = Namespace(namespace)
    user = _check_user(name)
    return Identity(user, password, Role.GATEWAY,
                    publish=tuple(f"{ns.name}.{INBOX}.user.*.{request}" for request in USER_REQUEST_TYPES),
                    subscribe=(f"{inbox_prefix(user)}.>",))


def superuser(user: str, password: str) -> Identity:
    return Identity(_check_user(user), password, Role.SUPERUSER, publish=(">",), subscribe=(">",))


def nats_authorization(identities: Iterable[Identity]) -> str:
    """The `authorization { users = [...] }` block of a nats-server config for `identities`.

    A client without a valid user and password cannot connect at all."""
    lines = ["authorization {", "  users = ["]
    seen: set[str] = set()
    for ident in identities:
        if ident.user in seen:
            raise ValueError(f"NATS identity {ident.user!r} declared twice")
        seen.add(ident.user)
        lines.append(
            f"    {{user: {json.dumps(ident.user)}, password: {json.dumps(ident.password)}, permissions: {{"
            f"publish: {{allow: {json.dumps(list(ident.publish))}}}, "
            f"subscribe: {{allow: {json.dumps(list(ident.subscribe))}}}}}}}")
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"
