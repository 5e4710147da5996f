"""`corral hold|release|requeue JOB`, `corral drain [--evict]|undrain NODE`, `corral gpu
drain|undrain NODE:INDEX`: an operator's request to the owning service, and its verdict.

Each function asks the read model first and raises a `CommandError` (exit 1) for a request the
log already shows cannot be acted on: an unknown job, node or GPU, or a job in a state the action
does not apply to (the states admission acts on, `corral.projection.ACTS_ON`); else it publishes the
request and returns the service's verdict within `waited` seconds, with what the job is now (its
words for a request that changed nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral.cli.commands import CommandError
from corral.client import Client
from corral.contracts import events as ev
from corral.verdicts import Verdict

if TYPE_CHECKING:
    from corral.projection import JobView


async def hold(c: Client, job: str, *, release: bool, message: str, waited: float) -> tuple[Verdict, str]:
    """Hold a pending job, or (`release`) let a held one wait again."""
    from corral.projection import ACTS_ON  # the fold: not loaded by `cancel`, which reports only its verdict

    j = await _job(c, job)
    if j.state not in ACTS_ON[ev.JobHoldReleased if release else ev.JobHeld]:
        verb = "release" if release else "hold"
        fix = ("only a held job is released" if release else
               "only a waiting job is held: a running one can be cancelled (corral cancel)")
        raise CommandError(f"cannot {verb} {job}: it is {j.state.value}; {fix}")
    verdict = await c.await_verdict(await c.hold(job, release=release, message=message), waited)
    return verdict, await job_now(c, job)


async def requeue(c: Client, job: str, *, message: str, waited: float) -> tuple[Verdict, str]:
    """Ask a starting or running job to checkpoint, stop and wait again."""
    from corral.projection import ACTS_ON

    j = await _job(c, job)
    if j.state not in ACTS_ON[ev.JobRequeueRequested]:
        raise CommandError(f"cannot requeue {job}: it is {j.state.value}; only a starting or running job is "
                           "requeued (a waiting one already waits; corral hold keeps it from starting)")
    verdict = await c.await_verdict(await c.requeue(job, message=message), waited)
    return verdict, await job_now(c, job)


async def drain(c: Client, node: str, *, undrain: bool, evict: bool, message: str, waited: float) -> Verdict:
    """No new work on `node` (`evict`: its jobs asked to move too), or (`undrain`) new work again."""
    if node not in (await c.live_view()).nodes:
        raise CommandError(f"no node {node!r} (corral nodes lists them)")
    return await c.await_verdict(await c.drain(node, undrain=undrain, evict=evict, message=message), waited)


async def drain_gpu(c: Client, node: str, gpu: int, *, undrain: bool, message: str, waited: float) -> Verdict:
    """No new work on GPU `gpu` of `node`, or (`undrain`) new work again."""
    found = (await c.live_view()).nodes.get(node)
    if found is None:
        raise CommandError(f"no node {node!r} (corral nodes lists them)")
    if gpu >= found.gpu_count:
        raise CommandError(f"node {node} has no GPU {gpu} (its GPUs: 0-{found.gpu_count - 1})")
    return await c.await_verdict(await c.drain_gpu(node, gpu, undrain=undrain, message=message), waited)


async def job_now(c: Client, job: str) -> str:
    """What a job is now, in words: what a request that changed nothing found."""
    j = await c.job(job)
    return f"the job is {j.state.value}" if j is not None else f"no job {job!r}"


async def _job(c: Client, job: str) -> JobView:
    j = await c.job(job)
    if j is None:
        raise CommandError(f"no job {job!r}")
    return j
