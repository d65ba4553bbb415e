"""Scoring a large corpus: chunked top-k throughput and memory at 100k, 300k and 1M documents.

A CodeSearchNet corpus has about 1M documents. `eval.scoring.chunked_topk` scores it in chunks and keeps a
running top-k, so the memory beyond the embeddings themselves should not grow with the corpus. Each
size runs in a fresh process on random unit vectors (d = 896, the 0.5B model's width; 1,000 queries,
k = 10), and reports documents scored per second and peak RSS minus the embeddings' bytes. (Encoding
throughput is measured by encode_bench.py.)

Usage: python benchmarks/score_bench.py   (writes results/score-cpu.json and .md beside this file)
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

SIZES = (100_000, 300_000, 1_000_000)
DIM, QUERIES, K, CHUNK = 896, 1_000, 10, 65_536


def child(n: int) -> None:
    import numpy as np

    from c2llm_lib.eval.scoring import chunked_topk

    rng = np.random.default_rng(0)
    corpus = np.empty((n, DIM), dtype=np.float32)
    for start in range(0, n, 100_000):  # filled in blocks: no temporary larger than a block
        block = rng.standard_normal((min(100_000, n - start), DIM), dtype=np.float32)
        corpus[start : start + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    queries = rng.standard_normal((QUERIES, DIM), dtype=np.float32)
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    _, top = chunked_topk(queries, corpus, K, chunk=CHUNK)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"documents": n, "seconds": seconds, "documents_per_s": n / seconds,
                      "embeddings_mb": corpus.nbytes / 2**20, "peak_rss_mb": peak,
                      "peak_beyond_embeddings_mb": peak - corpus.nbytes / 2**20,
                      "growth_during_scoring_mb": peak - baseline, "top_shape": list(top.shape)}))  # fmt: skip


def main() -> None:
    rows = []
    for n in SIZES:
        out = subprocess.run([sys.executable, __file__, "--child", str(n)], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    results = {"dim": DIM, "queries": QUERIES, "k": K, "chunk": CHUNK, "sizes": rows}
    out_dir = Path(__file__).resolve().parent / "results"
    (out_dir / "score-cpu.json").write_text(json.dumps(results, indent=2) + "\n")
    table = "\n".join(
        f"| {r['documents']:,} | {r['documents_per_s']:,.0f} | {r['embeddings_mb']:,.0f} MB | "
        f"{r['growth_during_scoring_mb']:,.0f} MB |"
        for r in rows
    )
    md = (
        f"# Chunked top-k scoring (CPU, d = {DIM}, {QUERIES} queries, k = {K}, chunk {CHUNK})\n\n"
        "| corpus | documents scored / s | embeddings | memory added while scoring |\n|---|---|---|---|\n"
        f"{table}\n\nReproduce: `python benchmarks/score_bench.py`\n"
    )
    (out_dir / "score-cpu.md").write_text(md)
    print(md)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(int(sys.argv[2]))
    else:
        main()
