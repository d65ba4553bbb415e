"""Evaluation benchmark: what notebook 04 spends on its encoders, before and after sharing forward passes.

Notebook 04 evaluates the run's model and two untrained baselines (mean and last-token pooling on the untrained
backbone) through `mteb.evaluate` on the offline held-out tasks. This measures, on one task (or all of them):

1. loading the baselines: each from its own backbone (before) against one backbone shared by both (`scoring.baselines`);
2. evaluating the baselines through mteb: each model encoding every text itself (before: `MTEBEncoder` without a
   cache, what `evaluate_all` did) against `evaluate_all`'s `EncodingCache`, where one backbone pass per text serves
   both poolers; wall time, sequences through the backbone, and each model's nDCG@10 both ways;
3. the throughput of that pass (real tokens/s), and from it the time a full evaluation of the offline tasks would
   take (every held-out document plus `--limit` queries per task, tokens counted at `--max-length`): the run's
   model and the baselines, 3 passes before and 2 after.

The stand-in for the run's model is the backbone with a fresh PMA head (no LoRA): a merged model costs the same per
text. Notebook 04 evaluates a merged model in float32 (merge.py keeps the LoRA update exactly) and its baselines
inherit that dtype, so `--dtype float32` is the default run's case.

Writes `results/eval-<backbone>-<dtype>.json` and `.md` beside this file and prints the table.
Usage: python benchmarks/eval_bench.py [--backbone real|tiny] [--dtype float32|bfloat16] [--task HumanEval|all]
       [--max-documents 500]  (also extrapolates a full evaluation with eval_max_documents)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from c2llm_lib import C2LLMEncoder, ModelConfig, __version__
from c2llm_lib.eval import corpus_text, offline_tasks
from c2llm_lib.eval.mteb import MTEBEncoder, evaluate_all, offline_task, run_mteb
from c2llm_lib.eval.scoring import baseline_encoder, baselines
from c2llm_lib.eval.tasks import task_prompts
from c2llm_lib.hardware import cpu_info
from c2llm_lib.model import REAL_GGUF_BACKBONE, TINY_BACKBONE

POOLINGS = ("mean", "last_token")


def count_sequences(backbone) -> list[int]:
    """A counter of the sequences (rows) that go through `backbone`, whoever calls it."""
    seen = [0]

    def hook(module, args, kwargs, out):
        seen[0] += len(kwargs["input_ids"])  # (B, T): B sequences

    backbone.register_forward_hook(hook, with_kwargs=True)
    return seen


def real_tokens(encoder, tasks, max_length: int) -> int:
    """Tokens an encoder without EOS reads for the queries and documents of `tasks`, each cut at `max_length`."""
    total = 0
    for task in tasks:
        query, document = task_prompts(encoder.config, task.name)
        texts = encoder.format_texts(list(task.queries.values()), "query", query)
        texts += encoder.format_texts([corpus_text(t) for t in task.corpus.values()], "document", document)
        total += sum(
            min(len(ids), max_length) for ids in encoder.tokenizer(texts, add_special_tokens=False)["input_ids"]
        )
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", choices=["real", "tiny"], default="real")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--task", default="HumanEval", help="an offline task name, or 'all'")
    parser.add_argument("--limit", type=int, default=40, help="queries per task (eval_limit)")
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-documents", type=int, default=None, help="eval_max_documents for the extrapolation")
    args = parser.parse_args()

    backbone = REAL_GGUF_BACKBONE if args.backbone == "real" else TINY_BACKBONE
    config = ModelConfig(backbone=backbone, device="cpu", dtype=args.dtype, max_length=args.max_length, use_lora=False)
    start = time.perf_counter()
    trained = C2LLMEncoder.from_config(config)  # the stand-in for the merged model (a PMA head)
    load_one = time.perf_counter() - start
    all_tasks = offline_tasks(limit=args.limit)
    tasks = all_tasks if args.task == "all" else [t for t in all_tasks if t.name == args.task]
    if not tasks:
        raise SystemExit(f"--task {args.task!r}: choose 'all' or one of {[t.name for t in all_tasks]}")
    settings = {"batch_size": args.batch_size, "max_length": args.max_length}
    tokens = real_tokens(trained, tasks, args.max_length)
    results: dict = {
        "backbone": backbone,
        "dtype": args.dtype,
        "cpu": cpu_info(),
        "torch": torch.__version__,
        "c2llm_lib": __version__,
        "tasks": {t.name: {"queries": len(t.queries), "documents": len(t.corpus)} for t in tasks},
        **settings,
        "real_tokens_per_pass": tokens,
        "load_model_s": load_one,
        "load_average_start": os.getloadavg()[0],  # other jobs on the machine's cores slow every number
    }

    trained.encode(["def warm_up(x):\n    return x"] * 4, kind="document")  # first-call costs off the clock
    with tempfile.TemporaryDirectory() as scratch:
        # before: two backbones, each model encoding every text itself
        start = time.perf_counter()
        separate = {p: baseline_encoder(trained, p) for p in POOLINGS}
        results["load_baselines_before_s"] = time.perf_counter() - start
        counters = [count_sequences(e.backbone) for e in separate.values()]
        start = time.perf_counter()
        before = {
            p: run_mteb(
                MTEBEncoder(e, name=f"local/before-{p}", **settings),
                [offline_task(t) for t in tasks],
                Path(scratch) / "before",
            )  # fmt: skip
            for p, e in separate.items()
        }
        results["evaluate_baselines_before_s"] = time.perf_counter() - start
        results["sequences_before"] = sum(c[0] for c in counters)
        del separate

        # after: one backbone, one pass per text for both poolers
        start = time.perf_counter()
        shared = baselines(trained, POOLINGS)
        results["load_baselines_after_s"] = time.perf_counter() - start
        counter = count_sequences(next(iter(shared.values())).backbone)
        start = time.perf_counter()
        after = evaluate_all(shared, tasks, Path(scratch) / "after", bm25=False, log=lambda *_: None, **settings)
        results["evaluate_baselines_after_s"] = time.perf_counter() - start
        results["sequences_after"] = counter[0]

    results["ndcg_at_10"] = {
        p: {"before": before[p], "after": after[label]} for p, label in zip(POOLINGS, shared, strict=True)
    }
    results["load_average_end"] = os.getloadavg()[0]
    results["tokens_per_s"] = tokens / results["evaluate_baselines_after_s"]
    full = real_tokens(trained, all_tasks, args.max_length)
    results["full_offline_real_tokens_per_pass"] = full
    results["full_offline_minutes_before"] = 3 * full / results["tokens_per_s"] / 60  # trained + 2 baselines
    results["full_offline_minutes_after"] = 2 * full / results["tokens_per_s"] / 60  # trained + 1 shared pass
    if args.max_documents:
        capped = offline_tasks(limit=args.limit, max_documents=args.max_documents)
        results["max_documents"] = args.max_documents
        results["capped_documents"] = sum(len(t.corpus) for t in capped)
        results["capped_real_tokens_per_pass"] = real_tokens(trained, capped, args.max_length)
        results["capped_minutes_after"] = 2 * results["capped_real_tokens_per_pass"] / results["tokens_per_s"] / 60

    stem = f"eval-{args.backbone}-{args.dtype}"
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
    r = results
    rows = [
        ("load the two baselines (s)", f"{r['load_baselines_before_s']:.1f}", f"{r['load_baselines_after_s']:.1f}"),
        ("evaluate the two baselines through mteb (s)", f"{r['evaluate_baselines_before_s']:.1f}",
         f"{r['evaluate_baselines_after_s']:.1f}"),
        ("sequences through the backbone", str(r["sequences_before"]), str(r["sequences_after"])),
        *[(f"nDCG@10, {p} pooling, {t}", f"{v['before'][t]:.5f}", f"{v['after'][t]:.5f}")
          for p, v in r["ndcg_at_10"].items() for t in v["before"]],
        ("full offline evaluation, 3 encoders (min, extrapolated)", f"{r['full_offline_minutes_before']:.1f}",
         f"{r['full_offline_minutes_after']:.1f}"),
    ]  # fmt: skip
    if args.max_documents:
        rows.append((f"the same with eval_max_documents {args.max_documents} ({r['capped_documents']} documents, min)",
                     "", f"{r['capped_minutes_after']:.1f}"))  # fmt: skip
    names = ", ".join(f"{n} ({s['queries']} queries, {s['documents']} documents)" for n, s in r["tasks"].items())
    md = (
        f"# Evaluation benchmark: {backbone}, {args.dtype}, {r['cpu']['model']} "
        f"({', '.join(r['cpu']['capabilities']) or 'no avx2'}; {r['cpu']['threads']} threads)\n\n"
        f"Task: {names}; max length {args.max_length}, batch {args.batch_size}; {tokens} real tokens per pass, "
        f"{r['tokens_per_s']:.0f} real tokens/s. The full offline tasks hold {full} real tokens per pass "
        f"({args.limit} queries per task, every held-out document). Load average {r['load_average_start']:.1f} at "
        f"the start, {r['load_average_end']:.1f} at the end (on {r['cpu']['threads']} threads).\n\n"
        "| measure | before | after |\n|---|---|---|\n" + "".join(f"| {a} | {b} | {c} |\n" for a, b, c in rows) + "\n"
        f"Reproduce: `python benchmarks/eval_bench.py --backbone {args.backbone} --dtype {args.dtype} "
        f"--task {args.task} --limit {args.limit} --max-length {args.max_length} --batch-size {args.batch_size}"
        + (f" --max-documents {args.max_documents}" if args.max_documents else "")
        + "`\n"
    )
    (out / f"{stem}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
