"""The converted copy of the default's GGUF backbone: loading the real Qwen2.5-Coder-0.5B by converting the GGUF
(transformers' GGUF loader, then the copy is stored) against reading the stored copy, and a check that both give the
same model: every tensor, the token ids of real code, and the embeddings, bit for bit.

The copies are written into a temporary cache (`C2LLM_CACHE`), so the measured conversion is a first one; the GGUF
itself is read from the usual cache (fetched by `make setup`).
Writes `results/gguf-copy.md` beside this file (or in `--out`) and prints it.
Usage: python benchmarks/gguf_copy_bench.py [--dtype auto|bfloat16|float32] [--out DIR]
"""

from __future__ import annotations

import argparse
import ast
import inspect
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from c2llm_lib import C2LLMEncoder, ModelConfig
from c2llm_lib.hardware import cpu_info
from c2llm_lib.model import converted as copies
from c2llm_lib.model.gguf import fetch_qwen_coder_gguf


def real_code(limit: int = 300) -> list[str]:
    """Function sources of Python's standard library (a realistic mix of lengths)."""
    texts = []
    for module in (ast, inspect, argparse, tempfile):
        source = inspect.getsource(module)
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                texts.append(ast.get_source_segment(source, node))
    return texts[:limit]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    gguf = fetch_qwen_coder_gguf()
    cfg = ModelConfig(backbone=str(gguf.parent), gguf_file=gguf.name, pooling="mean", device="cpu",
                      dtype=args.dtype, use_lora=False)  # fmt: skip
    texts = real_code()
    with tempfile.TemporaryDirectory() as cache:
        os.environ["C2LLM_CACHE"] = cache
        start = time.perf_counter()
        converted = C2LLMEncoder.from_config(cfg)
        convert_s = time.perf_counter() - start
        dtype = converted.base_loaded_as
        stored = copies.converted_copy(cfg, dtype)
        size = sum(f.stat().st_size for f in stored.parent.rglob("*") if f.is_file())
        copies._file_sha256.cache_clear()  # as a new process: the GGUF's digest is taken again
        start = time.perf_counter()
        read = C2LLMEncoder.from_config(cfg)
        read_s = time.perf_counter() - start
        state, expected = read.base_model.state_dict(), converted.base_model.state_dict()
        tensors = state.keys() == expected.keys() and all(torch.equal(v, expected[k]) for k, v in state.items())
        tokens = read.tokenizer(texts)["input_ids"] == converted.tokenizer(texts)["input_ids"]
        embeddings = np.array_equal(read.encode(texts[:16]), converted.encode(texts[:16]))
    info = cpu_info()
    amx = "AMX" if any(f.startswith("amx") for f in info["capabilities"]) else "no AMX"
    flags = ", ".join(info["capabilities"]) or "none listed"
    cpu = f"{info['model']}, {info['threads']} threads, flags {flags} ({amx})"
    lines = [
        "# The converted copy of the GGUF backbone",
        "",
        f"CPU: {cpu}. Backbone: Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF, loaded in {dtype}.",
        "Reproduce: `python benchmarks/gguf_copy_bench.py`",
        "",
        "| load | seconds |",
        "|---|---|",
        f"| converting the GGUF (backbone and tokenizer), then storing the copy | {convert_s:.1f} |",
        f"| reading the stored copy (hashing the GGUF for its key and checking the copy's digest included) "
        f"| {read_s:.1f} |",
        "",
        f"Copy on disk: {size / 2**20:.0f} MiB. Same tensors: {tensors}; same token ids on {len(texts)} "
        f"standard-library sources: {tokens}; same embeddings (16 texts, bit for bit): {embeddings}.",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gguf-copy.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if not (tensors and tokens and embeddings):
        raise SystemExit("the stored copy does not give the converted model")


if __name__ == "__main__":
    main()
