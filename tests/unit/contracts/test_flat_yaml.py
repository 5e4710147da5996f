"""A flat job spec is read without the YAML parser, exactly as the YAML parser reads it."""

from __future__ import annotations

import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from corral.contracts.validation import flat_yaml, parse_document

_WORDS = st.sampled_from(["name", "queue", "runtime", "gpus_per_replica", "duration_seconds", "yes", "No", "ON",
                          "off", "True", "null", "Null", "y", "n", "inf", "nan", "_x", "a.b", "cli-bench", "x/y",
                          "e", "E5", "1e3", "0", "00", "07", "08", "-0", "-5", "+5", "42", "1_000", "0x1f", "0o7",
                          "1:20", "3.5", ".5", "~", "", "a b", "'q'", '"q"', "[1]", "{a: 1}", "#c", "a #c", "<<"])
_LINE = st.one_of(
    st.tuples(_WORDS, st.sampled_from([": ", ":  ", ":", " : "]), _WORDS, st.sampled_from(["", " ", "\r"])).map(
        lambda t: "".join(t)),
    st.sampled_from(["", "# a comment", "  # indented", "---", "...", "  nested: 1", "- item", "\t"]))


@settings(max_examples=400, deadline=None)
@given(lines=st.lists(_LINE, max_size=8))
@example(lines=["name: cli-bench", "queue: bench", "gpus_per_replica: 8", "runtime: sim", "duration_seconds: 86400"])
def test_flat_yaml_reads_as_yaml_reads_or_leaves_it_to_yaml(lines: list[str]) -> None:
    text = "\n".join(lines)
    flat = flat_yaml(text)
    if flat is not None:
        assert flat == yaml.safe_load(text)
        assert parse_document(text, "yaml") == flat


def test_the_bench_spec_is_flat() -> None:
    assert flat_yaml("name: cli-bench\nqueue: bench\ngpus_per_replica: 8\nruntime: sim\n") == {
        "name": "cli-bench", "queue": "bench", "gpus_per_replica": 8, "runtime": "sim"}
    assert flat_yaml("name: x\nenv:\n  A: 1\n") is None
    assert flat_yaml("preemptible: yes\n") is None
