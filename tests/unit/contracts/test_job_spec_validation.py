"""Job spec files: every problem is reported at once, naming the field and the fix."""

from __future__ import annotations

import json

import pytest

from corral.contracts import JobSpec, SpecError, load_job_spec, validate_job_spec

MINIMAL = {"name": "train", "queue": "research/nlp", "command": ["python", "train.py"]}


def problems_of(obj: object) -> dict[str, tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        validate_job_spec(obj)
    return {p.path: (p.message, p.hint) for p in info.value.problems}


def test_minimal_spec_gets_documented_defaults() -> None:
    spec = validate_job_spec(MINIMAL)
    assert spec.priority == 500
    assert (spec.replicas, spec.gpus_per_replica, spec.total_gpus) == (1, 1, 1)
    assert spec.preemptible is True
    assert spec.checkpoint.signal == "SIGUSR1"
    assert spec.checkpoint.grace_seconds == 30
    assert spec.restart.max_restarts == 0
    assert spec.runtime == "process"
    assert spec.topology.replica == "node"
    assert spec.topology.gang is None


@pytest.mark.parametrize(("name", "value"), [("low", 100), ("normal", 500), ("high", 900), ("urgent", 1000)])
def test_named_priority_classes_become_integers(name: str, value: int) -> None:
    assert validate_job_spec({**MINIMAL, "priority": name}).priority == value


def test_integer_priority_is_kept() -> None:
    assert validate_job_spec({**MINIMAL, "priority": 742}).priority == 742


def test_unknown_priority_class_names_field_and_lists_classes() -> None:
    message, hint = problems_of({**MINIMAL, "priority": "asap"})["priority"]
    assert "asap" in message
    assert "urgent" in hint


def test_half_a_gpu_is_rejected_because_gpus_are_whole() -> None:
    message, hint = problems_of({**MINIMAL, "gpus_per_replica": 0.5})["gpus_per_replica"]
    assert "whole number" in message and "0.5" in message
    assert "GPUs are whole" in hint


def test_zero_replicas_is_rejected_with_the_range() -> None:
    message, hint = problems_of({**MINIMAL, "replicas": 0})["replicas"]
    assert ">= 1" in message
    assert "gang size" in hint


def test_bad_topology_level_names_the_nested_field_and_the_choices() -> None:
    message, hint = problems_of({**MINIMAL, "topology": {"gang": "building"}})["topology.gang"]
    assert "building" in message
    assert hint == "use one of nvlink, node, rack, zone"


def test_replica_level_cannot_be_rack() -> None:
    _, hint = problems_of({**MINIMAL, "topology": {"replica": "rack"}})["topology.replica"]
    assert hint == "use one of nvlink, node"


def test_unknown_fields_get_a_did_you_mean_hint() -> None:
    found = problems_of({**MINIMAL, "gpus_per_replicas": 8, "topology": {"gnag": "node"}})
    assert found["gpus_per_replicas"] == ("unknown field `gpus_per_replicas`", "did you mean `gpus_per_replica`?")
    assert found["topology.gnag"][1] == "did you mean `gang`?"


def test_unknown_field_without_a_close_match_lists_known_fields() -> None:
    _, hint = problems_of({**MINIMAL, "zzz": 1})["zzz"]
    assert hint.startswith("known fields:") and "replicas" in hint


def test_all_problems_are_reported_together() -> None:
    found = problems_of({"name": "bad name", "queue": "research/nlp", "replicas": -1,
                         "gpus_per_replica": 1.5, "topology": {"gang": "x"}, "colour": "red"})
    assert set(found) >= {"name", "replicas", "gpus_per_replica", "topology.gang", "colour"}


def test_missing_required_fields_are_named() -> None:
    found = problems_of({"command": ["x"]})
    assert found["name"][0] == "missing required field"
    assert "research/nlp" in found["queue"][1]


def test_env_values_must_be_strings_and_names_valid() -> None:
    found = problems_of({**MINIMAL, "env": {"BATCH": 32, "bad-name": "x"}})
    assert "quote" in found["env.BATCH"][1]
    assert found["env.bad-name"][0].startswith("bad key")


def test_process_runtime_requires_a_command() -> None:
    message, hint = problems_of({"name": "t", "queue": "q"})["command"]
    assert "runtime is `process`" in message
    assert "runtime: sim" in hint


def test_sim_runtime_requires_a_duration() -> None:
    message, _ = problems_of({"name": "t", "queue": "q", "runtime": "sim"})["duration_seconds"]
    assert "runtime is `sim`" in message


def test_sim_job_needs_no_command() -> None:
    spec = validate_job_spec({"name": "t", "queue": "q", "runtime": "sim", "duration_seconds": 60})
    assert spec.command is None and spec.duration_seconds == 60


def test_a_spec_that_is_not_a_mapping_is_one_clear_problem() -> None:
    found = problems_of(["name", "train"])
    assert "mapping" in found[""][0]


YAML_SPEC = """
name: llama-finetune
queue: research/nlp
user: alice
priority: high
replicas: 4
gpus_per_replica: 8
gpu: {model: H100, min_memory_gib: 80}
topology: {replica: nvlink, gang: rack, prefer: node}
preemptible: true
checkpoint: {signal: SIGUSR1, grace_seconds: 120}
min_runtime_seconds: 600
estimated_runtime_seconds: 7200
restart: {max_restarts: 2}
command: [python, train.py, --epochs, "3"]
env: {NCCL_DEBUG: INFO}
submission_id: nightly-2026-12-02
"""


def test_yaml_file_with_every_field_loads() -> None:
    spec = load_job_spec(YAML_SPEC, "yaml")
    assert spec.priority == 900
    assert spec.total_gpus == 32
    assert spec.gpu is not None and spec.gpu.model == "H100"
    assert (spec.topology.replica, spec.topology.gang, spec.topology.prefer) == ("nvlink", "rack", "node")
    assert spec.checkpoint.grace_seconds == 120
    assert spec.restart.max_restarts == 2
    assert spec.env == {"NCCL_DEBUG": "INFO"}


def test_json_and_yaml_give_the_same_spec() -> None:
    as_yaml = load_job_spec(YAML_SPEC)
    import yaml

    as_json = load_job_spec(json.dumps(yaml.safe_load(YAML_SPEC)))
    assert as_json == as_yaml


def test_broken_yaml_is_a_spec_error_not_a_parser_exception() -> None:
    with pytest.raises(SpecError) as info:
        load_job_spec("name: [unclosed", "yaml")
    assert "not valid YAML" in info.value.problems[0].message


def test_broken_json_is_a_spec_error_with_line_and_column() -> None:
    with pytest.raises(SpecError) as info:
        load_job_spec('{"name": "x",}', "json")
    assert "line 1" in info.value.problems[0].message


def test_spec_error_message_lists_path_message_and_hint() -> None:
    with pytest.raises(SpecError) as info:
        validate_job_spec({**MINIMAL, "topology": {"gang": "x"}})
    assert "topology.gang: Invalid enum value 'x' (hint: use one of nvlink, node, rack, zone)" in str(info.value)


def test_job_spec_built_in_code_normalises_priority_names() -> None:
    spec = JobSpec(name="t", queue="q", command=["x"], priority="urgent")  # type: ignore[arg-type]
    assert spec.priority == 1000
