"""The node agent's NVML code on a fake `libnvidia-ml.so.1` (tests/fakenvml), loaded by pynvml's own
search (`LD_LIBRARY_PATH`) in a process of its own, as on a GPU host: the inventory (GPUs, memory,
UUIDs, NVLink domains from NVLink peers or an NVSwitch) and the health watcher (critical XIDs but
not application ones, double-bit ECC errors, a GPU fallen off the bus, and back)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.services.node_agent.host.gpu_health import APPLICATION_XIDS, GPU_LOST, XID, GpuHealth
from tests.fakenvml import FakeGpu, FakeNvml

DISCOVER = """
import json
from corral.services.node_agent.host.inventory import discover
from corral.services.node_agent.__main__ import nvml_inventory
found = discover("n1")
inv = nvml_inventory("n1", "r1", "z1", None)
print(json.dumps({"gpus": [[g.index, g.model, g.memory_gib, g.uuid] for g in found.gpus],
                  "domains": [list(d) for d in found.nvlink_domains], "source": found.source,
                  "registered": [[g.index, g.model, g.memory_gib] for g in inv.gpus]}))
"""

WATCH = """
import json, sys, time
from corral.services.node_agent.host.gpu_health import NvmlWatcher
def said(problems):
    print(json.dumps([[p.gpu, p.code, p.xid] for p in problems]), flush=True)
w = NvmlWatcher(said, poll_seconds=0.2)
w.start()
print("started", flush=True)
sys.stdin.readline()
w.stop()
"""


def _run(fake: FakeNvml, code: str) -> str:
    env = {**os.environ, **fake.env()}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                          timeout=60).stdout


def test_pynvml_finds_the_fake_gpus_and_their_nvlink_domains(fake_nvml: FakeNvml) -> None:
    out = json.loads(_run(fake_nvml, DISCOVER))
    assert out["source"] == "nvml"
    assert [g[0] for g in out["gpus"]] == list(range(8))
    assert {g[1] for g in out["gpus"]} == {"NVIDIA H100 80GB HBM3"} and out["gpus"][0][2] == 79.6
    assert len({g[3] for g in out["gpus"]}) == 8, "each GPU its UUID"
    assert out["domains"] == [[0, 1, 2, 3], [4, 5, 6, 7]], "two NVLink rings"
    assert out["registered"][0] == [0, "H100", 79.6], "the contract's model name"


def test_an_inactive_link_splits_a_domain_and_an_nvswitch_joins_one(fake_nvml: FakeNvml) -> None:
    # 0-1 linked (link 0 of each), 2-3 linked but that link is down; 4-7 on one NVSwitch, no direct link
    fake_nvml.write([FakeGpu(nvlink=(1,)), FakeGpu(nvlink=(0,)), FakeGpu(nvlink=(3,), nvlink_down=(0,)),
                     FakeGpu(nvlink=(2,), nvlink_down=(0,)), *(FakeGpu(nvswitch=1) for _ in range(4))])
    assert json.loads(_run(fake_nvml, DISCOVER))["domains"] == [[0, 1], [2], [3], [4, 5, 6, 7]]


def test_without_a_configured_fake_nvml_is_unavailable(fake_nvml: FakeNvml) -> None:
    env = {**os.environ, **fake_nvml.env(), "FAKE_NVML_CONFIG": str(fake_nvml.config) + ".absent"}
    out = subprocess.run([sys.executable, "-c", "from corral.services.node_agent.host.inventory import discover; "
                          "print(discover('n1'))"], env=env, capture_output=True, text=True, check=True).stdout
    assert "NvmlUnavailable" in out and "Driver Not Loaded" in out


@pytest.fixture
def watcher(fake_nvml: FakeNvml) -> Iterator[tuple[subprocess.Popen[str], queue.Queue[str]]]:
    proc = subprocess.Popen([sys.executable, "-c", WATCH], env={**os.environ, **fake_nvml.env()},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.strip()) for line in proc.stdout or ()], daemon=True).start()
    try:
        assert lines.get(timeout=30) == "started"
        yield proc, lines
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _next(lines: queue.Queue[str]) -> list[list[object]]:
    return json.loads(lines.get(timeout=30))


def test_the_watcher_reports_xids_ecc_errors_and_a_lost_gpu(
        fake_nvml: FakeNvml, watcher: tuple[subprocess.Popen[str], queue.Queue[str]]) -> None:
    _, lines = watcher
    fake_nvml.add_xid(2, 13)  # an application error: the GPU stays healthy
    fake_nvml.add_xid(2, 79)  # fell off the bus as an XID: critical
    assert _next(lines) == [[2, XID, 79]]
    fake_nvml.change(5, ecc_dbe=2)
    assert _next(lines) == [[2, XID, 79], [5, "ECC_DOUBLE_BIT", None]]
    fake_nvml.change(6, lost=True)
    assert _next(lines) == [[2, XID, 79], [5, "ECC_DOUBLE_BIT", None], [6, GPU_LOST, None]]
    fake_nvml.write([g if i not in (5, 6) else FakeGpu(nvlink=g.nvlink) for i, g in enumerate(fake_nvml.gpus)])
    assert _next(lines) == [[2, XID, 79]], "ECC cleared and the GPU back: healthy; an XID stays"


def test_application_xids_never_make_a_gpu_unhealthy() -> None:
    health = GpuHealth()
    assert {13, 31, 43, 45, 68, 109} == APPLICATION_XIDS
    assert not any(health.xid(0, x) for x in sorted(APPLICATION_XIDS))
    assert health.unhealthy() == ()
    assert health.xid(0, 48) and not health.xid(0, 79), "one XID problem per GPU"
    health.lost(0, True)
    assert [p.code for p in health.unhealthy()] == [GPU_LOST], "the gravest problem is the one said"


def test_the_fake_library_builds_from_source_in_the_suite(fake_nvml_lib: Path) -> None:
    assert (fake_nvml_lib / "libnvidia-ml.so.1").is_file()
