"""The newcomer's first hour, as the README tells it, from a fresh shell.

Why: a newcomer copy-pastes the README into a new terminal: `.venv/bin/corral up`, no venv
activated, no CORRAL_* variables. Jobs then ran the system Python (`No module named 'torch'`),
commands from another folder reached whichever cluster was started last, and `corral jobs` at 80
columns cut every id to the same prefix. These tests run the `corral` of the test's venv by its
absolute path, with a PATH that does not contain that venv, in folders of their own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.stack.up import Stack

ROOT = Path(__file__).resolve().parents[2]
CORRAL = str(Path(sys.executable).parent / "corral")  # not resolved: the venv's own script
HAS_TORCH = any(Path(p, "torch").exists() for p in sys.path)


def fresh_shell(home: Path) -> dict[str, str]:
    """A new terminal: system PATH only (no venv), no CORRAL_* variables, an 80-column screen."""
    venv_bin = str(Path(sys.executable).parent)
    path = ":".join(p for p in os.environ.get("PATH", "/usr/bin:/bin").split(":") if p and p != venv_bin)
    keep = {k: v for k, v in os.environ.items() if k in ("LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME")}
    return {**keep, "PATH": path, "HOME": str(home), "COLUMNS": "80", "PYTHONUNBUFFERED": "1"}


TRANSCRIPT = Path(os.environ.get("CORRAL_TEST_TRANSCRIPT", "/dev/null"))  # to read what a person would see


def corral(cwd: Path, env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([CORRAL, *args], cwd=cwd, env=env, text=True, capture_output=True, timeout=300)
    with TRANSCRIPT.open("a") as out:
        out.write(f"$ corral {' '.join(args)}\n{proc.stdout}{proc.stderr}")
    if check and proc.returncode != 0:
        raise AssertionError(f"corral {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def submitted(proc: subprocess.CompletedProcess[str]) -> str:
    match = re.search(r"Submitted job ([A-Za-z0-9_-]+)", proc.stdout)
    assert match, proc.stdout
    return match.group(1)


def jobs_json(cwd: Path, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {j["id"]: j for j in json.loads(corral(cwd, env, "jobs", "--all", "--json").stdout)}


def wait_until(check: Any, timeout: float, what: str, show: Any = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}" + (f": {show()}" if show else ""))


def assert_fits_80_columns_with_ids_whole(text: str, ids: list[str]) -> None:
    assert all(len(line.rstrip()) <= 80 for line in text.splitlines()), text
    for job_id in ids:
        assert re.search(rf"(^|\s){re.escape(job_id)}(\s|$)", text, re.M), f"{job_id} not whole in:\n{text}"


def project(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    shutil.copytree(ROOT / "examples", folder / "examples")
    return folder


@pytest.fixture
def session_dir() -> Iterator[Path]:
    """Not under pytest's basetemp: a concurrent pytest session prunes old basetemps, which would
    delete the data folder of the Postgres that `corral up` runs here (as tests/conftest.py notes)."""
    folder = Path(tempfile.mkdtemp(prefix="corral-first-session-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (make test installs it)")
def test_the_readme_first_session_from_a_fresh_shell_through_the_ddp_example(session_dir: Path) -> None:
    tmp_path = session_dir
    here = project(tmp_path, "proj")
    env = fresh_shell(tmp_path / "home")
    out = (tmp_path / "up.log").open("w")
    # `corral up` runs in the folder above the project: the agents' folder is not where the jobs'
    # files are; `corral submit` in the project runs a process job there (its workdir, as sbatch).
    up = subprocess.Popen([CORRAL, "up"], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                          start_new_session=True)
    try:
        wait_until(lambda: "Ctrl-C stops everything" in (tmp_path / "up.log").read_text() or up.poll() is not None,
                   180, "corral up")
        banner = (tmp_path / "up.log").read_text()
        assert up.poll() is None, banner
        assert "reach this cluster" in banner and ".corral/context.json" in banner
        assert not (tmp_path / "home" / ".config" / "corral").exists(), "no context outside the project folder"

        assert "Applied 3 queues" in corral(here, env, "apply", "examples/queues.yaml").stdout
        low = submitted(corral(here, env, "submit", "examples/low-priority-train.yaml"))
        share = submitted(corral(here, env, "submit", "examples/team-b-share.yaml"))
        gang = submitted(corral(here, env, "submit", "examples/gang-32.yaml"))
        ids = [low, share, gang]
        listing = corral(here, env, "jobs").stdout
        assert_fits_80_columns_with_ids_whole(listing, ids)
        why = corral(here, env, "why", gang).stdout
        assert f"job {gang}" in why and "JobSubmitted" in why
        if "Would unblock" in why and "MAX_GPUS_EXCEEDED" in why:  # README item 5: every job it waits for
            assert share in why or low not in why, why
        nodes = corral(here, env, "nodes").stdout
        assert [n for n in re.findall(r"^\s*(node-\d+)", nodes, re.M)] == ["node-0", "node-1", "node-2", "node-3"]

        assert f"Cancellation of {low} requested" in corral(here, env, "cancel", low).stdout
        wait_until(lambda: jobs_json(here, env)[gang]["state"] in ("RUNNING", "COMPLETED"), 90, "the gang to start",
                   lambda: jobs_json(here, env))
        assert_fits_80_columns_with_ids_whole(corral(here, env, "jobs", "--all").stdout, ids)
        assert "WorkerStarted" in corral(here, env, "events", "--limit", "5").stdout
        shown = corral(here, env, "show", low).stdout
        assert "CANCELLED" in shown and "None" not in shown

        # The DDP example: `command: [python, examples/ddp_allreduce.py, ...]` must find torch and corral,
        # although this shell's PATH has no venv: the agent puts its own interpreter's bin first; and
        # its script, relative to the folder it was submitted from, not to the agents' folder.
        ddp = corral(here, env, "submit", "examples/ddp-allreduce.yaml", "--wait", "--until-done", "--json",
                     "--timeout", "240", check=False)
        assert ddp.returncode == 0, ddp.stdout + ddp.stderr + "\n" + corral(here, env, "logs", "--json",
                                                                             json.loads(ddp.stdout)["id"],
                                                                             check=False).stdout
        result = json.loads(ddp.stdout)
        assert result["state"] == "COMPLETED"
        log = corral(here, env, "logs", result["id"], "--rank", "0").stdout
        assert "done at step 40" in log and "No module named" not in log
    finally:
        os.killpg(up.pid, signal.SIGINT)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(10)
        out.close()
    # The cluster is gone: the folder's context says so instead of pointing at nothing.
    gone = corral(here, env, "jobs", check=False)
    assert gone.returncode == 3 and "is gone" in " ".join(gone.stderr.split()), gone.stderr  # may wrap at 80


def readiness(stack: Stack) -> dict[str, str]:
    """Each service process's /readyz answer ("200 {...}") by process name."""
    import urllib.error
    import urllib.request

    answers = {}
    for p in stack.processes:
        if p.name == "node-agents" or not p.metrics_url:
            continue
        try:
            with urllib.request.urlopen(p.metrics_url + "/readyz", timeout=5) as answer:
                answers[p.name] = f"{answer.status} {answer.read().decode()}"
        except urllib.error.HTTPError as exc:
            answers[p.name] = f"{exc.code} {exc.read().decode()}"
        except OSError as exc:
            answers[p.name] = f"unreachable {exc}"
    return answers


def services_ready(stack: Stack) -> bool:
    """Every service of `stack` has a process answering /readyz with 200 (rebuilt from the log,
    consuming, caught up); of placement and its standby, the one holding the lease."""
    ready: dict[str, bool] = {}
    for name, answer in readiness(stack).items():
        service = name.removesuffix("-standby")
        ready[service] = ready.get(service, False) or answer.startswith("200 ")
    return all(ready.values())


def print_service_logs(folder: Path) -> None:
    for log in sorted((folder / ".corral" / "logs").glob("*.log")):
        print(f"--- {log.name} (last 60 lines)")
        print("\n".join(log.read_text(errors="replace").splitlines()[-60:]))


async def test_two_clusters_in_two_folders_each_folder_reaches_only_its_own(
        tmp_path: Path, nats_url: str, postgres_dsn: str) -> None:
    import asyncpg

    from corral.stack.up import StackOptions

    env = fresh_shell(tmp_path / "home")
    a, b = project(tmp_path, "a"), project(tmp_path, "b")
    # Two clusters: their own event logs (two databases) and subject namespaces, each started in its folder.
    other_db = postgres_dsn.rsplit("/", 1)[0] + "/" + postgres_dsn.rsplit("/", 1)[1] + "_b"
    admin = await asyncpg.connect(postgres_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{other_db.rsplit("/", 1)[1]}"')
    finally:
        await admin.close()
    stacks = []
    try:
        for folder, dsn, ns in ((a, postgres_dsn, "clustera"), (b, other_db, "clusterb")):
            stack = Stack(StackOptions(data_dir=folder / ".corral", cluster="2x8:H100", nats_url=nats_url,
                                       postgres_dsn=dsn, namespace=ns, runtime="sim"))
            stack.start()
            stacks.append(stack)
        def has_nodes(folder: Path) -> bool:
            nodes = corral(folder, env, "nodes", check=False)
            return nodes.returncode == 0 and "node-0" in nodes.stdout

        for folder, stack in zip((a, b), stacks, strict=True):
            wait_until(lambda f=folder: has_nodes(f), 60, "nodes")
            try:
                # Two stacks beside the other test workers load the machine: quota may still be starting
                # when the nodes show (CI once waited out apply's 30 s). Wait for every service's /readyz.
                wait_until(lambda s=stack: services_ready(s), 120, "every service ready",
                           show=lambda s=stack: readiness(s))
                corral(folder, env, "apply", "--timeout", "90", "examples/queues.yaml")
            except AssertionError:
                print_service_logs(folder)  # shown by pytest with the failure: what quota was doing
                raise
        in_a = submitted(corral(a, env, "submit", "examples/team-b-share.yaml"))
        (b / "deep" / "er").mkdir(parents=True)
        in_b = submitted(corral(b / "deep" / "er", env, "submit", "../../examples/nvlink-8.yaml"))  # from a subfolder
        assert set(jobs_json(a, env)) == {in_a}
        assert set(jobs_json(b, env)) == {in_b}
        assert corral(a, env, "show", in_b, check=False).returncode == 1
        # an explicit --context reaches the other folder's cluster on purpose
        assert set(json.loads(corral(a, env, "--context", str(b / ".corral"), "jobs", "--all", "--json").stdout)
                   [0].values()) >= {in_b}
        # and a folder without a cluster reaches none (no global fallback)
        (tmp_path / "elsewhere").mkdir()
        none = corral(tmp_path / "elsewhere", env, "jobs", check=False)
        assert none.returncode == 3 and "no .corral/context.json" in none.stderr
    finally:
        for s in stacks:
            s.stop()
        admin = await asyncpg.connect(postgres_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{other_db.rsplit("/", 1)[1]}" WITH (FORCE)')
        finally:
            await admin.close()
