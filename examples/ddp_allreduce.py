"""A real torch.distributed job for Corral: data-parallel linear regression with gloo on CPU.

Why it exists: it proves, with a real collective library, what a Corral workload has to do.
  * initialise from the environment the node agent sets (MASTER_ADDR/PORT, RANK, WORLD_SIZE);
  * all-reduce gradients every step (a dead peer would make everyone hang, hence gang scheduling);
  * on the checkpoint signal (SIGUSR1 by default), agree on a step across all ranks, let rank 0
    save the model and step into CORRAL_CHECKPOINT_DIR, report it, and exit with the checkpointed
    code (85) after a barrier;
  * on start, resume from CORRAL_RESUME_FROM so the step counter continues instead of restarting.

Run standalone (one process): `MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 RANK=0 WORLD_SIZE=1
python examples/ddp_allreduce.py --steps 20`. Steps and pace also come from DDP_STEPS and
DDP_STEP_SECONDS, so a job spec can set them through `env`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from corral import worker

FEATURES = 4
SAMPLES_PER_RANK = 64


def _data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each rank's shard of y = X @ w + b + noise (fixed seeds: the run is reproducible)."""
    true_w = torch.arange(1.0, FEATURES + 1.0).unsqueeze(1)
    gen = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(SAMPLES_PER_RANK, FEATURES, generator=gen)
    y = x @ true_w + 0.5 + 0.01 * torch.randn(SAMPLES_PER_RANK, 1, generator=gen)
    return x, y


def _average_gradients(model: torch.nn.Module, world_size: int) -> None:
    for param in model.parameters():
        assert param.grad is not None
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
        param.grad /= world_size


def _anyone_asked_to_checkpoint() -> bool:
    """The signal reaches ranks at slightly different times: agree, so all stop at the same step."""
    flag = torch.tensor([1 if worker.checkpoint_requested() else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _save(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> Path:
    # The attempt in the name: an earlier attempt on a host cut off from the cluster may still be
    # writing into the same (shared) folder, and must never overwrite this one's files.
    attempt = os.environ.get(worker.ENV_ATTEMPT, "0")
    path = worker.checkpoint_dir() / f"ddp-attempt{attempt}-step{step}.pt"
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp)
    os.replace(tmp, path)  # atomic: a kill mid-save never leaves a torn checkpoint
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=int(os.environ.get("DDP_STEPS", "50")))
    parser.add_argument("--step-seconds", type=float,
                        default=float(os.environ.get("DDP_STEP_SECONDS", "0.1")))
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args(argv)

    worker.install()
    dist.init_process_group("gloo", init_method="env://")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # Where this rank met the others (MASTER_ADDR is rank 0's node's address; see the README).
    print(f"rank {rank} of {world_size} on node {os.environ.get('NODE_RANK', '0')}: rendezvous "
          f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
    torch.manual_seed(0)  # identical initial weights on every rank
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    step = 0
    resume = worker.resume_path()
    if resume is not None:
        state = torch.load(resume, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
        print(f"rank {rank} resumed from {resume} at step {step}", flush=True)
    x, y = _data(rank)

    while step < args.steps:
        if _anyone_asked_to_checkpoint():
            if rank == 0:
                path = _save(model, optimizer, step)
                worker.report_checkpoint(path, step)
                print(f"rank {rank} checkpointed step {step} to {path}", flush=True)
            dist.barrier()  # nobody leaves before the checkpoint is on disk
            dist.destroy_process_group()
            worker.exit_checkpointed()
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        _average_gradients(model, world_size)
        optimizer.step()
        step += 1
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(args.step_seconds)

    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
