"""Training throughput and peak memory on CPU with the tiny random backbone (the real backbone's
numbers come from offline_lora_run.py). Real tokens/s counts the non-padding tokens of queries,
positives and K = 7 BM25 negatives per row.

Usage: python benchmarks/train_bench.py [--steps 30] [--grad-cache]
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
from c2llm_lib.model import TINY_BACKBONE
from c2llm_lib.train import TrainConfig, Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--global-batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--grad-cache", action="store_true")
    args = parser.parse_args()
    rows = [r for r in load_snapshot() if r["split"] == "train" and r["language"] == "python"]
    rows = [r for r in rows if r["dataset"] == "CodeSearchNetRetrieval"][:512]
    negatives = mine_negatives([r["query"] for r in rows], [r["positive"] for r in rows], k=7)
    keys = ("dataset", "language", "query", "positive", "instruction")
    table = Dataset.from_list(
        [{k: r[k] for k in keys} | {"negatives": n} for r, n in zip(rows, negatives, strict=True)]
    )
    torch.manual_seed(0)
    enc = C2LLMEncoder.from_config(ModelConfig(backbone=TINY_BACKBONE, device="cpu", dtype="float32", use_lora=True))
    cfg = TrainConfig(max_steps=args.steps, global_batch_size=args.global_batch_size, max_length=args.max_length,
                      grad_cache=args.grad_cache)  # fmt: skip
    result = Trainer(enc, table, cfg).train()
    tokens = sum(m["tokens"] for m in result.metrics)
    out = {
        "backbone": TINY_BACKBONE, "steps": result.steps, "global_batch_size": args.global_batch_size,
        "negatives": 7, "grad_cache": args.grad_cache, "seconds": result.seconds, "real_tokens": tokens,
        "tokens_per_s": tokens / result.seconds,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "threads": torch.get_num_threads(),
    }  # fmt: skip
    path = Path(__file__).resolve().parent / "results" / f"train-cpu-tiny{'-gradcache' if args.grad_cache else ''}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
