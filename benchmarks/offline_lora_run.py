"""A short LoRA run of the C2LLM recipe on the real Qwen2.5-Coder-0.5B backbone, offline, on CPU.

Trains the PMA head and LoRA adapters (paper recipe: r = 64, alpha = 32, tau = 0.05, BM25 hard
negatives) on the train split of the offline real-code dataset for a few steps, then evaluates on the
held-out split (by file) and HumanEval, against:
- the untrained backbone with mean pooling, last-token pooling, and the untrained PMA head,
- BM25 (bm25s).
It also records training throughput (real tokens/s) and peak memory. Whatever the numbers are, they
are written to results/offline-lora-<dtype>.json and .md.

Usage: python benchmarks/offline_lora_run.py [--steps 30] [--rows-per-group 128] [--eval-limit 100]
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch
from datasets import Dataset

from c2llm_lib import C2LLMEncoder, ModelConfig
from c2llm_lib.data import mine_negatives
from c2llm_lib.data.offline import load_snapshot
from c2llm_lib.eval import evaluate_bm25, evaluate_encoder, offline_tasks
from c2llm_lib.model.gguf import fetch_qwen_coder_gguf
from c2llm_lib.train import TrainConfig, Trainer


def training_rows(rows_per_group: int, k: int) -> Dataset:
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in load_snapshot():
        if row["split"] == "train":
            groups.setdefault((row["dataset"], row["language"]), []).append(row)
    records = []
    for rows in groups.values():
        rows = rows[:rows_per_group]
        negatives = mine_negatives([r["query"] for r in rows], [r["positive"] for r in rows], k=k)
        for row, negs in zip(rows, negatives, strict=True):
            records.append(
                {key: row[key] for key in ("dataset", "language", "query", "positive", "instruction")}
                | {"negatives": negs}
            )
    return Dataset.from_list(records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--global-batch-size", type=int, default=8)
    parser.add_argument("--negatives", type=int, default=1)
    parser.add_argument("--rows-per-group", type=int, default=128)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--eval-limit", type=int, default=100)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    args = parser.parse_args()

    path = fetch_qwen_coder_gguf()
    base = dict(backbone=str(path.parent), gguf_file=path.name, dtype=args.dtype, max_length=args.max_length)
    tasks = offline_tasks(limit=args.eval_limit)
    results: dict = {
        "args": vars(args),
        "tasks": {t.name: {"queries": len(t.queries), "documents": len(t.corpus)} for t in tasks},
        "scores": {},
    }

    def evaluate(name, encode):
        start = time.perf_counter()
        results["scores"][name] = {t.name: evaluate_encoder(encode, t)["ndcg_at_10"] for t in tasks}
        results.setdefault("eval_seconds", {})[name] = time.perf_counter() - start
        print(name, results["scores"][name], flush=True)

    results["scores"]["BM25"] = {t.name: evaluate_bm25(t)["ndcg_at_10"] for t in tasks}
    print("BM25", results["scores"]["BM25"], flush=True)
    for pooling in ("mean", "last_token"):
        enc = C2LLMEncoder.from_config(ModelConfig(**base, pooling=pooling))
        evaluate(f"untrained {pooling}", enc.encode)
        del enc

    torch.manual_seed(0)
    enc = C2LLMEncoder.from_config(ModelConfig(**base, pooling="pma", use_lora=True))
    evaluate("untrained PMA (random head)", enc.encode)
    rows = training_rows(args.rows_per_group, args.negatives)
    cfg = TrainConfig(
        max_steps=args.steps,
        global_batch_size=args.global_batch_size,
        num_negatives=args.negatives,
        learning_rate=args.learning_rate,
        warmup_steps=max(1, args.steps // 10),
        max_length=args.max_length,
    )
    trainer = Trainer(enc, rows, cfg)
    result = trainer.train()
    results["training"] = {
        "rows": len(rows),
        "steps": result.steps,
        "seconds": result.seconds,
        "real_tokens": sum(m["tokens"] for m in result.metrics),
        "tokens_per_s": sum(m["tokens"] for m in result.metrics) / result.seconds,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "first_loss": result.metrics[0]["loss"],
        "last_losses": [m["loss"] for m in result.metrics[-5:]],
        "trainable_parameters": sum(p.numel() for p in enc.parameters() if p.requires_grad),
    }
    print(results["training"], flush=True)
    evaluate(f"C2LLM recipe, {result.steps} LoRA steps (PMA)", enc.encode)

    names = list(results["scores"])
    task_names = [t.name for t in tasks]
    for name in names:
        scores = results["scores"][name]
        scores["mean"] = sum(scores[t] for t in task_names) / len(task_names)
    header = "| model | " + " | ".join(task_names) + " | mean |\n|---|" + "---|" * (len(task_names) + 1) + "\n"
    body = "".join(
        f"| {n} | " + " | ".join(f"{100 * results['scores'][n][t]:.1f}" for t in [*task_names, "mean"]) + " |\n"
        for n in names
    )
    tr = results["training"]
    md = (
        f"# Short LoRA run on the real Qwen2.5-Coder-0.5B (CPU, {args.dtype})\n\n"
        f"nDCG@10 x 100 on held-out tasks (at most {args.eval_limit} queries each; every held-out positive in the "
        f"corpus).\n\n{header}{body}\n"
        f"Training: {tr['steps']} steps, global batch {args.global_batch_size}, K = {args.negatives}, max length "
        f"{args.max_length}, {tr['rows']} training rows; {tr['tokens_per_s']:.0f} real tokens/s, peak RSS "
        f"{tr['peak_rss_gb']:.1f} GB, loss {tr['first_loss']:.3f} -> {tr['last_losses'][-1]:.3f}.\n\n"
        f"Reproduce: `python benchmarks/offline_lora_run.py --steps {args.steps} --eval-limit {args.eval_limit} "
        f"--max-length {args.max_length} --dtype {args.dtype}`\n"
    )
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"offline-lora-{args.dtype}.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / f"offline-lora-{args.dtype}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
