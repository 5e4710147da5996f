"""The sandbox's layout: a mount target anywhere is bound, below a read-only host folder through a
read-only tmpfs with that folder's host entries bound back, and no bind hides another."""

from __future__ import annotations

import posixpath

from hypothesis import given
from hypothesis import strategies as st

from corral.services.node_agent.process.sandbox_layout import Host, Layer, bind_args

#: The fake node's folders (and one file, one symlink).
FOLDERS = {"/", "/mnt", "/mnt/nfs", "/home", "/home/alice", "/home/alice/venv", "/srv", "/srv/ds", "/srv/ds/x",
           "/srv/out", "/opt"}
FILES = {"/home/alice/notes.txt", "/srv/ds/x/a.bin"}
LINKS = {"/home/alice/latest": "venv"}


def listdir(path: str) -> list[str]:
    return sorted(posixpath.basename(p) for p in FOLDERS | FILES | set(LINKS)
                  if p != "/" and posixpath.dirname(p) == path)


HOST = Host(exists=lambda p: p in FOLDERS | FILES, root_entries=lambda: ["/home", "/mnt", "/opt", "/srv"],
            readlink=LINKS.get, isdir=lambda p: p in FOLDERS, listdir=listdir)
BASE = [Layer(e, ("--ro-bind", e, e), "bind", e) for e in HOST.root_entries()]


def test_a_target_below_a_read_only_host_folder_gets_a_tmpfs_with_the_folders_entries() -> None:
    argv = bind_args(BASE, [("/srv/ds", "/home/alice/data", True)], HOST)
    assert argv[12:] == [
        "--tmpfs", "/home/alice", "--symlink", "venv", "/home/alice/latest",
        "--ro-bind", "/home/alice/notes.txt", "/home/alice/notes.txt",
        "--ro-bind", "/home/alice/venv", "/home/alice/venv",
        "--ro-bind", "/srv/ds", "/home/alice/data", "--remount-ro", "/home/alice"]


def test_a_target_bwrap_can_make_or_that_exists_is_bound_as_asked() -> None:
    binds = [("/srv/ds", "/data", True), ("/srv/ds", "/mnt/nfs", True), ("/srv/out", "/tmp/out", False)]
    argv = bind_args([*BASE, Layer("/tmp", ("--tmpfs", "/tmp"), "tmpfs")], binds, HOST)
    assert argv[14:] == ["--ro-bind", "/srv/ds", "/data", "--ro-bind", "/srv/ds", "/mnt/nfs",
                         "--bind", "/srv/out", "/tmp/out"]


def test_below_a_writable_mount_the_folder_is_made_in_its_host_folder() -> None:
    argv = bind_args(BASE, [("/srv/out", "/out", False), ("/srv/ds", "/out/in/ds", True)], HOST)
    assert argv[12:] == ["--bind", "/srv/out", "/out", "--ro-bind", "/srv/ds", "/out/in/ds"]


def top(table: list[tuple[str, str, str]], path: str) -> tuple[str, str, str]:
    """The mount `path` is in: the deepest above or at it, the last of equal ones."""
    found = table[0]
    for m in table:
        if (path == m[0] or path.startswith(m[0].rstrip("/") + "/")) and len(m[0]) >= len(found[0]):
            found = m
    return found


def simulate(argv: list[str]) -> tuple[list[tuple[str, str, str]], list[str]]:
    """bwrap's mount table after `argv` ((target, kind, source), topmost last), and each mkdir that
    would fail (below a read-only bind where the host has no such folder)."""
    table: list[tuple[str, str, str]] = [("/", "tmpfs", "")]
    failed: list[str] = []
    i = 0
    while i < len(argv):
        op = argv[i]
        if op == "--remount-ro":
            i += 2
            continue
        if op == "--tmpfs":
            target, source = argv[i + 1], ""
            i += 2
        else:
            source, target = argv[i + 1], argv[i + 2]
            i += 3
        cover = top(table, target)
        if cover[1] == "--ro-bind" and cover[0] != target:
            parent = posixpath.dirname(cover[2] + target[len(cover[0]):])
            if parent not in FOLDERS:
                failed.append(target)
        table = [m for m in table if not (m[0].startswith(target.rstrip("/") + "/"))] if op == "--tmpfs" else table
        table.append((target, "tmpfs" if op == "--tmpfs" else op, source))
    return table, failed


TARGETS = st.lists(st.tuples(st.sampled_from(["/srv/ds", "/srv/out"]),
                             st.lists(st.sampled_from(["mnt", "home", "alice", "venv", "data", "x", "nfs"]),
                                      min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts)),
                             st.booleans()),
                   max_size=5, unique_by=lambda b: b[1])


@given(TARGETS)
def test_every_target_can_be_made_and_no_bind_hides_another(binds: list[tuple[str, str, bool]]) -> None:
    table, failed = simulate(bind_args(BASE, binds, HOST))
    assert failed == []
    requested = {target for _, target, _ in binds}
    for source, target, read_only in binds:
        seen = top(table, target)
        if seen == (target, "tmpfs", ""):  # a read-only bind with a target made in it: its entries bound back
            assert read_only
            for name in listdir(source):
                entry = posixpath.join(target, name)
                assert entry in requested or top(table, entry)[2] in (posixpath.join(source, name), ""), entry
        else:
            assert seen == (target, "--ro-bind" if read_only else "--bind", source), (target, table)
