"""Data preparation benchmark: rows/s and peak memory at 10k vs 100k rows, and BM25 mining rows/s.

Each measurement runs in a fresh process, so its peak resident memory (ru_maxrss) is its own. Rows
are synthetic code-search pairs (deterministic, about 300 characters each) pushed through the same
path as real sources: record checks, deduplication, decontamination against 1,000 evaluation texts,
and the Arrow writer. Goal: peak memory at 100k rows <= 1.2x that at 10k.

Usage: python benchmarks/data_bench.py   (writes results/data-cpu.json and .md beside this file)
"""

from __future__ import annotations

import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

WORDS = (
    "parse read write file path json list dict sort merge split join value key index count token "
    "buffer stream open close encode decode compress filter map reduce node tree graph edge"
).split()


def synthetic(n: int, seed: int = 0):
    """n distinct (query, code) pairs in 4 (dataset, language) groups."""
    rng = random.Random(seed)
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(8)]
        name = "_".join(words[:3]) + f"_{i}"
        code = (
            f"def {name}({words[3]}, {words[4]}):\n"
            + "".join(f"    {w} = {words[(j + 1) % 8]}({w}, {i % 97})\n" for j, w in enumerate(words))
            + f"    return {words[0]}\n"
        )
        yield f"Synthetic{i % 4}", " ".join(words), code


def prepare(n: int) -> dict:
    from c2llm_lib.data import prepare_rows

    eval_texts = [f"held-out text {i}" for i in range(1000)]

    def rows(checker):
        for i, (dataset, query, code) in enumerate(synthetic(n)):
            row = checker.record(dataset, str(i), query, code, "python", "instruction")
            if row is not None:
                yield row

    start = time.perf_counter()
    prepared = prepare_rows(rows, f"bench-{n}-{time.time_ns()}", eval_texts)
    seconds = time.perf_counter() - start
    return {"rows": len(prepared.rows), "seconds": seconds, "rows_per_s": len(prepared.rows) / seconds}


def mine(n: int) -> dict:
    from c2llm_lib.data import add_hard_negatives, prepare_rows

    def rows(checker):
        for i, (dataset, query, code) in enumerate(synthetic(n, seed=1)):
            row = checker.record(dataset, str(i), query, code, "python", "instruction")
            if row is not None:
                yield row

    prepared = prepare_rows(rows, f"bench-mine-{n}-{time.time_ns()}")
    start = time.perf_counter()
    mined, short = add_hard_negatives(prepared, k=7)
    seconds = time.perf_counter() - start
    return {
        "rows": len(mined.rows),
        "seconds": seconds,
        "rows_per_s": len(mined.rows) / seconds,
        "rows_short_of_k": sum(short.values()),
    }


def child(kind: str, n: int) -> None:
    import c2llm_lib.data  # noqa: F401  (imports count towards the baseline, as in real use)

    result = prepare(n) if kind == "prepare" else mine(n)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def run(kind: str, n: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, str(n)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    results = {
        "prepare_10k": run("prepare", 10_000),
        "prepare_100k": run("prepare", 100_000),
        "mine_bm25_20k": run("mine", 20_000),
    }
    results["peak_memory_ratio_100k_vs_10k"] = (
        results["prepare_100k"]["peak_rss_mb"] / results["prepare_10k"]["peak_rss_mb"]
    )
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "data-cpu.json").write_text(json.dumps(results, indent=2) + "\n")
    p10, p100, m = results["prepare_10k"], results["prepare_100k"], results["mine_bm25_20k"]
    md = (
        "# Data preparation benchmark (CPU)\n\n| measure | value |\n|---|---|\n"
        f"| prepare 10k rows: rows/s, peak RSS | {p10['rows_per_s']:.0f}, {p10['peak_rss_mb']:.0f} MB |\n"
        f"| prepare 100k rows: rows/s, peak RSS | {p100['rows_per_s']:.0f}, {p100['peak_rss_mb']:.0f} MB |\n"
        f"| peak memory 100k / 10k (goal <= 1.2) | {results['peak_memory_ratio_100k_vs_10k']:.3f} |\n"
        f"| BM25 mining, K = 7, 20k rows in 4 groups: rows/s | {m['rows_per_s']:.0f} |\n\n"
        "Reproduce: `python benchmarks/data_bench.py`\n"
    )
    (out / "data-cpu.md").write_text(md)
    print(md)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
    else:
        main()
