"""Real container engines for the tests, and an image made here without a registry.

The image is this machine's Python: the interpreter's own prefix (the standard library, not its
site-packages) and the shared libraries that it, its extension modules and the test venv's compiled
modules load (`ldd`), at their paths, plus /etc/passwd, /etc/group and /tmp. The venv and the
checkout are bind-mounted read-only by the job spec, at their own paths, so the job runs the code
under test. The tarball is cached in ~/.cache/corral-test (keyed on the interpreter and the compiled
modules) and imported once per engine (`docker import`, `podman import`): a few seconds.

Engines: Docker Engine (`dockerd` of Debian's `docker.io`), a private daemon per test session (its
own data root and socket, no bridge, no iptables); podman with runc and a containers.conf of the
session's own (`CONTAINERS_CONF`), whose default ulimits stay within this machine's hard limits (a
VM without CAP_SYS_RESOURCE cannot raise them, which podman's defaults ask for).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import resource
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "corral-test"
#: Standard-library parts no job imports (tests, GUIs; and config-*, the static library): left out of the image.
SKIP = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data"}


@dataclass
class Engine:
    """A container engine the tests can use: its client's environment, or why it cannot run here."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    problem: str | None = None
    image: str | None = None

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.name, *args], env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=timeout, check=False)


def _shared_objects() -> list[Path]:
    """The compiled files the image's Python may load: its own, and the venv's."""
    base = Path(sys.base_prefix)
    found = [Path(os.path.realpath(sys.executable))]
    found += sorted(Path(_stdlib(), "lib-dynload").glob("*.so"))
    found += sorted(Path(sysconfig.get_path("purelib")).rglob("*.so*"))
    return [p for p in found if p.is_file() and (base in p.parents or Path(sys.prefix) in p.parents
                                                 or p == found[0])]


def image_key() -> str:
    """What the image depends on: the interpreter, and the compiled modules (names inside the venv,
    not its path, so every checkout with the same dependencies shares one image; and sizes)."""
    h = hashlib.sha256(f"{sys.version}\n{sys.base_prefix}\n".encode())
    for p in _shared_objects():
        name = p.relative_to(sys.prefix) if Path(sys.prefix) in p.parents else p
        h.update(f"{name}\t{p.stat().st_size}\n".encode())
    return h.hexdigest()[:16]


def _libraries(objects: list[Path]) -> set[str]:
    """The system libraries `objects` load (ldd's paths), outside the interpreter and the venv."""
    own = (sys.base_prefix + "/", sys.prefix + "/")
    libs: set[str] = set()
    for chunk in range(0, len(objects), 200):
        out = subprocess.run(["ldd", *map(str, objects[chunk:chunk + 200])], capture_output=True, text=True,
                             check=False).stdout
        for line in out.splitlines():
            parts = line.split()
            path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0] if parts else ""
            if path.startswith("/") and not path.startswith(own):
                libs.add(path)
    return libs


class _Tree:
    """A tarball of host paths at the same paths: symlinks on the way kept, files dereferenced."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar
        self.done: set[str] = set()

    def dirs(self, path: str) -> str:
        """Add the folders (and symlinks) leading to `path`; its real folder."""
        real = "/"
        for name in path.strip("/").split("/")[:-1]:
            here = os.path.join(real, name)
            if os.path.islink(here):
                self.entry(here)
                target = os.readlink(here)
                real = os.path.realpath(os.path.join(real, target))
                self.dirs(real + "/x")
            else:
                real = here
                self.entry(here)
        return real

    def entry(self, path: str, arcpath: str | None = None) -> None:
        arc = (arcpath or path).lstrip("/")
        if arc in self.done:
            return
        self.done.add(arc)
        info = self.tar.gettarinfo(path, arcname=arc)
        if info.isdir():
            info.mode |= 0o755
        if info.isreg():
            info.mode |= 0o444
            with open(path, "rb") as f:
                self.tar.addfile(info, f)
        else:
            self.tar.addfile(info)

    def file(self, path: str) -> None:
        """`path` (dereferenced) at its path, its folders before it."""
        folder = self.dirs(path)
        self.entry(os.path.realpath(path), os.path.join(folder, os.path.basename(path)))

    def tree(self, root: str) -> None:
        self.dirs(root + "/x")
        for folder, subdirs, files in os.walk(root):
            top = folder == _stdlib()
            subdirs[:] = sorted(d for d in subdirs if not (top and (d in SKIP or d.startswith("config-"))))
            self.entry(folder)
            files = [f for f in files if ".opt-" not in f]  # the optimized bytecode no job runs
            for name in sorted(files + [d for d in subdirs if os.path.islink(os.path.join(folder, d))]):
                self.entry(os.path.join(folder, name))

    def text(self, arc: str, text: str, mode: int = 0o644) -> None:
        info = tarfile.TarInfo(arc.lstrip("/"))
        data = text.encode()
        info.size, info.mode = len(data), mode
        self.tar.addfile(info, io.BytesIO(data))

    def folder(self, arc: str, mode: int) -> None:
        info = tarfile.TarInfo(arc.lstrip("/"))
        info.type, info.mode = tarfile.DIRTYPE, mode
        self.tar.addfile(info)
        self.done.add(arc.lstrip("/"))


def _stdlib() -> str:
    """The interpreter's standard library (where `os` comes from: the base prefix, not the venv)."""
    return os.path.dirname(os.__file__)


def python_rootfs() -> Path:
    """The image's tarball (built once, then cached)."""
    out = CACHE / f"python-rootfs-{image_key()}.tar"
    if out.exists():
        os.utime(out)  # in use: kept by the pruning below
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    objects = _shared_objects()
    fd, tmp = tempfile.mkstemp(dir=CACHE, suffix=".part")
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w") as tar:
        tree = _Tree(tar)
        tree.folder("/tmp", 0o1777)
        tree.folder("/root", 0o755)  # an interpreter under root's home is reachable by any --user
        tree.text("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n")
        tree.text("/etc/group", "root:x:0:\nnogroup:x:65534:\n")
        bindir = os.path.join(sys.base_prefix, "bin")
        for name in sorted(n for n in os.listdir(bindir) if n.startswith("python")):
            path = os.path.join(bindir, name)
            if os.path.islink(path):  # python3 -> python3.11: kept a link
                tree.dirs(path)
                tree.entry(path)
            else:
                tree.file(path)
        libdir = os.path.join(sys.base_prefix, "lib")
        for name in sorted(os.listdir(libdir)):
            if name.startswith("libpython") and ".so." in name:  # what the interpreter loads
                tree.file(os.path.join(libdir, name))
        tree.tree(_stdlib())
        for lib in sorted(_libraries(objects)):
            tree.file(lib)
    os.replace(tmp, out)
    for old in CACHE.glob("python-rootfs-*.tar"):  # another interpreter's or dependencies', unused for a week
        if old != out and time.time() - old.stat().st_mtime > 7 * 86400:
            old.unlink(missing_ok=True)
    return out


def import_image(engine: Engine) -> str:
    """The image's name in `engine`, imported when it is not there yet."""
    tag = f"localhost/corral-test-python:{image_key()}"
    if engine.run("image", "inspect", tag).returncode != 0:
        done = engine.run("import", str(python_rootfs()), tag, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{engine.name} import: {done.stderr.strip()}")
    return tag


@contextlib.contextmanager
def docker_engine(folder: Path) -> Iterator[Engine]:
    """A private dockerd (Debian's docker.io) for the session, or an Engine saying why not."""
    if os.geteuid() != 0:
        yield Engine("docker", problem="dockerd needs root")
        return
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        yield Engine("docker", problem="Docker Engine is not installed (`make test-deps` installs it as root: "
                                       "apt-get install docker.io)")
        return
    folder.mkdir(parents=True, exist_ok=True)
    sock = folder / "docker.sock"
    log = open(folder / "dockerd.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        ["dockerd", "--data-root", str(folder / "root"), "--exec-root", str(folder / "exec"),
         "--host", f"unix://{sock}", "--pidfile", str(folder / "dockerd.pid"), "--iptables=false",
         "--ip6tables=false", "--bridge=none"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    engine = Engine("docker", env={"DOCKER_HOST": f"unix://{sock}"})
    try:
        deadline = time.monotonic() + 60
        while engine.run("version", timeout=10).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (folder / "dockerd.log").read_text(errors="replace").splitlines()[-5:]
                engine.problem = "dockerd did not start: " + " | ".join(tail)
                break
            time.sleep(0.2)
        if engine.problem is None:
            engine.image = import_image(engine)
        yield engine
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        _unmount_below(folder)  # dockerd leaves its network namespace's bind mount behind
        shutil.rmtree(folder, ignore_errors=True)


def _unmount_below(folder: Path) -> None:
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    for point in sorted((p for p in points if p.startswith(f"{folder}/")), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)


def podman_engine(folder: Path) -> Engine:
    """podman with runc and a containers.conf of the session's own, or an Engine saying why not."""
    if os.geteuid() != 0:
        return Engine("podman", problem="rootful podman needs root")
    if shutil.which("podman") is None or shutil.which("runc") is None:
        return Engine("podman", problem="podman or runc is not installed (`make test-deps` installs them as root: "
                                        "apt-get install podman runc)")
    if not Path("/usr/libexec/podman/catatonit").exists():
        return Engine("podman", problem="podman's --init needs catatonit (`make test-deps` installs it as root: "
                                        "apt-get install catatonit)")
    folder.mkdir(parents=True, exist_ok=True)
    limits = []
    for name, which in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        hard = resource.getrlimit(which)[1]
        value = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
        limits.append(f'"{name}={value}:{value}"')
    conf = folder / "containers.conf"
    conf.write_text(f"[containers]\ndefault_ulimits = [{', '.join(limits)}]\n[engine]\nruntime = \"runc\"\n")
    engine = Engine("podman", env={"CONTAINERS_CONF": str(conf)})
    probe = engine.run("info", "--format", "{{.Host.OCIRuntime.Name}}", timeout=60)
    if probe.returncode != 0:
        engine.problem = f"podman cannot run here: {probe.stderr.strip()}"
        return engine
    engine.image = import_image(engine)
    return engine
