"""A fake NVML (`fakenvml.c`, built with the machine's C compiler) and the file that describes its GPUs.

Why: the node agent's NVML code (inventory, GPU health) runs through pynvml, which dlopens
`libnvidia-ml.so.1`. Built from this C source and put first on `LD_LIBRARY_PATH`, the fake answers
pynvml's real calls from a text file (`FAKE_NVML_CONFIG`) that a test rewrites while the agent runs
to inject faults: ECC errors, XID events, a GPU that falls off the bus.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path

SOURCE = Path(__file__).with_name("fakenvml.c")
LIBRARY = "libnvidia-ml.so.1"
CONFIG_ENV = "FAKE_NVML_CONFIG"


@dataclass(frozen=True)
class FakeGpu:
    """One GPU of the fake: `nvlink` lists the peer GPU index of each active link."""

    name: str = "NVIDIA H100 80GB HBM3"
    memory_mib: int = 81559
    uuid: str | None = None
    bus_id: str | None = None
    nvlink: tuple[int, ...] = ()
    nvlink_down: tuple[int, ...] = ()
    nvswitch: int | None = None
    ecc_dbe: int = 0
    ecc_sbe: int = 0
    xids: tuple[tuple[int, int], ...] = ()  # (sequence, XID): each sequence is an event delivered once
    lost: bool = False

    def with_xid(self, xid: int) -> FakeGpu:
        """This GPU with one more XID event."""
        seq = max((s for s, _ in self.xids), default=0) + 1
        return replace(self, xids=(*self.xids, (seq, xid)))


@dataclass
class FakeNvml:
    """A built fake library and one configuration file of GPUs (rewritten atomically by `write`)."""

    lib_dir: Path
    config: Path
    gpus: list[FakeGpu] = field(default_factory=list)

    def write(self, gpus: list[FakeGpu] | None = None) -> None:
        if gpus is not None:
            self.gpus = list(gpus)
        lines = []
        for i, g in enumerate(self.gpus):
            lines += ["gpu", f"name {g.name}", f"memory_mib {g.memory_mib}",
                      f"uuid {g.uuid or f'GPU-{i:08x}-fake-{self.config.stem}'}",
                      f"bus_id {g.bus_id or f'00000000:{0x18 + i:02X}:00.0'}",
                      f"ecc_dbe {g.ecc_dbe}", f"ecc_sbe {g.ecc_sbe}", f"lost {int(g.lost)}"]
            if g.nvlink:
                lines.append("nvlink " + " ".join(map(str, g.nvlink)))
            if g.nvlink_down:
                lines.append("nvlink_down " + " ".join(map(str, g.nvlink_down)))
            if g.nvswitch is not None:
                lines.append(f"nvswitch {g.nvswitch}")
            lines += [f"xid {seq} {xid}" for seq, xid in g.xids]
        tmp = self.config.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, self.config)  # the library reads a whole file or the previous one

    def change(self, index: int, **changes: object) -> None:
        """Rewrite the file with GPU `index` changed (e.g. `lost=True`, `ecc_dbe=1`)."""
        self.gpus[index] = replace(self.gpus[index], **changes)  # type: ignore[arg-type]
        self.write()

    def add_xid(self, index: int, xid: int) -> None:
        self.gpus[index] = self.gpus[index].with_xid(xid)
        self.write()

    def env(self) -> dict[str, str]:
        """The environment a process needs to load this fake through pynvml's normal search."""
        path = os.environ.get("LD_LIBRARY_PATH")
        return {"LD_LIBRARY_PATH": f"{self.lib_dir}{os.pathsep}{path}" if path else str(self.lib_dir),
                CONFIG_ENV: str(self.config)}


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build(out_dir: Path) -> Path:
    """Compile the fake into `out_dir/libnvidia-ml.so.1`; returns the folder."""
    cc = compiler()
    if cc is None:
        raise FileNotFoundError("no C compiler (cc, gcc or $CC)")
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-Wl,-soname," + LIBRARY,
                    "-o", str(out_dir / LIBRARY), str(SOURCE), "-lpthread"],
                   check=True, capture_output=True, text=True)
    return out_dir


def eight_gpus_two_domains() -> list[FakeGpu]:
    """An 8-GPU node whose GPUs 0-3 and 4-7 are two NVLink rings."""
    ring = [(1, 3), (0, 2), (1, 3), (2, 0)]  # link peers of each GPU of a 4-GPU ring
    return [FakeGpu(nvlink=tuple((i // 4) * 4 + p for p in ring[i % 4])) for i in range(8)]
