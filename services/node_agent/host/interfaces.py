"""The network interface of the address a node advertises: where gloo's sockets go.

torch.distributed's gloo backend takes the address of its own sockets from the host name unless
`GLOO_SOCKET_IFNAME` names an interface. A host name that resolves to loopback (Debian's
127.0.1.1, a container's 127.0.0.1) makes a gang across hosts fail after a rendezvous that
worked: every rank meets at MASTER_ADDR, then offers its peers a loopback address
("Gloo connectFullMesh failed ... Connection refused"). The agent knows the address other hosts
reach it at (its advertised address; rank 0's node's is MASTER_ADDR), so its ranks get the
interface holding that address as `GLOO_SOCKET_IFNAME`, unless the agent's environment or the
job's `env` names one (theirs is kept). NCCL chooses its interfaces by its own rules (not the
host name): nothing is set for it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import ipaddress
import socket
from collections.abc import Iterable, Mapping

GLOO_IFNAME = "GLOO_SOCKET_IFNAME"


class _Sockaddr(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_ubyte * 14)]


class _Sockaddr6(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("port", ctypes.c_uint16), ("flowinfo", ctypes.c_uint32),
                ("addr", ctypes.c_ubyte * 16), ("scope_id", ctypes.c_uint32)]


class _Ifaddrs(ctypes.Structure):
    pass


_Ifaddrs._fields_ = [("next", ctypes.POINTER(_Ifaddrs)), ("name", ctypes.c_char_p), ("flags", ctypes.c_uint),
                     ("addr", ctypes.POINTER(_Sockaddr)), ("netmask", ctypes.POINTER(_Sockaddr)),
                     ("ifu", ctypes.POINTER(_Sockaddr)), ("data", ctypes.c_void_p)]


def local_addresses() -> list[tuple[str, str]]:
    """(interface, address) of every IPv4 and IPv6 address of this host's network stack
    (getifaddrs(3)); empty where it cannot be read."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return []
    head = ctypes.POINTER(_Ifaddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        return []
    found = []
    try:
        entry = head
        while entry:
            item = entry.contents
            if item.addr and item.name:
                family = item.addr.contents.family
                if family == socket.AF_INET:
                    raw = bytes(item.addr.contents.data[2:6])
                    found.append((item.name.decode(), str(ipaddress.IPv4Address(raw))))
                elif family == socket.AF_INET6:
                    raw6 = bytes(ctypes.cast(item.addr, ctypes.POINTER(_Sockaddr6)).contents.addr)
                    found.append((item.name.decode(), str(ipaddress.IPv6Address(raw6))))
            entry = item.next
    finally:
        libc.freeifaddrs(head)
    return found


def interface_holding(addresses: Iterable[str], local: Iterable[tuple[str, str]]) -> str | None:
    """The interface of `local` that holds one of `addresses` (the first in their order); a
    loopback address held by none (127.0.0.2: every 127/8 address is this host's) is the
    loopback interface's. None: no interface of this host holds them (a NAT's or a proxy's)."""
    held = [(name, ipaddress.ip_address(ip.split("%")[0])) for name, ip in local]
    wanted = [ipaddress.ip_address(a) for a in addresses]
    for want in wanted:
        for name, ip in held:
            if ip == want:
                return name
    for want in wanted:
        for name, ip in held:
            if want.is_loopback and ip.is_loopback and ip.version == want.version:
                return name
    return None


def resolve(address: str) -> list[str]:
    """The IP addresses of `address` (itself when it is one; a DNS name's answers; none when it
    does not resolve)."""
    try:
        return [str(ipaddress.ip_address(address))]
    except ValueError:
        pass
    try:
        return list(dict.fromkeys(str(info[4][0]) for info in socket.getaddrinfo(address, None)))
    except OSError:
        return []


def with_gloo_interface(env: Mapping[str, str], advertised: str | None) -> tuple[dict[str, str], str | None]:
    """`env` with GLOO_SOCKET_IFNAME set to the interface holding `advertised`, unless `env` has
    one or no interface here holds it; and the interface set (None: nothing set)."""
    out = dict(env)
    if advertised is None or out.get(GLOO_IFNAME):
        return out, None
    interface = interface_holding(resolve(advertised), local_addresses())
    if interface is not None:
        out[GLOO_IFNAME] = interface
    return out, interface


__all__ = ["GLOO_IFNAME", "interface_holding", "local_addresses", "resolve", "with_gloo_interface"]
