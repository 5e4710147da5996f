"""GPU health through NVML, as the Kubernetes device plugin and DCGM watch it.

Why: a GPU that throws a critical XID, counts double-bit ECC errors or falls off the bus fails
every job placed on it; the node itself is fine and keeps its other GPUs. The agent watches each
GPU and reports the unhealthy ones (GpuHealthChanged); placement places nothing new on them and
requeues a gang holding one from its checkpoint.

What makes a GPU unhealthy (`GpuHealth`, pure):
- an XID critical error event (`nvmlEventTypeXidCriticalError`), except the XIDs the device plugin
  treats as application errors (`APPLICATION_XIDS`: the GPU is still healthy); it stays unhealthy
  until the agent restarts (the device plugin's rule: an XID needs a person to look);
- volatile double-bit (uncorrected) ECC errors (`nvmlDeviceGetTotalEccErrors`), as DCGM's memory
  check; healthy again once the counter is back to 0 (a driver reload or GPU reset clears it);
- NVML_ERROR_GPU_IS_LOST from any call about it (it fell off the bus); healthy again once it answers.

`NvmlWatcher` runs in a thread (NVML's event wait blocks): it waits on an event set for XID and
ECC events up to `poll_seconds`, then reads each GPU's counters, and calls `on_change` with the
unhealthy GPUs whenever that set changes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("corral.node_agent.gpu_health")

#: XIDs the NVIDIA device plugin skips: application errors, the GPU is still healthy (13 graphics
#: engine exception, 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive cleanup,
#: 68 video processor exception, 109 context switch timeout).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

XID = "XID"
ECC_DOUBLE_BIT = "ECC_DOUBLE_BIT"
GPU_LOST = "GPU_LOST"
_ORDER = {GPU_LOST: 0, XID: 1, ECC_DOUBLE_BIT: 2}


@dataclass(frozen=True)
class Problem:
    """Why GPU `gpu` is unhealthy (`code`: XID, ECC_DOUBLE_BIT or GPU_LOST)."""

    gpu: int
    code: str
    message: str
    xid: int | None = None


class GpuHealth:
    """What NVML said about each GPU, folded into the unhealthy ones. Pure: no NVML, no clock."""

    def __init__(self) -> None:
        self._xid: dict[int, Problem] = {}
        self._ecc: dict[int, Problem] = {}
        self._lost: dict[int, Problem] = {}

    def xid(self, gpu: int, xid: int) -> bool:
        """A critical XID event on `gpu`; whether it made the GPU unhealthy (application XIDs do not)."""
        if xid in APPLICATION_XIDS or gpu in self._xid:
            return False
        self._xid[gpu] = Problem(gpu, XID, f"XID {xid} (a critical error; the GPU needs a reset or a look)", xid)
        return True

    def ecc(self, gpu: int, volatile_double_bit: int) -> None:
        if volatile_double_bit > 0:
            self._ecc[gpu] = Problem(gpu, ECC_DOUBLE_BIT, f"{volatile_double_bit} volatile double-bit ECC "
                                     "error(s) (uncorrectable memory errors)")
        else:
            self._ecc.pop(gpu, None)

    def lost(self, gpu: int, is_lost: bool) -> None:
        if is_lost:
            self._lost[gpu] = Problem(gpu, GPU_LOST, "fell off the bus (NVML: GPU is lost)")
        else:
            self._lost.pop(gpu, None)

    def unhealthy(self) -> tuple[Problem, ...]:
        """One problem per unhealthy GPU (the gravest: lost, then XID, then ECC), by GPU index."""
        worst: dict[int, Problem] = {}
        for p in (*self._lost.values(), *self._xid.values(), *self._ecc.values()):
            if p.gpu not in worst or _ORDER[p.code] < _ORDER[worst[p.gpu].code]:
                worst[p.gpu] = p
        return tuple(worst[g] for g in sorted(worst))


class NvmlWatcher:
    """Watches a node's GPUs through NVML (pynvml's API, `nvml`) in a thread of its own."""

    def __init__(self, on_change: Callable[[tuple[Problem, ...]], None], *, poll_seconds: float = 1.0,
                 nvml: Any = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self.nvml = nvml
        self.on_change = on_change
        self.poll_seconds = poll_seconds
        self.health = GpuHealth()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._said: tuple[Problem, ...] = ()
        self._count = 0
        self._uuids: dict[str, int] = {}  # GPU UUID -> index
        self._event_set: Any = None

    def start(self) -> None:
        """Initialize NVML, register for the GPUs' events (those from now on are seen) and start
        watching; raises what NVML raises when it cannot start."""
        nvml = self.nvml
        nvml.nvmlInit()
        try:
            self._count = int(nvml.nvmlDeviceGetCount())
            self._event_set = nvml.nvmlEventSetCreate()
            wanted = int(nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError)
            for i in range(self._count):
                try:
                    handle = nvml.nvmlDeviceGetHandleByIndex(i)
                    self._uuids[_text(nvml.nvmlDeviceGetUUID(handle))] = i
                    supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
                    nvml.nvmlDeviceRegisterEvents(handle, wanted & supported, self._event_set)
                except nvml.NVMLError as exc:
                    log.warning("GPU %d: cannot watch its events (%s); its counters are still read", i, exc)
        except BaseException:
            self._close()
            raise
        self._thread = threading.Thread(target=self._run, name="gpu-health", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _lost_code(self) -> int:
        return int(getattr(self.nvml, "NVML_ERROR_GPU_IS_LOST", 15))

    def _close(self) -> None:
        if self._event_set is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()

    def _run(self) -> None:
        try:
            self._poll(self._count)
            while not self._stop.is_set():
                self._wait(self._event_set, self._uuids)
                self._poll(self._count)
        except Exception:
            log.exception("GPU health watching stopped")
        finally:
            self._close()

    def _wait(self, event_set: Any, uuids: dict[str, int]) -> None:
        """Take the events of one wait (up to `poll_seconds`); a lost GPU is found by `_poll`."""
        nvml = self.nvml
        try:
            data = nvml.nvmlEventSetWait(event_set, int(self.poll_seconds * 1000))
        except nvml.NVMLError as exc:
            if exc.value == getattr(nvml, "NVML_ERROR_TIMEOUT", 10):
                return
            if exc.value != self._lost_code():  # a lost GPU makes every wait fail at once: `_poll` finds it
                log.warning("waiting for GPU events: %s", exc)
            self._poll(self._count)  # said now, then not a busy loop while the error lasts
            self._stop.wait(self.poll_seconds)
            return
        if int(data.eventType) != int(nvml.nvmlEventTypeXidCriticalError):
            return  # ECC events: the counters, read by `_poll`, say it
        try:
            gpu = uuids.get(_text(nvml.nvmlDeviceGetUUID(data.device)))
        except nvml.NVMLError:
            gpu = None
        xid = int(data.eventData)
        if gpu is None:
            log.warning("XID %d on a GPU this agent does not know; ignored", xid)
        elif self.health.xid(gpu, xid):
            log.warning("GPU %d: XID %d, a critical error: unhealthy", gpu, xid)
        else:
            log.info("GPU %d: XID %d (an application error, or already unhealthy)", gpu, xid)

    def _poll(self, count: int) -> None:
        nvml = self.nvml
        for i in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                dbe: int | None = int(nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC))
            except nvml.NVMLError as exc:
                if exc.value == self._lost_code():
                    self.health.lost(i, True)
                    continue
                dbe = None  # ECC not supported or not enabled (consumer GPUs): nothing to count
            self.health.lost(i, False)
            if dbe is not None:
                self.health.ecc(i, dbe)
        now = self.health.unhealthy()
        if now != self._said:
            self._said = now
            self.on_change(now)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
