"""Trainings of the default's recipe at several seeds, compared on the unseen-library tasks of notebook 04 with 95 %
intervals over trainings and queries (the two-level bootstrap of `c2llm_lib.eval.intervals`).

Each run directory is one training (a `make run`, or `--only 01 02 03 04`, at its own seed and rates); its
`metrics/unseen_queries.json` holds every model's per-query nDCG@10 on the unseen libraries. A `--model` names a
setting and its runs; the script reports, on the tasks of `--kind` (text2code, code2code or all): each setting's mean
per run and over its runs, BM25's, each setting minus BM25, and each later setting minus the first.

    python benchmarks/unseen_seeds.py --model "LoRA 1e-4" outputs/s0/default outputs/s1/default \
        --model "LoRA 1e-3" outputs/t0/default outputs/t1/default --kind text2code [--out record.md]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from c2llm_lib.eval.intervals import MEAN, cell, task_means, training_bootstrap, training_bootstrap_mean

BASELINES = ("BM25", "untrained", "released backbone")  # notebook 04's baselines: BM25, the backbone's poolers
KINDS = {"text2code": "unseen-text2code-", "code2code": "unseen-code2code-", "all": "unseen-"}


def read_run(run: Path, kind: str) -> tuple[dict, dict]:
    """(the trained model's, BM25's) {task: {query id: nDCG@10}} of one run, on the tasks of `kind`."""
    path = run / "metrics" / "unseen_queries.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no unseen-library scores (run notebook 04 with unseen_packages)")
    try:
        scores = json.loads(path.read_text())
    except ValueError as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    if not isinstance(scores, dict) or not all(isinstance(s, dict) for s in scores.values()):
        raise ValueError(f"{path}: expected {{model: {{task: {{query id: nDCG@10}}}}}}")
    trained = [m for m in scores if not m.startswith(BASELINES)]
    if len(trained) != 1 or "BM25" not in scores:
        raise ValueError(f"{path}: expected one trained model and BM25, found {sorted(scores)}")
    if set(scores[trained[0]]) != set(scores["BM25"]):
        raise ValueError(f"{path}: {trained[0]!r} and BM25 were scored on different tasks")
    pick = {t for t in scores["BM25"] if t.startswith(KINDS[kind])}
    if not pick:
        raise ValueError(f"{path}: no task of kind {kind!r} among {sorted(scores['BM25'])}")
    return ({t: q for t, q in scores[trained[0]].items() if t in pick},
            {t: q for t, q in scores["BM25"].items() if t in pick})  # fmt: skip


def mean_of(run: dict) -> float:
    """The mean over tasks of each task's mean per-query score, x 100."""
    return 100 * float(np.mean(list(task_means(run).values())))


def compare(models: dict[str, list[Path]], kind: str) -> str:
    """The comparison as markdown: per-run and overall means, then the differences with their intervals."""
    every = [Path(r).resolve() for paths in models.values() for r in paths]
    twice = sorted({str(r) for r in every if every.count(r) > 1})
    if twice:
        raise ValueError(f"a run is given more than once (it would count as another seed): {twice}")
    runs = {label: [read_run(Path(r), kind) for r in paths] for label, paths in models.items()}
    bm25 = [bm for found in runs.values() for _, bm in found]
    if any(b != bm25[0] for b in bm25[1:]):
        raise ValueError("BM25's scores differ between runs: the runs did not evaluate the same tasks and queries")
    tasks = sorted(bm25[0])
    queries = sum(len(q) for q in bm25[0].values())
    lines = [f"Unseen libraries, {kind} tasks ({len(tasks)}: {', '.join(tasks)}; {queries} queries), nDCG@10 x 100.",
             "", "| model | runs | each run | mean over runs, 95 % interval over runs and queries |",
             "|---|---|---|---|"]  # fmt: skip
    for label, found in runs.items():
        trained = [t for t, _ in found]
        overall = training_bootstrap_mean(trained)[MEAN].scaled(100)
        each = ", ".join(f"{mean_of(t):.1f}" for t in trained)
        lines.append(
            f"| {label} | {len(trained)} | {each} | {overall.value:.1f} [{overall.low:.1f}, {overall.high:.1f}] |"
        )
    lines.append(f"| BM25 | | {mean_of(bm25[0]):.1f} | |")
    single = [label for label, found in runs.items() if len(found) < 2]
    if single:
        lines += ["", f"One run only for {', '.join(single)}: its intervals are over queries alone, not over runs."]
    lines += [
        "",
        "| A - B | difference of means, 95 % interval over runs and queries | within noise? |",
        "|---|---|---|",
    ]
    labels = list(runs)
    pairs = [(label, "BM25") for label in labels] + [(label, labels[0]) for label in labels[1:]]
    for a, b in pairs:
        a_runs = [t for t, _ in runs[a]]
        b_runs = [bm25[0]] if b == "BM25" else [t for t, _ in runs[b]]
        interval = training_bootstrap(a_runs, b_runs, names=(a, b))[MEAN]
        lines.append(f"| {a} - {b} | {cell(interval)} | {'yes' if interval.within_noise else 'no'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", action="append", required=True, metavar=("LABEL", "RUN"),
                        help="a setting's label, then its run directories (one per seed)")  # fmt: skip
    parser.add_argument("--kind", choices=sorted(KINDS), default="text2code")
    parser.add_argument("--out", help="also write the markdown to this new file (an existing one is not overwritten)")
    args = parser.parse_args(argv)
    models = {}
    for label, *paths in args.model:
        if not paths or label in models:
            parser.error(f"--model {label!r}: give a new label, then at least one run directory")
        models[label] = [Path(p) for p in paths]
    if args.out and (Path(args.out).exists() or Path(args.out).is_symlink()):
        print(f"error: {args.out} exists: not overwritten; name a new file", file=sys.stderr)
        return 1
    try:
        text = compare(models, args.kind)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(text)
    if args.out:
        try:
            with open(args.out, "x") as out:  # "x": a file made meanwhile is not overwritten either
                out.write(text)
        except OSError as err:
            print(f"error: the record could not be written: {err}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
