"""Hosts as network namespaces: each host of a test cluster has its own network stack.

Loopback aliases (127.0.0.x) share one stack: every address is local to every process, so an
address advertised wrong, a server listening on the wrong interface or a host cut off from the
others cannot show. Here each host is a namespace (`ip netns add`) with loopback up and one
interface, `eth0`, a veth whose other end is a port of a bridge in a switch namespace of the
test's own. Addresses (10.77.0.x/24) exist only inside these namespaces: the machine's own
interfaces, routes and bridges are never touched. `cut(host)` sets the host's switch port down,
as a pulled cable; `mend(host)` sets it up again.

Processes run on a host with `ip netns exec`; the test's own client runs on an event loop whose
thread joined a host's namespace (`NamespaceLoop`), so sockets it opens are that host's. Names
carry the test process's pid, so parallel test workers never collide; `destroy()` kills what
still runs in the namespaces and deletes them, also after a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
SUBNET = "10.77.0"


class NamespacesUnavailable(Exception):
    """This machine (or this account) cannot make network namespaces: the reason, for a skip."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if shutil.which("ip") is None:
        return "no `ip` command to make network namespaces (apt-get install iproute2; `make test` does as root)"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    return None


@dataclass
class Host:
    name: str  # the host's name in the test (a node name)
    netns: str  # its namespace
    address: str  # its address on the test's network
    port: str  # its switch port (in the switch namespace): down cuts the host off


@dataclass
class Network:
    """A switch and `hosts` attached to it; `hosts[i]` gets address SUBNET.(i+1)."""

    names: Sequence[str]
    prefix: str = field(default_factory=lambda: f"corral{os.getpid()}")
    hosts: dict[str, Host] = field(default_factory=dict)
    made: list[str] = field(default_factory=list)

    @property
    def switch(self) -> str:
        return f"{self.prefix}-switch"

    def create(self) -> Network:
        reason = unavailable_reason()
        if reason is not None:
            raise NamespacesUnavailable(reason)
        try:
            self._add(self.switch)
        except RuntimeError as exc:
            raise NamespacesUnavailable(f"`ip netns add` failed: {exc}") from None
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, name in enumerate(self.names):
            host = Host(name, f"{self.prefix}-{name}", f"{SUBNET}.{i + 1}", f"port{i}")
            self._add(host.netns)
            _ip("-n", self.switch, "link", "add", host.port, "type", "veth", "peer", "name", "eth0",
                "netns", host.netns)
            _ip("-n", self.switch, "link", "set", host.port, "master", "br0", "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")
            self.hosts[name] = host
        return self

    def _add(self, netns: str) -> None:
        if (NETNS_DIR / netns).exists():  # left by an earlier process that had this pid
            self._delete(netns)
        _ip("netns", "add", netns)
        self.made.append(netns)

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """`argv` run on `host`."""
        return ["ip", "netns", "exec", self.hosts[host].netns, *argv]

    def cut(self, host: str) -> None:
        _ip("-n", self.switch, "link", "set", self.hosts[host].port, "down")

    def mend(self, host: str) -> None:
        _ip("-n", self.switch, "link", "set", self.hosts[host].port, "up")

    def pids(self, netns: str) -> list[int]:
        done = _ip("netns", "pids", netns, check=False)
        return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []

    def destroy(self) -> None:
        """Kill whatever still runs in the namespaces (every process there is the test's), then
        delete them."""
        for netns in reversed(self.made):
            self._delete(netns)
        self.made.clear()

    def _delete(self, netns: str) -> None:
        for _ in range(50):
            pids = self.pids(netns)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        _ip("netns", "delete", netns, check=False)


@contextlib.contextmanager
def network(names: Sequence[str]) -> Iterator[Network]:
    net = Network(names)
    try:
        yield net.create()
    finally:
        net.destroy()


class NamespaceLoop:
    """An event loop on a thread that joined a namespace: what it connects to, it reaches from
    that host (a namespace is per thread; the rest of the test process stays where it is)."""

    def __init__(self, netns: str) -> None:
        self.loop = asyncio.new_event_loop()
        joined: list[BaseException | None] = []
        ready = threading.Event()

        def run() -> None:
            try:
                _join(netns)
            except BaseException as exc:  # reported to the constructor
                joined.append(exc)
                ready.set()
                return
            joined.append(None)
            ready.set()
            asyncio.set_event_loop(self.loop)
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name=f"netns-{netns}", daemon=True)
        self.thread.start()
        ready.wait(10)
        if not joined or joined[0] is not None:
            raise RuntimeError(f"cannot join namespace {netns}: {joined and joined[0]}")

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 180) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _join(netns: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(NETNS_DIR / netns, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {netns}")
    finally:
        os.close(fd)


__all__ = ["Host", "NamespaceLoop", "NamespacesUnavailable", "Network", "network", "unavailable_reason"]
