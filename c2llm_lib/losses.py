"""Contrastive losses (paper section 4.1): in-batch InfoNCE over the global batch plus a hard-negative term, tau = 0.05,
and jina-code-embeddings' Matryoshka loss (section 4). See docs/training.md#the-loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .distributed import gather_with_grad, gather_without_grad, world


def cosine_logits(q: torch.Tensor, d: torch.Tensor, tau: float) -> torch.Tensor:
    """q (B, dim), d (N, dim) -> (B, N) cosine similarities / tau."""
    return F.normalize(q, dim=-1) @ F.normalize(d, dim=-1).T / tau


def contrastive_loss(
    queries: torch.Tensor,
    positives: torch.Tensor,
    negatives: torch.Tensor | None = None,
    tau: float = 0.05,
    joint: bool = False,
    gather_grad: bool = True,
    weight: float = 1.0,
    negative_mask: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """queries, positives (b, dim); negatives (b, K, dim) or None; `negative_mask` (b, K), True where a slot holds one.
    `negative_mask=None`: every slot holds a negative. Returns {"in_batch", "hard_negative"} (means over local queries;
    with `joint`, "in_batch" is the joint softmax and "hard_negative" 0) and "loss" = their sum x `weight`."""
    if queries.shape != positives.shape:
        raise ValueError(f"queries {tuple(queries.shape)} and positives {tuple(positives.shape)} differ")
    if not tau > 0:
        raise ValueError(f"tau must be positive, got {tau}")
    if negatives is not None and negative_mask is not None and negative_mask.shape != negatives.shape[:2]:
        raise ValueError(
            f"negative_mask {tuple(negative_mask.shape)} does not match negatives {tuple(negatives.shape)}"
        )
    rank, _ = world()
    b = queries.shape[0]
    gather = gather_with_grad if gather_grad else gather_without_grad
    all_pos = gather(positives)  # (W*b, dim)
    labels = torch.arange(b, device=queries.device) + rank * b  # (b,) own positive in the global batch
    in_batch_logits = cosine_logits(queries, all_pos, tau)  # (b, W*b)
    zero = queries.new_zeros(())
    hard_negative = zero
    if negatives is not None and negatives.shape[1] > 0:
        hard = torch.einsum("bd,bkd->bk", F.normalize(queries, dim=-1), F.normalize(negatives, dim=-1)) / tau  # (b, K)
        if negative_mask is not None:
            hard = hard.masked_fill(~negative_mask.to(hard.device), float("-inf"))  # empty slots out of the softmax
        if joint:
            in_batch = F.cross_entropy(torch.cat([in_batch_logits, hard], dim=1), labels)  # (b, W*b + K)
            return {"loss": weight * in_batch, "in_batch": in_batch, "hard_negative": zero}
        positive = (F.normalize(queries, dim=-1) * F.normalize(positives, dim=-1)).sum(-1, keepdim=True) / tau  # (b, 1)
        candidates = torch.cat([positive, hard], dim=1)  # (b, 1+K): the positive first
        hard_negative = F.cross_entropy(candidates, torch.zeros(b, dtype=torch.long, device=queries.device))
    in_batch = F.cross_entropy(in_batch_logits, labels)
    return {"loss": weight * (in_batch + hard_negative), "in_batch": in_batch, "hard_negative": hard_negative}


def matryoshka_loss(
    queries: torch.Tensor,
    positives: torch.Tensor,
    negatives: torch.Tensor | None = None,
    dims: tuple[int, ...] = (896, 512, 256, 128, 64),
    weights: tuple[float, ...] | None = None,
    **kwargs,
) -> dict[str, torch.Tensor]:
    """The contrastive loss on the first d coordinates (re-normalised) for each d in `dims`, summed with `weights`;
    returns the weighted {"loss", "in_batch", "hard_negative"} and "loss@d" for each d."""
    weights = weights or (1.0,) * len(dims)
    if len(weights) != len(dims):
        raise ValueError(f"{len(weights)} MRL weights for {len(dims)} dimensions")
    too_wide = [d for d in dims if d > queries.shape[-1] or d < 1]
    if too_wide:
        raise ValueError(f"MRL dimensions {too_wide} do not fit an embedding of width {queries.shape[-1]}")
    out: dict[str, torch.Tensor] = {}
    total = in_batch = hard_negative = queries.new_zeros(())
    for d, w in zip(dims, weights, strict=True):
        part = contrastive_loss(queries[:, :d], positives[:, :d], None if negatives is None else negatives[..., :d],
                                **kwargs)  # fmt: skip
        out[f"loss@{d}"] = part["loss"]
        total = total + w * part["loss"]
        in_batch = in_batch + w * part["in_batch"]
        hard_negative = hard_negative + w * part["hard_negative"]
    return {"loss": total, "in_batch": in_batch, "hard_negative": hard_negative, **out}
