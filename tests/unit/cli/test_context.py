"""Which cluster a command reaches: the project folder's context, an explicit one, never a global one."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from corral.stack.context import Context, NoClusterError, StaleContextError, owned_by_this_process, resolve


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("CORRAL_NATS_URL", "CORRAL_POSTGRES_DSN", "CORRAL_NAMESPACE", "CORRAL_CONTEXT", "CORRAL_LOG_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home" / ".config"))


def _cluster(folder: Path, port: int) -> Context:
    ctx = owned_by_this_process(Context(nats_url=f"nats://127.0.0.1:{port}", postgres_dsn=f"postgresql://x@h:{port}/c",
                                        data_dir=str(folder / ".corral")))
    ctx.save(folder / ".corral" / "context.json")
    return ctx


def test_a_command_finds_the_context_of_its_project_folder_or_a_parent(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _cluster(a, 1001)
    _cluster(b, 2002)
    (a / "src" / "deep").mkdir(parents=True)
    monkeypatch.chdir(a / "src" / "deep")
    assert resolve().nats_url == "nats://127.0.0.1:1001"
    monkeypatch.chdir(b)
    assert resolve().nats_url == "nats://127.0.0.1:2002"
    assert resolve(context_path=a / ".corral").nats_url == "nats://127.0.0.1:1001"  # the data folder
    monkeypatch.setenv("CORRAL_CONTEXT", str(a / ".corral" / "context.json"))
    assert resolve().nats_url == "nats://127.0.0.1:1001"


def test_no_global_fallback_outside_a_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old ~/.config/corral/context.json (last cluster started wins) is never read."""
    _cluster(tmp_path / "elsewhere", 1001).save(tmp_path / "home" / ".config" / "corral" / "context.json")
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    with pytest.raises(NoClusterError, match=r"no \.corral/context\.json in .*empty or its parents"):
        resolve()


def test_an_explicit_context_that_does_not_exist_says_which_file(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NoClusterError, match=r"nowhere\.json does not exist"):
        resolve(context_path=tmp_path / "nowhere.json")
    # flags or the environment win; the context file is then not needed
    assert resolve("nats://n:1", "postgresql://p/db", context_path=tmp_path / "nowhere.json").nats_url == "nats://n:1"


@pytest.mark.parametrize("text", ["{bad", "[]", '{"nats_url": "nats://n:1"}'])
def test_a_context_file_that_is_not_one_says_which_file_and_what_to_do(tmp_path: Path, text: str) -> None:
    """A hand-edited or truncated context (a person's from `corral user add --out`) is one clear
    error naming the file, never a traceback."""
    (tmp_path / "ctx.json").write_text(text)
    with pytest.raises(NoClusterError, match=r"ctx\.json is not a Corral context"):
        resolve(context_path=tmp_path / "ctx.json")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_a_context_file_this_account_cannot_read_says_so(tmp_path: Path) -> None:
    (tmp_path / "ctx.json").write_text("{}")
    (tmp_path / "ctx.json").chmod(0)
    with pytest.raises(NoClusterError, match=r"ctx\.json cannot be read"):
        resolve(context_path=tmp_path / "ctx.json")


def test_a_context_whose_cluster_is_gone_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    finished = subprocess.Popen(["true"])
    finished.wait()
    ctx = Context(nats_url="nats://127.0.0.1:1", postgres_dsn="postgresql://x@h/c", data_dir=str(tmp_path / ".corral"),
                  pid=finished.pid, host=socket.gethostname())
    ctx.save(tmp_path / ".corral" / "context.json")
    monkeypatch.chdir(tmp_path)
    gone = rf"is gone: its `corral up` \(pid {finished.pid}\) is no longer running"
    with pytest.raises(StaleContextError, match=gone):
        resolve()
    # a context of another host cannot be checked that way: it is used as it is
    Context(**{**ctx.__dict__, "host": "another-host"}).save(tmp_path / ".corral" / "context.json")
    assert resolve().pid == finished.pid
    assert not owned_by_this_process(ctx).gone() and owned_by_this_process(ctx).pid == os.getpid()
