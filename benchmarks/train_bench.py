"""Training throughput and peak memory on CPU: the tiny random backbone, or the real 0.5B one.

Real tokens/s counts the non-padding tokens of queries, positives and K BM25 negatives per row that are
embedded with a graph (the trainer's per-step `tokens`). Run it alone on the machine: it measures time.

Usage: python benchmarks/train_bench.py [--backbone tiny|real] [--steps 30] [--negatives 7] [--grad-cache]
"""

from __future__ import annotations

import argparse
import json
import resource
from pathlib import Path

import torch
from datasets import Dataset

from c2llm_lib import C2LLMEncoder, ModelConfig
from c2llm_lib.data import mine_negatives
from c2llm_lib.data.offline import load_snapshot
from c2llm_lib.model import REAL_GGUF_BACKBONE, TINY_BACKBONE
from c2llm_lib.train import TrainConfig, Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--global-batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--grad-cache", action="store_true")
    parser.add_argument("--backbone", choices=["tiny", "real"], default="tiny")
    parser.add_argument("--negatives", type=int, default=7)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    rows = [r for r in load_snapshot() if r["split"] == "train" and r["language"] == "python"]
    rows = [r for r in rows if r["dataset"] == "CodeSearchNetRetrieval"][:512]
    negatives = mine_negatives([r["query"] for r in rows], [r["positive"] for r in rows], k=args.negatives)
    keys = ("dataset", "language", "query", "positive", "instruction")
    table = Dataset.from_list(
        [{k: r[k] for k in keys} | {"negatives": n} for r, n in zip(rows, negatives, strict=True)]
    )
    torch.manual_seed(0)
    backbone = TINY_BACKBONE if args.backbone == "tiny" else REAL_GGUF_BACKBONE
    enc = C2LLMEncoder.from_config(ModelConfig(backbone=backbone, device="cpu", dtype=args.dtype, use_lora=True))
    cfg = TrainConfig(max_steps=args.steps, global_batch_size=args.global_batch_size, max_length=args.max_length,
                      grad_cache=args.grad_cache, num_negatives=args.negatives, warmup_steps=1)  # fmt: skip
    result = Trainer(enc, table, cfg).train()
    tokens = sum(m["tokens"] for m in result.metrics)
    out = {
        "backbone": backbone, "dtype": args.dtype, "max_length": args.max_length, "steps": result.steps,
        "global_batch_size": args.global_batch_size,
        "negatives": args.negatives, "grad_cache": args.grad_cache, "seconds": result.seconds, "real_tokens": tokens,
        "tokens_per_s": tokens / result.seconds,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "threads": torch.get_num_threads(),
    }  # fmt: skip
    name = f"train-cpu-{args.backbone}-{args.dtype}{'-gradcache' if args.grad_cache else ''}.json"
    path = Path(__file__).resolve().parent / "results" / name
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
