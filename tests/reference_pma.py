"""A literal transcription of the released PMA head (CodeFuse-CGE `MAB_POST` + `PMA`, with the v2
change: the residual adds the projected seed). Kept deliberately close to the released code
(split/cat heads, bmm, -1e12 mask) so that our vectorised head is checked against it."""

import math

import torch
import torch.nn.functional as F


def released_pma(S, fc_q, fc_k, fc_v, fc_o, ln0, ln1, X, pad_mask, num_heads, scale_width=None):
    """S (1, 1, d); X (B, T, d_LLM); pad_mask (B, T) -> (B, 1, d)."""
    Q = S.repeat(X.size(0), 1, 1)
    dim_V = fc_q.out_features
    Q_ = fc_q(Q)
    K_, V_ = fc_k(X), fc_v(X)
    dim_split = dim_V // num_heads
    Q_ = torch.cat(Q_.split(dim_split, 2), 0)
    K_ = torch.cat(K_.split(dim_split, 2), 0)
    V_ = torch.cat(V_.split(dim_split, 2), 0)
    pad_mask = pad_mask.unsqueeze(1).repeat(num_heads, Q.size(1), 1)
    score = Q_.bmm(K_.transpose(1, 2)) / math.sqrt(scale_width or dim_V)
    score = score.masked_fill(pad_mask == 0, -1e12)
    A = torch.softmax(score, 2)
    A = A * pad_mask
    O = torch.cat(A.bmm(V_).split(Q.size(0), 0), 2)
    O = fc_q(Q) + O
    O = ln0(O)
    O = O + F.relu(fc_o(O))
    return ln1(O)


def reference_of(head, X, mask, scale_width=None):
    """Runs the transcription with the weights of our `PMAHead`: (B, d)."""
    return released_pma(
        head.seed,
        head.fc_q,
        head.fc_k,
        head.fc_v,
        head.fc_o,
        head.ln0,
        head.ln1,
        X.float(),
        mask.float(),
        head.num_heads,
        scale_width,
    ).squeeze(1)
