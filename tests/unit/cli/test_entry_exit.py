"""`corral.cli.entry.leave`: a hot command ends without the interpreter's teardown, but as
`sys.exit` would end it: its exit code, its output flushed, the exit handlers run, and the usual
exit while another thread still runs."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("code", "status"), [("0", 0), ("None", 0), ("4", 4), ("True", 1)])
def test_the_exit_code_the_output_and_the_handlers(code: str, status: int) -> None:
    done = _run("import atexit, sys\n"
                "from corral.cli.entry import leave\n"
                "atexit.register(lambda: print('handler ran'))\n"
                "print('out', end='')\n"
                "sys.stderr.write('err')\n"
                f"leave({code})\n")
    assert (done.returncode, done.stdout, done.stderr) == (status, "outhandler ran\n", "err")


def test_a_message_is_printed_and_exits_1_as_sys_exit_does() -> None:
    done = _run("from corral.cli.entry import leave\nleave('error: no job')\n")
    assert (done.returncode, done.stderr) == (1, "error: no job\n")


def test_a_thread_still_running_is_waited_for() -> None:
    done = _run("import threading, time\n"
                "from corral.cli.entry import leave\n"
                "threading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start()\n"
                "leave(3)\n")
    assert (done.returncode, done.stdout) == (3, "thread done\n")


def test_a_reader_gone_is_an_exit_120_as_the_interpreter_says_it() -> None:
    """stdout whose flush fails at the end (the reader went away): 120, as Python's own exit."""
    done = _run("import io, sys\n"
                "from corral.cli.entry import leave\n"
                "class Gone(io.StringIO):\n"
                "    def flush(self): raise BrokenPipeError(32, 'Broken pipe')\n"
                "sys.stdout = Gone()\n"
                "leave(0)\n")
    assert done.returncode == 120
