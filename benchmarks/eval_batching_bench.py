"""Evaluation batching benchmark: the held-out evaluation's texts grouped by token length against fixed batches.

Notebook 04 encodes the default's held-out tasks (`--limit` queries per task, `--max-documents` documents, each text
cut at `--max-length`) twice: the run's merged model and the untrained backbone (one pass for both baselines), in the
run's dtype (with bf16, the merge is the bf16 base plus the exact update as float32 low-rank factors; with float32,
the dense merge). The stand-in timed here is the bare backbone with a fresh PMA head: the low-rank factors of a bf16
merge add their own matmuls on top. Before, `C2LLMEncoder.encode` and the shared
baseline pass ran fixed batches of `--batch-size` texts sorted by characters; now they group texts by token length
(`batching.length_batches`, at most `--batch-size` per forward). This measures:

1. over every text of the evaluation (tokenizer only, exact): real tokens, computed token slots (rows x longest,
   padding included) and forwards, both ways;
2. on one task's calls (`--task`: its queries, then its documents), with the real backbone: the wall time both
   ways (median of `--repeats`, interleaved, after a warm-up), the real tokens/s, and the inference MFU: forward
   FLOPs of the real tokens (train_bench.text_flops) over the GEMM peak measured in the same run
   (`hardware.gemm_gflops`, before and after);
3. from that task's seconds per computed slot, notebook 04's two encoder passes over the whole evaluation (an
   approximation: it scales by slots alone, not by forwards or by attention's square; the baselines' pass reads one
   more token per text, the EOS, and the evaluation's cache skips texts two tasks share), and their lower bound: the
   forward FLOPs of every real token at 100 % of the GEMM peak, with no padding at all.

Writes `results/eval-batching-<dtype><tag>.json` and `.md` beside this file and prints the table.
Usage: python benchmarks/eval_batching_bench.py [--dtype float32|bfloat16] [--task HumanEval] [--tag -avx2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from train_bench import flop_counts, text_flops

from c2llm_lib import C2LLMEncoder, ModelConfig, __version__
from c2llm_lib.batching import length_batches
from c2llm_lib.eval import corpus_text, offline_tasks
from c2llm_lib.eval.tasks import task_prompts
from c2llm_lib.hardware import cpu_info, gemm_gflops
from c2llm_lib.model import REAL_GGUF_BACKBONE


def evaluation_calls(encoder, limit: int, max_documents: int) -> dict[str, list[str]]:
    """{"<task> queries" | "<task> documents": formatted texts}: what notebook 04 hands `encode` in one call each."""
    calls = {}
    for task in offline_tasks(limit=limit, max_documents=max_documents):
        query, document = task_prompts(encoder.config, task.name)
        calls[f"{task.name} queries"] = encoder.format_texts(list(task.queries.values()), "query", query)
        calls[f"{task.name} documents"] = encoder.format_texts(
            [corpus_text(t) for t in task.corpus.values()], "document", document
        )
    return calls


WAYS = ("before", "after")


def char_sorted_batches(texts: list[str], batch_size: int) -> list[list[int]]:
    """What encode did before: the texts sorted by characters (longest first, stable), in fixed batches."""
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]


def slots(lengths: list[int], batches: list[list[int]]) -> int:
    return sum(len(b) * max(lengths[i] for i in b) for b in batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--limit", type=int, default=40, help="queries per task (eval_limit)")
    parser.add_argument("--max-documents", type=int, default=500, help="eval_max_documents")
    parser.add_argument("--max-length", type=int, default=512, help="eval_max_length")
    parser.add_argument("--batch-size", type=int, default=16, help="eval_batch_size")
    parser.add_argument("--task", default="HumanEval", help="the task whose encoding is timed")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tag", default="", help="added to the result file's name")
    args = parser.parse_args()

    info = cpu_info()
    dtype = getattr(torch, args.dtype)
    config = ModelConfig(backbone=REAL_GGUF_BACKBONE, device="cpu", dtype=args.dtype, max_length=args.max_length,
                         use_lora=False)  # fmt: skip
    torch.manual_seed(0)
    encoder = C2LLMEncoder.from_config(config).eval()  # a fresh PMA head: a merged model costs the same per text
    calls = evaluation_calls(encoder, args.limit, args.max_documents)
    lengths = {name: encoder.token_lengths(texts, args.max_length) for name, texts in calls.items()}

    def batches(way: str, name: str) -> list[list[int]]:
        if way == "before":
            return char_sorted_batches(calls[name], args.batch_size)
        return length_batches(lengths[name], args.batch_size)

    whole = {"texts": sum(map(len, calls.values())), "real_tokens": sum(map(sum, lengths.values()))}
    for way in WAYS:
        whole[way] = {"slots": sum(slots(lengths[n], batches(way, n)) for n in calls),
                      "forwards": sum(len(batches(way, n)) for n in calls)}  # fmt: skip
        whole[way]["padding_efficiency"] = whole["real_tokens"] / whole[way]["slots"]

    timed_calls = [n for n in calls if n.rsplit(" ", 1)[0] == args.task]
    if not timed_calls:
        raise SystemExit(f"--task {args.task!r}: choose one of {sorted({n.rsplit(' ', 1)[0] for n in calls})}")
    kwargs = {"kind": "query", "batch_size": args.batch_size, "max_length": args.max_length, "show_progress": False}

    def run(way: str) -> None:  # formatted texts: as queries without an instruction, encode adds nothing to them
        for name in timed_calls:
            if way == "before":  # the char-sorted texts in fixed batches, as encode ran them
                encoder.encode([calls[name][i] for b in batches(way, name) for i in b], sort_by_length=False, **kwargs)
            else:
                encoder.encode(calls[name], **kwargs)

    gemm_before = gemm_gflops(dtype)
    encoder.encode(calls[timed_calls[0]][:4], **kwargs)  # first-call costs off the clock
    seconds: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(args.repeats):  # interleaved, so that drift hits both alike
        for way in WAYS:
            start = time.perf_counter()
            run(way)
            seconds[way].append(time.perf_counter() - start)
    gemm_after = gemm_gflops(dtype)
    peak = max(gemm_before, gemm_after)
    size = flop_counts(encoder)
    whole["forward_flops"] = sum(text_flops(size, length)["forward"] for n in calls for length in lengths[n])
    whole["two_passes_minutes_at_peak"] = 2 * whole["forward_flops"] / (peak * 1e9) / 60  # a lower bound
    task_tokens = sum(sum(lengths[n]) for n in timed_calls)
    flops = sum(text_flops(size, length)["forward"] for n in timed_calls for length in lengths[n])
    timed = {}
    for way in WAYS:
        median = statistics.median(seconds[way])
        task_slots = sum(slots(lengths[n], batches(way, n)) for n in timed_calls)
        timed[way] = {
            "seconds": median,
            "all_seconds": seconds[way],
            "slots": task_slots,
            "real_tokens_per_s": task_tokens / median,
            "inference_mfu": flops / median / (peak * 1e9),
            "two_passes_minutes": 2 * whole[way]["slots"] * median / task_slots / 60,  # extrapolated by slots
        }
    results = {
        "backbone": REAL_GGUF_BACKBONE,
        "dtype": args.dtype,
        "cpu": info,
        "torch": torch.__version__,
        "c2llm_lib": __version__,
        "settings": {k: getattr(args, k) for k in ("limit", "max_documents", "max_length", "batch_size")},
        "whole_evaluation": whole,
        "timed_task": {
            "task": args.task,
            "texts": sum(len(calls[n]) for n in timed_calls),
            "real_tokens": task_tokens,
            "forward_flops": flops,
        },  # fmt: skip
        "timed": timed,
        "speedup": timed["before"]["seconds"] / timed["after"]["seconds"],
        "gemm_gflops": {"before": gemm_before, "after": gemm_after},
    }
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    stem = f"eval-batching-{args.dtype}{args.tag}"
    (out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
    b, a = timed["before"], timed["after"]
    rows = [
        ("computed token slots, whole evaluation (one pass)", whole["before"]["slots"], whole["after"]["slots"]),
        ("padding efficiency, whole evaluation", f"{whole['before']['padding_efficiency']:.3f}",
         f"{whole['after']['padding_efficiency']:.3f}"),
        ("forwards, whole evaluation (one pass)", whole["before"]["forwards"], whole["after"]["forwards"]),
        (f"{args.task}: seconds (median of {args.repeats})", f"{b['seconds']:.1f}", f"{a['seconds']:.1f}"),
        (f"{args.task}: real tokens/s", f"{b['real_tokens_per_s']:.0f}", f"{a['real_tokens_per_s']:.0f}"),
        (f"{args.task}: inference MFU (forward FLOPs of real tokens / GEMM peak)", f"{b['inference_mfu']:.1%}",
         f"{a['inference_mfu']:.1%}"),
        ("notebook 04's two passes, whole evaluation (min, extrapolated)", f"{b['two_passes_minutes']:.1f}",
         f"{a['two_passes_minutes']:.1f}"),
        (f"the same at 100 % of the GEMM peak: {2 * whole['forward_flops'] / 1e12:.0f} TFLOP of real tokens (min)",
         "", f"{whole['two_passes_minutes_at_peak']:.1f}"),
    ]  # fmt: skip
    limits = f"; kernels limited by {info['isa_limit']}" if info["isa_limit"] else ""
    md = (
        f"# Evaluation batching: {REAL_GGUF_BACKBONE}, {args.dtype}, {info['model']} "
        f"({', '.join(info['capabilities']) or 'no avx2'}{limits}; {info['threads']} threads)\n\n"
        f"The default's held-out evaluation: {whole['texts']} texts ({args.limit} queries per task, at most "
        f"{args.max_documents} documents), {whole['real_tokens']} real tokens at max length {args.max_length}, "
        f"batch {args.batch_size}. Before: fixed batches sorted by characters; after: grouped by token length. "
        f"GEMM peak {peak:.0f} GFLOP/s ({args.dtype}, measured in the run). Speed-up on {args.task}: "
        f"{results['speedup']:.2f}x.\n\n"
        "| measure | before | after |\n|---|---|---|\n" + "".join(f"| {m} | {x} | {y} |\n" for m, x, y in rows) + "\n"
        f"Reproduce: `python benchmarks/eval_batching_bench.py --dtype {args.dtype} --task {args.task} "
        f"--repeats {args.repeats}"
        + (f" --tag={args.tag}" if args.tag else "")
        + "`"
        + (f" with `{info['isa_limit'].replace(', ', ' ')}` set" if info["isa_limit"] else "")
        + "\n"
    )
    (out / f"{stem}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
