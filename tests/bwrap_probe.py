"""Whether bubblewrap can run here: the reason its tests skip, or None."""

from __future__ import annotations

import shutil
import subprocess


def bwrap_problem() -> str | None:
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (`make test-deps` installs it as root: apt-get install bubblewrap)"
    probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-pid", "--proc", "/proc", "--dev", "/dev",
                            "true"], capture_output=True, text=True, check=False)
    return None if probe.returncode == 0 else f"bwrap cannot run here: {probe.stderr.strip()}"


BWRAP_PROBLEM = bwrap_problem()
