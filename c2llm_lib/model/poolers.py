"""Baseline poolers the paper argues against (section 3): last token (EOS) and mean over real tokens.

They share the PMA head's interface, `pooler(hidden (B, T, d_LLM), mask (B, T)) -> (B, d)`, so the
encoder, the trainer and the ablations choose one with a single parameter (`pooling`).

Both are written to be independent of the padding side: the last token is the last *real* position
of each row, wherever the padding sits. Like the PMA head they compute in float32. A row with no real
token gives the zero vector (mean) or the zeroed hidden state at position 0 (last token): finite.
The EOS token that last-token pooling needs is appended by the encoder's tokenisation, after
truncation (Qwen tokenizers never add it themselves).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from .pma import PMAHead, ScoreScale

Pooling = Literal["pma", "last_token", "mean"]
POOLINGS: tuple[str, ...] = ("pma", "last_token", "mean")


class LastTokenPooler(nn.Module):
    """The hidden state of each row's last real token (the EOS token when the encoder appends it)."""

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, T, _ = hidden.shape
        positions = torch.arange(T, device=hidden.device).expand(B, T)  # (B, T)
        last = (positions * mask.bool()).argmax(dim=1)  # (B,), index of the last real token
        return hidden[torch.arange(B, device=hidden.device), last].float()  # (B, d_LLM)


class MeanPooler(nn.Module):
    """The average hidden state over real tokens."""

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.to(dtype=torch.float32, device=hidden.device)[..., None]  # (B, T, 1)
        total = (hidden.float() * m).sum(dim=1)  # (B, d_LLM)
        return total / m.sum(dim=1).clamp(min=1.0)  # (B, d_LLM)


def build_pooler(
    pooling: Pooling,
    hidden_size: int,
    embedding_dim: int | None = None,
    pma_heads: int = 32,
    pma_score_scale: ScoreScale = "full_width",
) -> nn.Module:
    """The pooler named by `pooling`; `embedding_dim` is only meaningful for PMA (eq. 2-3 project to d)."""
    if pooling == "pma":
        return PMAHead(hidden_size, embedding_dim, pma_heads, pma_score_scale)
    if embedding_dim not in (None, hidden_size):
        raise ValueError(
            f"embedding_dim={embedding_dim} needs pooling='pma': {pooling} pooling returns the backbone's "
            f"hidden size {hidden_size} (truncate the embedding instead)"
        )
    if pooling == "last_token":
        return LastTokenPooler()
    if pooling == "mean":
        return MeanPooler()
    raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
