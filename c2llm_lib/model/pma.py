"""The PMA head: Pooling by Multihead Attention (C2LLM paper, section 3, equations 1-6).

One learnable query (the seed) cross-attends over the backbone's last hidden states and becomes the
sequence embedding:

    Q = fc_q(S)                      (1)   S: (1, d), the seed
    K = fc_k(H), V = fc_v(H)         (2, 3) H: (T, d_LLM) -> (T, d)
    O = softmax(Q K^T * scale) V     (4)   per head, heads are feature slices of width d / n_heads
    O~ = LN0(O + Q)                  (5)   the residual adds the *projected* seed
    E = LN1(ReLU(fc_o(O~)) + O~)     (6)

Default numerics are those of the released codefuse-ai/C2LLM checkpoints (PMA "v2", post-LN):
biases on all four projections, xavier-uniform weights, score scale 1/sqrt(d) over the full width
(not 1/sqrt(d/heads)), padded keys masked before the softmax and the weights multiplied by the mask
again after it, no L2 normalisation. mteb's registration of C2LLM-0.5B counts 497,252,096 parameters:
the 494,032,768 of the backbone plus exactly the 3,219,328 of this head at d = d_LLM = 896.

Deliberate differences from the released code, none of which changes a result where it is finite:
- the head always computes in float32 (the backbone may run in bf16/fp16), so the mask value is
  never the -1e12 that overflows fp16; we use float32's most negative finite number;
- a row with no real token gives a defined, finite embedding: the softmax is uniform over masked
  keys, the re-mask zeroes it, and E depends on the seed alone;
- `score_scale="per_head"` (1/sqrt(d/heads), the textbook choice) exists for the ablation only.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

ScoreScale = Literal["full_width", "per_head"]


class PMAHead(nn.Module):
    """Pools (B, T, d_LLM) hidden states into (B, d) embeddings with one learned query."""

    def __init__(
        self,
        hidden_size: int,
        embedding_dim: int | None = None,
        num_heads: int = 32,
        score_scale: ScoreScale = "full_width",
    ) -> None:
        super().__init__()
        dim = embedding_dim or hidden_size
        if dim % num_heads:
            raise ValueError(
                f"PMA embedding_dim {dim} is not divisible by pma_heads {num_heads}; heads are equal feature slices"
            )
        if score_scale not in ("full_width", "per_head"):
            raise ValueError(f"PMA score_scale must be 'full_width' or 'per_head', got {score_scale!r}")
        self.hidden_size, self.dim, self.num_heads = hidden_size, dim, num_heads
        self.score_scale = score_scale
        self.seed = nn.Parameter(torch.empty(1, 1, dim))  # S: the one learned query, shaped as released
        self.fc_q = nn.Linear(dim, dim)  # W_q, eq. 1
        self.fc_k = nn.Linear(hidden_size, dim)  # W_k, eq. 2
        self.fc_v = nn.Linear(hidden_size, dim)  # W_v, eq. 3
        self.fc_o = nn.Linear(dim, dim)  # W_o, eq. 6
        self.ln0 = nn.LayerNorm(dim)  # eq. 5
        self.ln1 = nn.LayerNorm(dim)  # eq. 6
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform seed and projection weights, PyTorch's default biases (as released)."""
        nn.init.xavier_uniform_(self.seed)  # fans of a (1, 1, d) tensor, as released
        for fc in (self.fc_q, self.fc_k, self.fc_v, self.fc_o):
            nn.init.xavier_uniform_(fc.weight)
            bound = 1 / math.sqrt(fc.in_features)
            nn.init.uniform_(fc.bias, -bound, bound)
        self.ln0.reset_parameters()
        self.ln1.reset_parameters()

    def attention_parameters(self) -> list[nn.Parameter]:
        """The parameters that set the attention logits (eqs. 1-2): the seed S, W_q and W_k (S and W_q also make the
        query that eq. 5 adds back). `TrainConfig`'s `pma_attention_learning_rate` trains these apart from W_v, W_o
        and the norms, which shape what the attended tokens contribute."""
        return [self.seed, *self.fc_q.parameters(), *self.fc_k.parameters()]

    @property
    def scale(self) -> float:
        width = self.dim if self.score_scale == "full_width" else self.dim // self.num_heads
        return 1.0 / math.sqrt(width)

    def forward(
        self, hidden: torch.Tensor, mask: torch.Tensor, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """hidden (B, T, d_LLM), mask (B, T) with 1 for real tokens -> E (B, d) [, attention (B, H, T)]."""
        B, T, _ = hidden.shape
        H, dh = self.num_heads, self.dim // self.num_heads
        device_type = hidden.device.type
        with torch.autocast(device_type=device_type, enabled=False):
            x = hidden.float()  # (B, T, d_LLM), the head always runs in fp32
            keep = mask.to(device=x.device).bool()  # (B, T)
            q = self.fc_q(self.seed[0].float())  # (1, d)
            k = self.fc_k(x).view(B, T, H, dh)  # (B, T, H, dh)
            v = self.fc_v(x).view(B, T, H, dh)  # (B, T, H, dh)
            scores = torch.einsum("hd,bthd->bht", q.view(H, dh), k) * self.scale  # (B, H, T)
            scores = scores.masked_fill(~keep[:, None, :], torch.finfo(scores.dtype).min)
            attn = scores.softmax(dim=-1) * keep[:, None, :]  # (B, H, T), re-masked as released
            o = torch.einsum("bht,bthd->bhd", attn, v).reshape(B, self.dim)  # (B, d), eq. 4
            o = self.ln0(o + q)  # (B, d), eq. 5
            e = self.ln1(o + F.relu(self.fc_o(o)))  # (B, d), eq. 6
        return (e, attn) if return_attention else e
