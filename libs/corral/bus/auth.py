"""Who may publish and subscribe to what on the bus: NATS identities with subject permissions.

Why: with an open NATS, anyone who reaches port 4222 could publish `corral.events.GangReserved` and
a node agent would run the command of a forged JobSubmitted as root (and forged WorkerExited,
PreemptRequested, GangReleased... were obeyed the same way). Here each party gets an identity whose
permissions the nats-server enforces before a message reaches any stream:

- a **service** (admission, quota, placement, preemption): publishes `<ns>.events.>` (every service
  process may run the outbox relay, see `corral.services.relay`; a service already appends to the
  log, which is the truth, so relaying it gives it no new power), `<ns>.dlq.>`, the inbox subjects
  naming a sender (a service replays a dead letter on its original subject when an admin asks:
  `dlq-replay`; again no new
  power, since the service could append the request's effect itself) and the JetStream API, and
  it answers requests (`allow_responses`). Nobody else may publish an event: node agents obey only
  what the relay published.
- a **node agent** process hosting nodes N: reads only its nodes' work (`<ns>.events.node.<n>.>`,
  through its own consumers, see `agent`); publishes only `<ns>.inbox.node.<n>.<Report>`,
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


  (`USER_REQUEST_TYPES`: submit, cancel, hold, release, requeue; admission records `<user>`,
  whatever the spec says), reads stream info, and reads its own jobs' output: the log subjects
  naming it as the owner (`_js_own_logs`), never another's.
- an **admin** `<admin>`: a submitter (its own user subjects) that may also publish its own admin
  subjects `<ns>.inbox.admin.<admin>.<Request>` (`ADMIN_REQUEST_TYPES`: queues, drain, acting on
  anyone's job; the services take a request there as the admin's and record `admin/<admin>` as
  its actor), ask a service to replay dead letters (`<ns>.admin.<admin>.dlq-replay`), read every
  subject and make the JetStream calls that read (`_js_admin`). It may not publish another user's,
  a node's or a bare `<ns>.inbox.<Type>` subject, nor an event.

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
from corral.contracts.logs import OWNED, owner_filter
from corral.contracts.subjects import ADMIN_REQUEST_TYPES, SENDER_KINDS, USER_REQUEST_TYPES, Subjects

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
    #: May publish a reply to a request it received (on the requester's own inbox subject).
    allow_responses: bool = False

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
        publish=(ns.wildcard(EVENTS), ns.wildcard(DLQ), *(f"{ns.name}.{INBOX}.{kind}.>" for kind in SENDER_KINDS),
                 "$JS.API.>", "$JS.ACK.>", "$JS.FC.>"),
        subscribe=(f"{ns.name}.>", f"{inbox_prefix(user)}.>"),
        allow_responses=True,
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
        # its ranks' output: `<ns>.logs.user.<owner>.<job>.<attempt>.<node>.<rank>` of its own nodes
        # only (and the version-1 subject without the owner, which only admins read)
        *(f"{ns.name}.{LOGS}.{OWNED}.*.*.*.{_token(n)}.*" for n in nodes),
        *(f"{ns.name}.{LOGS}.*.*.{_token(n)}.*" for n in nodes),
        f"{ns.name}.{DLQ}.{events}.*",  # dead letters of events-stream messages (one per message)
        *_js_read(ns),
        f"$JS.ACK.{events}.{durable}.>",
    ]
    # Its durable, and its one-shot history consumer (`history_consumer`), by exact name only: the
    # name is a token of each API subject, and the server refuses a create whose body names another
    # consumer than the subject does. No wildcard and no nameless or legacy (DURABLE.CREATE) create:
    # a legacy create whose body names an existing durable redefines it (tested:
    # tests/e2e/test_security.py). One node: the create call's subject also carries the consumer's
    # one filter, which the server checks against the body, and only that node's work subjects
    # (`Subjects.node_work_wildcard`) are allowed there: the agent reads no other node's work, no
    # other job's spec. Several nodes in one process (simulated nodes) need several filters, which
    # the call's subject cannot carry: such an identity may name any filter of its two consumers.
    history = history_consumer(durable)
    subjects = Subjects(ns.name)
    for consumer in (durable, history):
        if len(nodes) == 1:
            publish.append(f"$JS.API.CONSUMER.CREATE.{events}.{consumer}.{subjects.node_work_wildcard(nodes[0])}")
        else:
            publish.append(f"$JS.API.CONSUMER.CREATE.{events}.{consumer}")
        publish += [
            f"$JS.API.CONSUMER.INFO.{events}.{consumer}",
            f"$JS.API.CONSUMER.MSG.NEXT.{events}.{consumer}",
        ]
    publish.append(f"$JS.API.CONSUMER.DELETE.{events}.{history}")
    return Identity(user, password, Role.AGENT, publish=tuple(publish),
                    subscribe=(f"{inbox_prefix(user)}.>",))


def submitter(namespace: str, user: str, password: str, *, admin: bool = False) -> Identity:
    ns = Namespace(namespace)
    _check_user(user)
    subjects = Subjects(ns.name)
    own = [subjects.user_request(user, request) for request in USER_REQUEST_TYPES]
    if not admin:
        return Identity(user, password, Role.SUBMITTER, publish=(*own, *_js_read(ns), *_js_own_logs(ns, user)),
                        subscribe=(f"{inbox_prefix(user)}.>",))
    return Identity(
        user, password, Role.ADMIN,
        # Its own subjects only: as a person (`inbox.user.<admin>`) and as the admin
        # (`inbox.admin.<admin>`, which admission, quota and placement take as an admin's), never
        # another user's, a node's or a bare `<ns>.inbox.<Type>`. A dead letter of someone else's
        # is republished by a service on the admin's request (`dlq-replay`), not by the admin.
        publish=(*own, *(subjects.admin_request(user, request) for request in ADMIN_REQUEST_TYPES),
                 subjects.dead_letter_replay(user), *_js_admin(ns)),
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


def _js_own_logs(ns: Namespace, user: str) -> list[str]:
    """Reading the output of one's own jobs: a consumer of the log stream whose filter (a token of
    the create call's subject, which the server checks against the request's body) is one of the
    subjects naming `user` as the job's owner; pulling from it and deleting it by its name (an
    unguessable one, `corral.log_stream`; no identity but an admin may list consumers)."""
    logs = ns.stream(LOGS)
    return [f"$JS.API.CONSUMER.CREATE.{logs}.*.{owner_filter(ns.name, user)}",
            f"$JS.API.CONSUMER.MSG.NEXT.{logs}.*", f"$JS.API.CONSUMER.DELETE.{logs}.*"]


def _js_admin(ns: Namespace) -> list[str]:
    """JetStream calls of an admin: read streams, consumers and stored messages, and read the log
    stream through consumers of its own. No stream create, update, purge or delete (a stream's
    subject transform or republish setting would put a message on a subject the admin may not
    publish to), no consumer of the events or inbox stream, no message delete."""
    streams = [ns.stream(k) for k in (EVENTS, INBOX, DLQ, LOGS)]
    logs = ns.stream(LOGS)
    return [
        *_js_read(ns), "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST",
        *(f"$JS.API.CONSUMER.{call}.{s}" for s in streams for call in ("LIST", "NAMES")),
        *(f"$JS.API.CONSUMER.INFO.{s}.*" for s in streams),
        *(f"$JS.API.STREAM.MSG.GET.{s}" for s in streams),
        *(f"$JS.API.DIRECT.GET.{s}{tail}" for s in streams for tail in ("", ".>")),
        # reading ranks' output: named consumers (never the nameless create) of the log stream
        f"$JS.API.CONSUMER.CREATE.{logs}.>", f"$JS.API.CONSUMER.MSG.NEXT.{logs}.*",
        f"$JS.API.CONSUMER.DELETE.{logs}.*",
    ]


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
            f"subscribe: {{allow: {json.dumps(list(ident.subscribe))}}}"
            + (", allow_responses: true" if ident.allow_responses else "") + "}}")
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"
