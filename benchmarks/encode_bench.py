"""Encoder benchmark: throughput, PMA overhead, length-sorted batching, and the cost of an LM head.

Measures, in one run, on the real Qwen2.5-Coder-0.5B backbone (the pinned GGUF from PyPI) or the
tiny random one, on real code (functions of Python's standard library, a realistic length mix):

1. encode throughput (real tokens per second) of `C2LLMEncoder.encode` with the PMA head;
2. PMA overhead against last-token pooling: the pooler alone on cached hidden states (relative to
   the backbone's time), and end to end on identical token batches (goal: <= 3 %);
3. length-sorted against unsorted batching, same texts and batch size (goal: >= 1.5x);
4. the base model against also computing the tied LM head over every position, as the released
   remote code does (it runs *ForCausalLM and discards the logits).

Writes `results/encode-<device>-<dtype>-<backbone>.json` and `.md` beside this file (or in `--out`) and prints
the table. `--backbone random-0.5b` measures random weights of the 0.5B's architecture (no download: what a GPU
machine without the hub can measure, `make gpu-check`), and `--text-tokens N` replaces the real code by texts of N
tokens each (every text at the evaluation length: the paper's "PMA costs nothing" at 2,048 tokens).
Usage: python benchmarks/encode_bench.py [--backbone real|tiny|random-0.5b] [--dtype bfloat16|float32]
       [--text-tokens N] [--out DIR]
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import platform
import random
import statistics
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import torch

from c2llm_lib import C2LLMEncoder, ModelConfig, __version__
from c2llm_lib.batching import length_batches
from c2llm_lib.model import TINY_BACKBONE, LastTokenPooler
from c2llm_lib.model.gguf import fetch_qwen_coder_gguf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tools/ is not installed
from tools.preflight.probe import build_encoder, full_length_texts
from tools.scale import QWEN25_CODER_05B

REAL_NAME = "Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M, de-quantised)"
MODULES = (
    "argparse",
    "ast",
    "csv",
    "difflib",
    "email.utils",
    "inspect",
    "json.encoder",
    "shutil",
    "statistics",
    "textwrap",
    "tokenize",
    "urllib.parse",
    "zipfile",
    "calendar",
    "fractions",
)


def stdlib_functions(n: int, seed: int = 0) -> list[str]:
    """Source of `n` standard-library functions and methods, in a fixed shuffled order."""
    found = []
    for name in MODULES:
        module = importlib.import_module(name)
        source = inspect.getsource(module)
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append(textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno])))
    found = sorted(set(found))
    random.Random(seed).shuffle(found)
    return found[:n]


def timed(fn, repeats: int, warmup: bool = True) -> float:
    """Median wall time of `fn()` over `repeats` runs, after one warm-up run unless told otherwise."""
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", choices=["real", "tiny", "random-0.5b"], default="real")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--texts", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    parser.add_argument("--text-tokens", type=int, default=0, help="texts of this many tokens (0: real code)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    if args.backbone == "real":
        path = fetch_qwen_coder_gguf()
        cfg = ModelConfig(backbone=str(path.parent), gguf_file=path.name, dtype=args.dtype, max_length=args.max_length,
                          use_lora=False)  # fmt: skip
        enc = C2LLMEncoder.from_config(cfg).eval()
    elif args.backbone == "random-0.5b":  # the preflight's random weights of a known architecture (no hub)
        cfg = ModelConfig(backbone=QWEN25_CODER_05B.name, dtype=args.dtype, max_length=args.max_length, use_lora=False)
        enc = build_encoder(cfg, QWEN25_CODER_05B).eval()
    else:
        cfg = ModelConfig(backbone=TINY_BACKBONE, dtype=args.dtype, max_length=args.max_length, use_lora=False)
        enc = C2LLMEncoder.from_config(cfg).eval()
    if args.text_tokens:
        texts = full_length_texts(enc.tokenizer, args.texts, args.text_tokens, seed=0)
    else:
        texts = stdlib_functions(args.texts)
    kw = dict(kind="document", batch_size=args.batch_size, show_progress=False)

    # the token batches encode() builds when sorting by length: grouped by token length (batching.length_batches)
    groups = length_batches(enc.token_lengths(enc.format_texts(texts, "document")), args.batch_size)
    batches = [enc.tokenize([texts[i] for i in group], "document") for group in groups]
    lengths = [int(n) for b in batches for n in b["attention_mask"].sum(1)]
    real_tokens = sum(lengths)
    padded_sorted = sum(b["input_ids"].numel() for b in batches)
    unsorted_batches = [
        enc.tokenize(texts[s : s + args.batch_size], "document") for s in range(0, len(texts), args.batch_size)
    ]
    padded_unsorted = sum(b["input_ids"].numel() for b in unsorted_batches)

    results: dict = {}
    with torch.inference_mode():
        t_sorted = timed(lambda: enc.encode(texts, sort_by_length=True, **kw), args.repeats)
        t_unsorted = timed(lambda: enc.encode(texts, sort_by_length=False, **kw), args.repeats)

        hidden = [enc.hidden_states(**b) for b in batches]
        pma, last = enc.pooler, LastTokenPooler()

        def pool_all(pooler):
            for h, b in zip(hidden, batches, strict=True):
                pooler(h, b["attention_mask"])

        def backbone_only():
            for b in batches:
                enc.hidden_states(**b)

        def forward_with(pooler):
            enc.pooler = pooler
            try:
                for b in batches:
                    enc(**b)
            finally:
                enc.pooler = pma

        t_pool_pma = timed(lambda: pool_all(pma), args.repeats)
        t_pool_last = timed(lambda: pool_all(last), args.repeats)
        t_backbone = timed(backbone_only, args.repeats)
        e2e_pma, e2e_last = [], []
        for _ in range(args.repeats):  # interleaved, so that drift hits both alike (all warm by now)
            e2e_pma.append(timed(lambda: forward_with(pma), 1, warmup=False))
            e2e_last.append(timed(lambda: forward_with(last), 1, warmup=False))
        t_e2e_pma, t_e2e_last = statistics.median(e2e_pma), statistics.median(e2e_last)

        lm_head = enc.base_model.get_input_embeddings().weight  # tied LM head (vocab, d_LLM)

        def backbone_and_lm_head():
            for b in batches:
                h = enc.hidden_states(**b)  # (B, T, d_LLM)
                (h @ lm_head.T).float().sum()  # (B, T, vocab) logits, computed and thrown away

        t_lm = timed(backbone_and_lm_head, args.repeats)

    names = {"real": REAL_NAME, "random-0.5b": f"random weights of {QWEN25_CODER_05B.name}", "tiny": TINY_BACKBONE}
    results = {
        "backbone": names[args.backbone],
        "gpu": torch.cuda.get_device_name(enc.device) if enc.device.type == "cuda" else None,
        "text_tokens": args.text_tokens or None,
        "dtype": args.dtype,
        "device": str(enc.device),
        "cpu": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "c2llm_lib": __version__,
        "texts": len(texts),
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "real_tokens": real_tokens,
        "token_length_p10_p50_p90_max": [int(np.percentile(lengths, p)) for p in (10, 50, 90, 100)],
        "padded_tokens_sorted": padded_sorted,
        "padded_tokens_unsorted": padded_unsorted,
        "encode_tokens_per_s_sorted": real_tokens / t_sorted,
        "encode_tokens_per_s_unsorted": real_tokens / t_unsorted,
        "sorted_speedup": t_unsorted / t_sorted,
        "pooler_s_pma": t_pool_pma,
        "pooler_s_last_token": t_pool_last,
        "backbone_s": t_backbone,
        "pma_overhead_isolated": (t_pool_pma - t_pool_last) / t_backbone,
        "forward_s_pma": t_e2e_pma,
        "forward_s_last_token": t_e2e_last,
        "pma_overhead_end_to_end": (t_e2e_pma - t_e2e_last) / t_e2e_last,
        "backbone_plus_lm_head_s": t_lm,
        "lm_head_slowdown": t_lm / t_backbone,
        "repeats": args.repeats,
    }
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    stem = f"encode-{enc.device.type}-{args.dtype}-{args.backbone}"
    (out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
    rows = [
        ("encode throughput, length-sorted (real tokens/s)", f"{results['encode_tokens_per_s_sorted']:.0f}"),
        ("encode throughput, unsorted (real tokens/s)", f"{results['encode_tokens_per_s_unsorted']:.0f}"),
        ("length-sorted speedup (goal >= 1.5x)", f"{results['sorted_speedup']:.2f}x"),
        ("padded tokens computed, sorted / unsorted", f"{padded_sorted} / {padded_unsorted}"),
        (
            "PMA overhead vs last token, pooler alone / backbone (goal <= 3 %)",
            f"{100 * results['pma_overhead_isolated']:.3f} %",
        ),
        ("PMA overhead vs last token, end to end (goal <= 3 %)", f"{100 * results['pma_overhead_end_to_end']:.2f} %"),
        ("backbone + full LM head vs base model", f"{results['lm_head_slowdown']:.2f}x the time"),
    ]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    kind = f"texts of {args.text_tokens} tokens" if args.text_tokens else "standard-library functions"
    md = (
        f"# Encoder benchmark: {results['backbone']}, {args.dtype}, {results['device']} "
        f"({results['torch_threads']} threads)\n\n"
        f"{len(texts)} {kind}, {real_tokens} real tokens (p10/p50/p90/max "
        f"{results['token_length_p10_p50_p90_max']}), batch {args.batch_size}, max length {args.max_length}, "
        f"median of {args.repeats}.\n\n| measure | value |\n|---|---|\n{table}\n\n"
        f"Reproduce: `python benchmarks/encode_bench.py --backbone {args.backbone} --dtype {args.dtype}"
        + (f" --text-tokens {args.text_tokens}" if args.text_tokens else "")
        + "`\n"
    )
    (out / f"{stem}.md").write_text(md)
    print(md)
    return results


if __name__ == "__main__":
    main()
