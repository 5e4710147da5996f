"""The permission sets of `corral.bus.auth` and the sender-naming subjects."""

from __future__ import annotations

import pytest

from corral.bus import auth
from corral.contracts.subjects import Subjects


def test_only_services_may_publish_events() -> None:
    svc = auth.service("corral", "placement", "pw")
    agent = auth.agent("corral", ["node-0"], "node-agent-node-0", "pw")
    bob = auth.submitter("corral", "bob", "pw")
    admin = auth.submitter("corral", "root", "pw", admin=True)
    assert "corral.events.>" in svc.publish
    for ident in (agent, bob, admin):
        assert not any(p.startswith("corral.events") or p in (">", "corral.>") for p in ident.publish), ident


def test_an_agent_publishes_only_its_own_nodes_reports_and_acks_only_its_durable() -> None:
    agent = auth.agent("corral", ["node-0", "gpu.1"], "d1", "pw")
    assert "corral.inbox.node.node-0.>" in agent.publish and "corral.inbox.node.gpu~1.>" in agent.publish
    assert "corral.heartbeat.node-0" in agent.publish
    assert not any(p.startswith("corral.inbox.user") or p == "corral.inbox.QueueConfigured" for p in agent.publish)
    assert [p for p in agent.publish if p.startswith("$JS.ACK")] == ["$JS.ACK.CORRAL_EVENTS.d1.>"]
    assert not any("STREAM.CREATE" in p or "STREAM.UPDATE" in p for p in agent.publish)
    assert [p for p in agent.publish if "DELETE" in p] == ["$JS.API.CONSUMER.DELETE.CORRAL_EVENTS.d1-history"]
    assert agent.subscribe == ("_INBOX.agent-d1.>",)


def test_an_agent_names_exactly_its_two_consumers_in_every_jetstream_call() -> None:
    """No wildcard and no nameless (legacy) create: either would let it pull from or redefine
    another durable of the events stream."""
    agent = auth.agent("corral", ["node-0"], "d1", "pw")
    consumer_calls = [p for p in agent.publish if p.startswith("$JS.API.CONSUMER.")]
    assert consumer_calls and "$JS.API.CONSUMER.CREATE.CORRAL_EVENTS" not in consumer_calls
    for p in consumer_calls:
        tokens = p.split(".")
        name = tokens[6] if tokens[3] in ("DURABLE", "MSG") else tokens[5]
        assert name in ("d1", "d1-history"), p
        assert "*" not in p and not (p.endswith(".>") and "CREATE" not in p), p


def test_a_submitter_publishes_only_under_its_own_name() -> None:
    bob = auth.submitter("corral", "bob", "pw")
    requests = [p for p in bob.publish if p.startswith("corral.")]
    assert requests == ["corral.inbox.user.bob.JobSubmitted", "corral.inbox.user.bob.JobCancelRequested",
                        "corral.inbox.user.bob.JobHeld", "corral.inbox.user.bob.JobHoldReleased",
                        "corral.inbox.user.bob.JobRequeueRequested"]
    # queue trees and node drains are an admin's: no submitter subject takes them
    assert not any(t in p for p in bob.publish for t in ("Queue", "NodeDrained", "NodeUndrained"))


def test_an_admin_publishes_only_its_own_user_and_admin_subjects() -> None:
    admin = auth.submitter("corral", "root", "pw", admin=True)
    inbox = [p for p in admin.publish if p.startswith("corral.")]
    assert all(p.startswith(("corral.inbox.user.root.", "corral.inbox.admin.root.")) or
               p == "corral.admin.root.dlq-replay" for p in inbox), inbox
    assert _allows(admin.publish, "corral.inbox.admin.root.QueueTreeApplied")
    assert _allows(admin.publish, "corral.inbox.admin.root.JobCancelRequested")
    assert _allows(admin.publish, "corral.inbox.user.root.JobSubmitted")
    for forbidden in ("corral.inbox.user.bob.JobSubmitted", "corral.inbox.JobSubmitted",
                      "corral.inbox.node.node-0.WorkerExited", "corral.inbox.admin.alice.NodeDrained",
                      "corral.inbox.admin.root.JobSubmitted", "corral.events.JobSubmitted",
                      "corral.logs.j1.0.node-0.0", "corral.admin.alice.dlq-replay",
                      # JetStream calls that change streams or the messages in them
                      "$JS.API.STREAM.UPDATE.CORRAL_INBOX", "$JS.API.STREAM.CREATE.EVIL",
                      "$JS.API.STREAM.PURGE.CORRAL_EVENTS", "$JS.API.STREAM.MSG.DELETE.CORRAL_DLQ",
                      "$JS.API.CONSUMER.CREATE.CORRAL_INBOX.x.corral.inbox.>",
                      "$JS.API.CONSUMER.CREATE.CORRAL_LOGS"):
        assert not _allows(admin.publish, forbidden), forbidden


def test_no_generated_identity_publishes_a_bare_inbox_subject() -> None:
    """Only a superuser (the test suite's session NATS) may publish `<ns>.inbox.<Type>`."""
    from corral.contracts.subjects import INBOX_TYPES

    identities = [auth.service("corral", "admission", "pw"), auth.agent("corral", ["node-0"], "d1", "pw"),
                  auth.submitter("corral", "bob", "pw"), auth.submitter("corral", "root", "pw", admin=True)]
    for ident in identities:
        for kind in INBOX_TYPES:
            assert not _allows(ident.publish, f"corral.inbox.{kind}"), (ident.user, kind)


def test_the_config_block_lists_every_identity_once() -> None:
    text = auth.nats_authorization([auth.superuser("t", "p w\"q"), auth.submitter("corral", "bob", "x")])
    assert text.startswith("authorization {") and '"p w\\"q"' in text and text.count("user:") == 2
    with pytest.raises(ValueError, match="twice"):
        auth.nats_authorization([auth.superuser("t", "a"), auth.superuser("t", "b")])
    with pytest.raises(ValueError):
        auth.submitter("corral", "bad.name", "x")


def test_subjects_name_their_sender() -> None:
    s = Subjects("corral")
    assert s.node_report("gpu.1", "WorkerExited") == "corral.inbox.node.gpu~1.WorkerExited"
    assert s.sender_of("corral.inbox.node.gpu~1.WorkerExited", "node") == "gpu.1"
    assert s.sender_of("corral.inbox.user.bob.JobSubmitted", "user") == "bob"
    assert s.sender_of("corral.inbox.JobSubmitted", "user") is None
    assert s.sender_of("corral.inbox.user.bob.x.JobSubmitted", "user") is None
    with pytest.raises(ValueError):
        s.user_request("bob", "QueueConfigured")


def _allows(patterns: tuple[str, ...], subject: str) -> bool:
    """NATS subject matching: `*` one token, `>` the rest."""
    tokens = subject.split(".")
    for pattern in patterns:
        wanted = pattern.split(".")
        if wanted[-1] == ">" and len(tokens) >= len(wanted) and all(
                w in ("*", t) for w, t in zip(wanted[:-1], tokens, strict=False)):
            return True
        if len(wanted) == len(tokens) and all(w in ("*", t) for w, t in zip(wanted, tokens, strict=True)):
            return True
    return False


def test_a_one_node_agent_may_consume_only_its_own_nodes_work() -> None:
    agent = auth.agent("corral", ["gpu.1"], "node-agent-gpu_1", "pw")
    create = "$JS.API.CONSUMER.CREATE.CORRAL_EVENTS.node-agent-gpu_1"
    assert _allows(agent.publish, f"{create}.corral.events.node.gpu~1.>")
    assert _allows(agent.publish, f"{create}-history.corral.events.node.gpu~1.>")
    for other in (f"{create}.corral.events.>", f"{create}.corral.events.JobSubmitted",
                  f"{create}.corral.events.node.gpu~2.>", f"{create}.corral.events.node.*.>", create,
                  "$JS.API.CONSUMER.DURABLE.CREATE.CORRAL_EVENTS.node-agent-gpu_1"):
        assert not _allows(agent.publish, other), other


def test_an_agent_publishes_log_lines_only_as_its_own_nodes() -> None:
    from corral.contracts.logs import log_subject

    agent = auth.agent("corral", ["node-0", "gpu.1"], "d1", "pw")
    assert _allows(agent.publish, log_subject("corral", "j1", 0, "node-0", 3))
    assert _allows(agent.publish, log_subject("corral", "j.2", 4, "gpu.1", 0))
    assert not _allows(agent.publish, log_subject("corral", "j1", 0, "node-1", 3))
    assert not _allows(agent.publish, "corral.logs.j1.0.node-0.3.extra")
    assert "$JS.API.STREAM.INFO.CORRAL_LOGS" in agent.publish  # it waits for the stream, never creates it
    bob = auth.submitter("corral", "bob", "pw")
    assert not _allows(bob.publish, log_subject("corral", "j1", 0, "node-0", 3))


def test_a_person_reads_only_the_log_subjects_naming_them() -> None:
    from corral.contracts.logs import log_filter, log_subject

    agent = auth.agent("corral", ["node-0"], "d1", "pw")
    assert _allows(agent.publish, log_subject("corral", "j1", 0, "node-0", 3, owner="alice"))
    assert not _allows(agent.publish, log_subject("corral", "j1", 0, "node-1", 3, owner="alice"))
    bob = auth.submitter("corral", "bob", "pw")
    create = "$JS.API.CONSUMER.CREATE.CORRAL_LOGS.logs-1a2b."
    assert _allows(bob.publish, create + log_filter("corral", "j1", owner="bob"))
    assert not _allows(bob.publish, create + log_filter("corral", "j1", owner="alice"))
    assert not _allows(bob.publish, create + log_filter("corral", "j1", any_owner=True))
    assert not _allows(bob.publish, create + log_filter("corral", "j1"))  # version 1: admins only
    assert not _allows(bob.publish, "$JS.API.CONSUMER.CREATE.CORRAL_LOGS.logs-1a2b")  # no filter token
    assert not _allows(bob.publish, "$JS.API.CONSUMER.CREATE.CORRAL_LOGS")  # nameless (legacy) create
    assert not _allows(bob.publish, "$JS.API.CONSUMER.LIST.CORRAL_LOGS")
