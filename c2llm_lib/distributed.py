"""Process-group helpers for the global-batch contrastive loss (paper section 4.1).

The paper synchronises in-batch negatives across all processes. `gather_with_grad` uses torch's
functional all-gather, whose backward reduce-scatters gradients with a sum, so each rank's passages
get the gradient of every rank's queries (torch 2.13 deprecates torch.distributed.nn.functional's
all_gather). `gather_without_grad` reproduces accelerate.gather as the F2LLM trainer uses it: values
only, no autograd history. `init_distributed` starts the process group torchrun describes in the
environment (NCCL on CUDA, gloo on CPU).
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def world() -> tuple[int, int]:
    """(rank, world size), (0, 1) without an initialised process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main() -> bool:
    return world()[0] == 0


def init_distributed(timeout_s: int = 1800) -> tuple[int, int]:
    """Initialises the process group from torchrun's RANK/WORLD_SIZE (no-op in a single process)."""
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1 or dist.is_initialized():
        return world()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return world()


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """(b, d) on each rank -> (W*b, d), rank order; gradients flow back to every rank's slice."""
    if world()[1] == 1:
        return x
    from torch.distributed._functional_collectives import all_gather_single_autograd

    return all_gather_single_autograd(x.contiguous(), gather_dim=0, group=dist.group.WORLD)


def gather_without_grad(x: torch.Tensor) -> torch.Tensor:
    """Like accelerate.gather in the F2LLM trainer: values only, no autograd history at all."""
    if world()[1] == 1:
        return x.detach()
    parts = [torch.empty_like(x) for _ in range(world()[1])]
    dist.all_gather(parts, x.detach().contiguous())
    return torch.cat(parts)
