"""The sandbox's file tree as bwrap builds it, so that a mount target can be anywhere.

bwrap makes a bind's missing target folders with mkdir, which fails below a folder bound read-only
from the host: `/mnt/data` below the host's `/mnt`, `/home/alice/data` below a home. The layout
keeps, in bwrap's order, what each folder of the sandbox is (a host folder bound there, a tmpfs of
the sandbox's own, or something not to look into, such as a symlink) and, before a bind whose target
cannot be made, lays a tmpfs over the nearest folder that exists: that folder's host entries are
bound back into it read-only (nothing the host has there is hidden: a venv in the home, a folder
another mount needs), every earlier bind below it is bound again on top, and the tmpfs is remounted
read-only once every bind is in (a job writes only to its writable mounts). Below a writable mount
the folder is made in the mount's host folder, as Docker does. Binds go shallowest first, so a mount
inside another mount's target lands on top of it whatever the spec's order.

Pure but for `Host`, the one look at the node's disk (a parameter, so tests choose it). Stdlib only.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Host", "Layer", "bind_args"]


def _listdir(path: str) -> Sequence[str]:
    return sorted(os.listdir(path))


@dataclass(frozen=True)
class Host:
    """What the sandbox needs to know about the node's disk."""

    exists: Callable[[str], bool] = os.path.exists
    root_entries: Callable[[], Sequence[str]] = lambda: sorted(f"/{e}" for e in os.listdir("/"))
    readlink: Callable[[str], str | None] = lambda p: os.readlink(p) if os.path.islink(p) else None
    isdir: Callable[[str], bool] = lambda p: os.path.isdir(p) and not os.path.islink(p)
    listdir: Callable[[str], Sequence[str]] = _listdir  # OSError when it cannot be read


@dataclass(frozen=True)
class Layer:
    """One bwrap operation on the sandbox's tree: `kind` is `bind` (`source`, the host folder seen at
    `target`), `tmpfs` (the sandbox's own: bwrap can make folders in it) or `other` (a symlink, /proc,
    a device: never looked into)."""

    target: str
    args: tuple[str, ...]
    kind: str = "other"
    source: str | None = None
    writable: bool = False


def _below(path: str, folder: str) -> bool:
    """Whether `path` lies strictly below `folder`."""
    return path != folder and (folder == "/" or path.startswith(folder + "/"))


def _covering(layers: Sequence[Layer], path: str) -> Layer:
    """The layer `path` is in: the deepest target above or at it, the last of equal ones."""
    best: Layer | None = None
    for layer in layers:
        inside = layer.target == path or _below(path, layer.target)
        if inside and (best is None or len(layer.target) >= len(best.target)):
            best = layer
    assert best is not None, "the root layer covers every path"
    return best


def _folder_to_overlay(layers: Sequence[Layer], target: str, host: Host) -> tuple[str, str] | None:
    """(sandbox folder, its host folder) to lay a tmpfs over before `target` can be bound, or None
    when bwrap can make the target itself or when the layout cannot tell (a symlink on the way:
    bwrap then binds as asked, and says what failed)."""
    layer = _covering(layers, target)
    if layer.kind != "bind" or layer.writable or layer.source is None:
        return None
    here, here_host = layer.target, layer.source
    for name in target[len(layer.target):].strip("/").split("/"):
        there, there_host = posixpath.join(here, name), posixpath.join(here_host, name)
        if host.readlink(there_host) is not None:
            return None
        if not host.isdir(there_host):
            return None if host.exists(there_host) else (here, here_host)
        here, here_host = there, there_host
    return None


def _overlay(layers: list[Layer], folder: str, host_folder: str, names: Iterable[str], host: Host) -> list[Layer]:
    """The layers with a tmpfs at `folder`, its host entries bound back and what lay below it on top."""
    mirror = []
    for name in names:
        entry, entry_host = posixpath.join(folder, name), posixpath.join(host_folder, name)
        link = host.readlink(entry_host)
        mirror.append(Layer(entry, ("--symlink", link, entry)) if link is not None
                      else Layer(entry, ("--ro-bind", entry_host, entry), "bind", entry_host))
    kept = [layer for layer in layers if not _below(layer.target, folder)]
    hidden = [layer for layer in layers if _below(layer.target, folder)]
    return [*kept, Layer(folder, ("--tmpfs", folder), "tmpfs"), *mirror, *hidden]


def bind_args(base: Sequence[Layer], binds: Sequence[tuple[str, str, bool]], host: Host) -> list[str]:
    """bwrap's arguments for the `base` layers then every (host, target, read_only) bind, with the
    tmpfs overlays their targets need, each remounted read-only at the end."""
    layers = [Layer("/", (), "tmpfs"), *base]
    overlays: list[str] = []
    for source, target, read_only in sorted(binds, key=lambda b: b[1].rstrip("/").count("/")):
        found = _folder_to_overlay(layers, target, host)
        if found is not None:
            try:
                names = host.listdir(found[1])
            except OSError:  # unreadable here: bind as asked, and bwrap says what failed
                names = None
            if names is not None:
                layers = _overlay(layers, found[0], found[1], names, host)
                overlays.append(found[0])
        layers.append(Layer(target, ("--ro-bind" if read_only else "--bind", source, target), "bind", source,
                            writable=not read_only))
    argv = [arg for layer in layers for arg in layer.args]
    for folder in overlays:
        argv += ["--remount-ro", folder]
    return argv
