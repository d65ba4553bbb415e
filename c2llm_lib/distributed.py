"""Process groups for the global-batch contrastive loss (paper section 4.1): gathers with and without gradient,
agreement across ranks without pickle, and `die_with_parent` (its source runs before torch is imported).
"""

from __future__ import annotations

import json
import os
import signal
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

try:  # torch's functional all-gather with autograd; an older torch has only torch.distributed.nn's
    from torch.distributed._functional_collectives import all_gather_single_autograd
except ImportError:
    all_gather_single_autograd = None


def die_with_parent(parent: int | None = None, sig: int = signal.SIGTERM) -> None:
    """Asks Linux to send this process `sig` when its parent dies (prctl), and exits at once if `parent` is already
    gone."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, sig, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:  # the parent died before the request was made
        os._exit(1)


def world() -> tuple[int, int]:
    """(rank, world size), (0, 1) without an initialised process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


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
    return _GATHER(x.contiguous())


def functional_gather(x: torch.Tensor) -> torch.Tensor:
    return all_gather_single_autograd(x, gather_dim=0, group=dist.group.WORLD)  # (W*b, d)


def legacy_gather(x: torch.Tensor) -> torch.Tensor:
    """torch.distributed.nn's all-gather with autograd (the same gradients), for a torch without
    `all_gather_single_autograd`."""
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(x, group=dist.group.WORLD))  # (W*b, d)


# what gather_with_grad calls (a test swaps in the other to check both)
_GATHER = functional_gather if all_gather_single_autograd is not None else legacy_gather


def gather_without_grad(x: torch.Tensor) -> torch.Tensor:
    """Like accelerate.gather in the F2LLM trainer: values only, no autograd history at all."""
    if world()[1] == 1:
        return x.detach()
    parts = [torch.empty_like(x) for _ in range(world()[1])]
    dist.all_gather(parts, x.detach().contiguous())
    return torch.cat(parts)


def barrier() -> None:
    if world()[1] > 1:
        dist.barrier()


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_ranks_true(flag: torch.Tensor | bool) -> bool:
    """True when `flag` holds on every rank (a MIN all-reduce): the same answer on every rank."""
    if world()[1] == 1:
        return bool(flag)
    value = torch.as_tensor(flag).reshape(1).to(device=_collective_device(), dtype=torch.int32)  # (1,)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item())


def all_gather_json(value: Any) -> list[Any]:
    """Every rank's JSON-serialisable `value`, in rank order (sent as UTF-8 bytes: nothing is unpickled)."""
    if world()[1] == 1:
        return [value]
    device = _collective_device()
    data = torch.frombuffer(bytearray(json.dumps(value).encode()), dtype=torch.uint8).to(device)  # (n,)
    sizes = gather_without_grad(torch.tensor([data.numel()], device=device))  # (W,)
    padded = torch.zeros(int(sizes.max()), dtype=torch.uint8, device=device)  # (max n,)
    padded[: data.numel()] = data
    parts = [torch.empty_like(padded) for _ in range(world()[1])]
    dist.all_gather(parts, padded)
    return [json.loads(part[: int(n)].cpu().numpy().tobytes()) for part, n in zip(parts, sizes, strict=True)]
