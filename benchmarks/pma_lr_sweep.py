"""How fast the PMA head's attention learns at given learning rates: a sweep for the CPU default's `pma_learning_rate`
and `pma_attention_learning_rate`.

With the released numerics (score scale 1/sqrt(d) over the full width, xavier-initialised seed and projections) the
head's initial logits are tiny, so its attention starts uniform; at the backbone's learning rate (1e-4) a short run
does not move it (20 steps: entropy 3.9202 nats against 3.9208 for uniform). This sweep isolates the head: the
default's training batches (offline data, 128 rows per group, K = 1, length 192) go once through the frozen real
backbone, and a fresh head (seed 0) trains on those cached hidden states for the default's number of steps at each
pair of rates, with the default's warmup and cosine decay: `HEAD:ATTENTION` gives the seed, W_q and W_k (the
parameters of the attention logits) the second rate and W_v, W_o and the norms the first; `HEAD` alone gives the
whole head one rate. It reports the contrastive loss (mean of the last 5 steps) and the mean attention entropy on
held-out Python functions as a fraction of uniform (log T). In the real run LoRA also trains and moves the hidden
states, so this chooses the head's rates; the default run then confirms them.

Usage: python benchmarks/pma_lr_sweep.py [--steps 30] [--rates 1e-4 1e-3 3e-3 1e-3:3e-3 ...]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from c2llm_lib import C2LLMEncoder, ModelConfig
from c2llm_lib.batching import GroupedBatchSampler
from c2llm_lib.config import DataStage
from c2llm_lib.data.build import build_training_data
from c2llm_lib.data.offline import load_snapshot
from c2llm_lib.data.records import text_key
from c2llm_lib.hardware import cpu_info
from c2llm_lib.losses import contrastive_loss
from c2llm_lib.model import REAL_GGUF_BACKBONE
from c2llm_lib.model.pma import PMAHead
from c2llm_lib.train import head_groups, lr_lambda

RESULTS = Path(__file__).resolve().parent / "results"


def cached_batches(enc: C2LLMEncoder, steps: int, batch_size: int, max_length: int) -> list[tuple]:
    """(hidden (N, T, d) float32, mask (N, T), b, k) for the first `steps` global batches of the default's data."""
    rows = build_training_data(DataStage(rows_per_group=128, num_negatives=1))[0].rows
    sampler = GroupedBatchSampler(list(zip(rows["dataset"], rows["language"], strict=True)),
                                  [text_key(t) for t in rows["query"]], [text_key(t) for t in rows["positive"]],
                                  batch_size, 1, 0, 0)  # fmt: skip
    out = []
    with torch.no_grad():
        for indices in sampler:
            batch = rows[indices]
            k = min(1, *(len(n) for n in batch["negatives"]))
            queries = [enc.format_texts([q], "query", i)[0] for q, i in zip(batch["query"], batch["instruction"],
                                                                            strict=True)]  # fmt: skip
            docs = enc.format_texts(
                batch["positive"] + [n for negs in batch["negatives"] for n in negs[:k]], "document"
            )
            tokens = enc.tokenize_formatted(queries + docs, max_length)
            hidden = enc.hidden_states(**tokens).float()  # (N, T, d)
            out.append((hidden, tokens["attention_mask"], len(indices), k))
            if len(out) == steps:
                break
    return out


def held_out(enc: C2LLMEncoder, count: int = 30, max_length: int = 320) -> list[tuple]:
    functions = [r["positive"] for r in load_snapshot() if r["split"] == "test" and r["language"] == "python"
                 and r["dataset"] == "CodeSearchNetRetrieval"][:count]  # fmt: skip
    with torch.no_grad():
        return [(enc.hidden_states(**t).float(), t["attention_mask"])
                for t in (enc.tokenize([f], "document", max_length=max_length) for f in functions)]  # fmt: skip


def entropy_ratio(head: PMAHead, texts: list[tuple]) -> float:
    """Mean over texts and heads of the attention entropy divided by log T (1 = uniform)."""
    ratios = []
    with torch.no_grad():
        for hidden, mask in texts:
            _, attn = head(hidden, mask, return_attention=True)  # attn (1, H, T)
            p = attn[0].clamp_min(1e-12)
            ratios.append(float((-(p * p.log()).sum(-1)).mean() / math.log(int(mask.sum()))))
    return sum(ratios) / len(ratios)


def parse_rate(text: str) -> tuple[float, float]:
    """`HEAD` or `HEAD:ATTENTION` -> (head rate, attention rate)."""
    try:
        head, _, attention = text.partition(":")
        return float(head), float(attention or head)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a rate is HEAD or HEAD:ATTENTION (numbers), got {text!r}") from None


def train_head(batches: list[tuple], texts: list[tuple], hidden_size: int, heads: int, rates: tuple[float, float],
               warmup: int) -> dict:  # fmt: skip
    torch.manual_seed(0)
    head = PMAHead(hidden_size, None, heads)
    head.reset_parameters()
    opt = torch.optim.AdamW([g for g in head_groups(head, *rates) if g["params"]], weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(warmup, len(batches), 0.0))
    start = entropy_ratio(head, texts)
    losses = []
    for hidden, mask, b, k in batches:
        emb = head(hidden, mask)  # (N, d)
        negatives = emb[2 * b :].view(b, k, -1) if k else None
        loss = contrastive_loss(emb[:b], emb[b : 2 * b], negatives, tau=0.05)["loss"]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    tail = losses[-5:]
    return {"pma_learning_rate": rates[0], "pma_attention_learning_rate": rates[1], "loss_first": losses[0],
            "loss_last5": sum(tail) / len(tail), "entropy_vs_uniform_start": start,
            "entropy_vs_uniform_end": entropy_ratio(head, texts)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=2)
    rates = "1e-4 1e-3 2e-3 3e-3 1e-2 1e-3:2e-3 1e-3:3e-3 1e-3:5e-3 1e-3:1e-2 1e-3:3e-2"
    parser.add_argument("--rates", type=parse_rate, nargs="+", default=[parse_rate(r) for r in rates.split()])
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    started = time.perf_counter()
    enc = C2LLMEncoder.from_config(ModelConfig(backbone=REAL_GGUF_BACKBONE, device="cpu", dtype=args.dtype,
                                                 use_lora=False))  # the head trains on cached states  # fmt: skip
    batches = cached_batches(enc, args.steps, 8, 192)
    texts = held_out(enc)
    rows = [train_head(batches, texts, enc.backbone_config.hidden_size, 32, r, args.warmup) for r in args.rates]
    record = {"cpu": cpu_info(), "dtype": str(next(enc.backbone.parameters()).dtype), "steps": len(batches),
              "held_out_functions": len(texts), "seconds": time.perf_counter() - started, "rows": rows}  # fmt: skip
    (RESULTS / "pma-lr-sweep.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
