"""`CORRAL_PROFILE_DIR`: a service's whole-run cProfile, and on SIGUSR1 the profile so far, restarted.

Why: a benchmark looks at what the services do during one command's runs (bench/cli.py
`--profile-dir`), not during the filling of the stack before them."""

from __future__ import annotations

import os
import pstats
import signal
from pathlib import Path

import pytest

from corral.profiling import PROFILE_DIR_ENV, PROFILE_ONLY_ENV, profiled


def _busy(n: int) -> int:
    return sum(i * i for i in range(n))


def test_sigusr1_writes_a_window_and_starts_a_new_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROFILE_DIR_ENV, str(tmp_path))
    before = signal.getsignal(signal.SIGUSR1)
    with profiled("svc"):
        _busy(10_000)
        os.kill(os.getpid(), signal.SIGUSR1)
        _busy(10)
    assert signal.getsignal(signal.SIGUSR1) is before
    window, whole = tmp_path / f"svc-{os.getpid()}-1.prof", tmp_path / f"svc-{os.getpid()}.prof"
    assert window.exists() and whole.exists()
    first = {f[2] for f in pstats.Stats(str(window)).stats}
    assert "<genexpr>" in first
    rest = pstats.Stats(str(whole)).stats
    assert sum(cc for (_, _, name), (cc, *_) in rest.items() if name == "<genexpr>") < 100, \
        "the last file holds what ran after the window"


def test_unset_profiles_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROFILE_DIR_ENV, raising=False)
    before = signal.getsignal(signal.SIGUSR1)
    with profiled("svc"):
        assert signal.getsignal(signal.SIGUSR1) is before


def test_only_profiles_the_named_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROFILE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(PROFILE_ONLY_ENV, "placement,quota")
    with profiled("admission"):
        _busy(10)
    with profiled("placement"):
        _busy(10)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"placement-{os.getpid()}.prof"]


def test_a_thread_started_inside_is_profiled_by_its_own_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """quota's round runs in a worker thread (`asyncio.to_thread`): its functions are in the file,
    and the main thread's wait for it is not charged the thread's CPU."""
    import threading

    monkeypatch.setenv(PROFILE_DIR_ENV, str(tmp_path))

    def in_thread() -> None:
        _busy(300_000)

    with profiled("svc"):
        worker = threading.Thread(target=in_thread)
        worker.start()
        worker.join()
    stats = pstats.Stats(str(tmp_path / f"svc-{os.getpid()}.prof")).stats
    ran = {name: (cc, tt, ct) for (_, _, name), (cc, _, tt, ct, _) in stats.items()}
    assert "in_thread" in ran and ran["in_thread"][2] > 0
    join = sum(ct for (_, _, name), (_, _, _, ct, _) in stats.items() if name == "join")
    assert join < ran["in_thread"][2] / 2, "the main thread's wait is charged its own CPU only"


def test_a_process_left_out_outlives_a_window_signal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A benchmark signals the whole stack for a window (bench/cli.py): a process that
    `CORRAL_PROFILE_ONLY` leaves out ignores it instead of ending (SIGUSR1's default)."""
    monkeypatch.setenv(PROFILE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(PROFILE_ONLY_ENV, "quota")
    before = signal.getsignal(signal.SIGUSR1)
    with profiled("admission"):
        os.kill(os.getpid(), signal.SIGUSR1)
        _busy(10)
    assert signal.getsignal(signal.SIGUSR1) is before
    assert list(tmp_path.iterdir()) == []


def test_a_window_in_which_a_thread_ran_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """quota's worker thread may run nothing between two windows: its empty profile is left out
    (pstats refuses to load an empty one, which failed the window's write)."""
    import threading

    monkeypatch.setenv(PROFILE_DIR_ENV, str(tmp_path))
    with profiled("svc"):
        worker = threading.Thread(target=_busy, args=(1000,))
        worker.start()
        worker.join()
        os.kill(os.getpid(), signal.SIGUSR1)  # the thread's profile is cleared
        _busy(10)
        os.kill(os.getpid(), signal.SIGUSR1)  # ... and holds nothing in this window
    assert (tmp_path / f"svc-{os.getpid()}-2.prof").exists()
