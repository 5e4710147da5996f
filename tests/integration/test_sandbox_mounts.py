"""The sandbox runtime with real bubblewrap: a mount target anywhere (below a read-only host folder
such as /mnt or a home, or below a folder no host has) is made inside the sandbox's own root, and
what the host has beside it stays visible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.services.node_agent.process.assignment import Assignment, MountBind, RankAssignment, build_rank_env
from corral.services.node_agent.process.runtimes import SandboxRuntime
from tests.bwrap_probe import BWRAP_PROBLEM

pytestmark = pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=BWRAP_PROBLEM or "")

RANK = RankAssignment(rank=0, local_rank=0, gpus=())
#: A home folder of this machine (the submitter's, as a new user would write it), else one it lacks.
HOMES = sorted(e.name for e in Path("/home").iterdir() if e.is_dir()) if Path("/home").is_dir() else []
HOME = f"/home/{HOMES[0] if HOMES else 'corral-nobody'}"

#: Run inside the sandbox: what each path holds, and whether writing there works.
PROBE = """\
import json, os, sys
out = {}
for path in sys.argv[1:]:
    if path.startswith("write:"):
        path = path[6:]
        try:
            with open(path, "w") as f:
                f.write("written inside")
            out[path] = "written"
        except OSError as exc:
            out[path] = f"refused {exc.errno}"
    elif os.path.isdir(path):
        out[path] = sorted(os.listdir(path))
    elif os.path.exists(path):
        out[path] = open(path).read()
    else:
        out[path] = None
print(json.dumps(out))
"""


def run_sandboxed(tmp_path: Path, mounts: list[MountBind], paths: list[str]) -> dict[str, object]:
    ckpt, control = tmp_path / "ckpt", tmp_path / "rank-0.control"
    ckpt.mkdir()
    control.touch()
    a = Assignment(job_id="j", attempt=0, world_size=1, node_rank=0, master_addr="127.0.0.1", master_port=29500,
                   ranks=(RANK,), command=(sys.executable, "-c", PROBE, *paths), checkpoint_dir=ckpt,
                   log_dir=tmp_path / "logs", mounts=tuple(mounts), runtime="sandbox")
    launch = SandboxRuntime().launch(a, RANK, build_rank_env(a, RANK, control, os.environ), control)
    done = subprocess.run(launch.argv, env=launch.env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, (done.stderr, launch.argv)
    result: dict[str, object] = json.loads(done.stdout)
    return result


def dataset(tmp_path: Path, name: str, **files: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    for file, text in files.items():
        (folder / file).write_text(text)
    return folder


@pytest.mark.parametrize("target", ["/mnt/data", f"{HOME}/data", "/workspace/a/b"])
def test_a_mount_target_anywhere_is_made_inside_the_sandbox(tmp_path: Path, target: str) -> None:
    data = dataset(tmp_path, "data", **{"hello.txt": "hello"})
    parent = os.path.dirname(target)
    seen = run_sandboxed(tmp_path, [MountBind(str(data), target)], [f"{target}/hello.txt", parent])
    assert seen[f"{target}/hello.txt"] == "hello"
    beside = sorted(os.listdir(parent)) if os.path.isdir(parent) else []
    assert seen[parent] == sorted({*beside, os.path.basename(target)})  # the host's entries stay visible


def test_nested_mounts_keep_what_lies_beneath_and_stay_read_only(tmp_path: Path) -> None:
    ws = dataset(tmp_path, "ws", **{"keep.txt": "kept"})
    (ws / "code").mkdir()
    (ws / "code" / "train.py").write_text("print()")
    out = dataset(tmp_path, "out")
    data = dataset(tmp_path, "data", **{"hello.txt": "hello"})
    # given deepest first: each is still bound after (and on top of) the folder it lies in
    seen = run_sandboxed(tmp_path, [
        MountBind(str(data), "/workspace/code/more/data"), MountBind(str(out), "/workspace/a/out", read_only=False),
        MountBind(str(ws), "/workspace"), MountBind(str(data), "/mnt/data")],
        ["/workspace", "/workspace/code", "/workspace/code/more/data/hello.txt", "write:/workspace/a/out/result",
         "write:/workspace/new", "write:/workspace/a/new", "write:/mnt/new", "write:/mnt/data/new"])
    assert seen["/workspace"] == ["a", "code", "keep.txt"]
    assert seen["/workspace/code"] == ["more", "train.py"]
    assert seen["/workspace/code/more/data/hello.txt"] == "hello"
    assert seen["/workspace/a/out/result"] == "written" and (out / "result").read_text() == "written inside"
    for path in ("/workspace/new", "/workspace/a/new", "/mnt/new", "/mnt/data/new"):
        assert seen[path] == "refused 30", path  # EROFS: only writable mounts take writes
    assert sorted(os.listdir(ws)) == ["code", "keep.txt"]  # nothing made on the host


def test_a_target_below_a_writable_mount_is_made_in_that_folder(tmp_path: Path) -> None:
    out = dataset(tmp_path, "out")
    data = dataset(tmp_path, "data", **{"hello.txt": "hello"})
    seen = run_sandboxed(tmp_path, [MountBind(str(out), "/mnt/out", read_only=False),
                                    MountBind(str(data), "/mnt/out/in/data")],
                         ["/mnt/out/in/data/hello.txt", "write:/mnt/out/result"])
    assert seen == {"/mnt/out/in/data/hello.txt": "hello", "/mnt/out/result": "written"}
