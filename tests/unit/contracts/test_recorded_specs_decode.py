"""A spec the log recorded always decodes, folds and audits; the same spec submitted now is refused.

The log is the truth and any process rebuilds from it, so a JobSubmitted recorded before a start
rule existed (`JobSpec.start_problems`: env names the agent sets, a checkpoint signal a job cannot
catch, NUL characters, mount paths a container runtime splits, an empty program) must still decode.
The rules are asked of new submissions: `corral validate`/`submit` (`validate_job_spec`),
admission's verdict on an inbox message, the agent's Assignment.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from corral.audit import Entry, audit
from corral.client import Client
from corral.contracts import events as ev
from corral.contracts.envelope import job_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.problems import SpecError
from corral.contracts.registry import decode, encode, validated
from corral.projection import ClusterView, JobState
from corral.services.admission.invalid import start_problems
from corral.services.node_agent.process.assignment import Assignment, RankAssignment
from corral.stack.context import Context

T0 = datetime(2026, 12, 1, tzinfo=UTC)
SOUND = {"name": "old", "queue": "team-a", "runtime": "sim", "duration_seconds": 5}
#: What a Corral without the start rules accepted and recorded.
OLD_SPECS: dict[str, dict[str, Any]] = {
    "env.NVIDIA_VISIBLE_DEVICES": {**SOUND, "env": {"NVIDIA_VISIBLE_DEVICES": "0"}},
    "checkpoint.signal": {**SOUND, "checkpoint": {"signal": "SIGKILL", "grace_seconds": 30.0}},
    "env.X": {**SOUND, "env": {"X": "a\x00b"}},
    "command[0]": {**SOUND, "runtime": "process", "command": [" ", "x"]},
    "mounts[0].source": {**SOUND, "runtime": "docker", "image": "img", "command": ["python"],
                         "mounts": [{"source": "/data:x", "target": "/data"}]},
}


def recorded_bytes(spec: dict[str, Any], job_id: str = "old1", schema_version: int = 2) -> bytes:
    """A JobSubmitted as an older Corral wrote it to the log: a sound one's bytes with `spec` in."""
    sound = ev.JobSubmitted.new(stream=job_stream(job_id), actor="admission", job_id=job_id, user="alice",
                                spec=validate_job_spec(SOUND), now=T0)
    doc = msgspec.json.decode(encode(sound))
    doc["spec"] = spec
    doc["schema_version"] = schema_version
    return msgspec.json.encode(doc)


@pytest.mark.parametrize("field", sorted(OLD_SPECS))
@pytest.mark.parametrize("schema_version", [1, 2])
def test_a_recorded_spec_decodes_folds_and_audits(field: str, schema_version: int) -> None:
    event = decode(recorded_bytes(OLD_SPECS[field], schema_version=schema_version))
    assert isinstance(event, ev.JobSubmitted) and validated(event) == event
    admitted = ev.JobAdmitted.new(stream=event.stream, actor="admission", job_id=event.job_id, queue="team-a",
                                  priority=500, replicas=1, gpus_per_replica=1, now=T0)
    view = ClusterView()
    for version, e in enumerate((event, admitted), start=1):
        view.apply(decode(encode(e)), version=version)
    assert view.jobs["old1"].state is JobState.PENDING and view.jobs["old1"].spec == event.spec
    report = audit([Entry(1, T0, event), Entry(2, T0, admitted)])
    assert report.ok and report.events == 2, report.violations
    # the same spec submitted now: refused naming the field, by the CLI's check and by admission's
    with pytest.raises(SpecError) as refused:
        validate_job_spec(OLD_SPECS[field])
    assert field in {p.path for p in refused.value.problems}
    assert f"spec.{field}" in {p.path for p in start_problems(event.spec)}


def test_the_agent_still_refuses_a_recorded_spec_it_cannot_start() -> None:
    for field in ("env.NVIDIA_VISIBLE_DEVICES", "checkpoint.signal"):
        spec = decode(recorded_bytes(OLD_SPECS[field])).spec  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match=r"NVIDIA_VISIBLE_DEVICES|checkpoint\.signal"):
            Assignment(job_id="old1", attempt=0, world_size=1, node_rank=0, master_addr="127.0.0.1",
                       master_port=29500, ranks=(RankAssignment(0, 0, (0,)),), command=("true",),
                       checkpoint_dir=Path("/tmp/c"), log_dir=Path("/tmp/l"), env=dict(spec.env),
                       checkpoint_signal=spec.checkpoint.signal)


def test_a_sound_spec_has_no_start_problems() -> None:
    assert start_problems(validate_job_spec({**SOUND, "env": {"NCCL_DEBUG": "INFO"}})) == []


@pytest.mark.parametrize("field", sorted(OLD_SPECS))
def test_the_python_client_refuses_to_send_such_a_spec(field: str) -> None:
    spec = decode(recorded_bytes(OLD_SPECS[field])).spec  # type: ignore[attr-defined]
    store: Any = None
    client = Client(Context(nats_url="nats://127.0.0.1:1", postgres_dsn="postgresql://x@127.0.0.1/corral"), store, None)
    with pytest.raises(SpecError) as refused:
        client.submission(spec)
    assert field in {p.path for p in refused.value.problems}
