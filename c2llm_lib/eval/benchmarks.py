"""mteb benchmarks by name (paper section 4.2, table 2): MTEB(Code, v1) beside the paper's and the public scores, with a
mean without CodeEditSearch (evaluated on its train split), and newer benchmarks beside their public means."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from ..data.decontamination import MTEB_CODE_TASKS
from ..data.sources import mirrored_task
from .mteb import MTEBEncoder, run_mteb
from .tables import results_frame, results_markdown

CONTAMINATED = ("CodeEditSearchRetrieval",)  # evaluated on its train split
# nDCG@10 x 100 from the public MTEB results (reference section 5); C2LLM rows equal the paper's table 2.
REFERENCE_SCORES = {
    "C2LLM-7B (paper)": (86.71, 81.49, 94.32, 90.66, 97.90, 91.07, 92.51, 34.13, 89.79, 39.76, 94.85, 75.75),
    "C2LLM-0.5B (paper)": (61.02, 71.39, 92.29, 88.63, 96.29, 89.20, 84.27, 33.99, 86.71, 38.30, 89.40, 74.08),
    "Qwen3-Embedding-0.6B": (75.34, 64.42, 90.82, 86.39, 91.72, 91.01, 86.05, 31.36, 84.69, 36.48, 89.99, 76.74),
    "BM25 (bm25s)": (4.76, 49.85, 59.19, 68.15, 53.97, 60.01, 47.78, 34.42, 40.86, 18.75, 70.26, 24.94),
}  # in MTEB_CODE_TASKS order


# Public scores (main score x 100, mean over the benchmark's tasks) of benchmarks other than MTEB(Code, v1), shown
# beside ours; MTEB(Code, v1) has per-task figures in REFERENCE_SCORES.
PUBLIC_MEANS = {
    "CoREB(v1)": {
        "source": "figures quoted in this repository's issue 15 for CoREB(v1) (built to limit training-data "
        "contamination; Xue et al. 2026, arXiv:2605.04615); not re-checked against the leaderboard here",
        "scores": {"C2LLM-7B": 60.10, "C2LLM-0.5B": 58.08, "Qwen3-Embedding-0.6B": 54.07},
    },
}


def available_benchmarks() -> list[str]:
    """Names of the benchmarks the installed mteb ships (`mteb.get_benchmarks()`)."""
    import mteb

    return sorted(b.name for b in mteb.get_benchmarks())


def check_benchmarks(names: Sequence[str]) -> None:
    """Raises, naming `benchmarks`, unless every name is a benchmark of the installed mteb (listing those it has)."""
    available = available_benchmarks()
    for name in names:
        if name in available:
            continue
        close = difflib.get_close_matches(name, available, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if name.count("(") != name.count(")"):
            hint += "; a name with a comma must be quoted in YAML: --set 'benchmarks=[\"MTEB(Code, v1)\"]'"
        raise ValueError(
            f"benchmarks: {name!r} is not a benchmark of the installed mteb {version('mteb')}{hint}. "
            f"Available: {', '.join(available)}"
        )


def benchmark_tasks(name: str, tasks: Sequence[str] = ("all",), mirror: str | Path | None = None) -> list:
    """The mteb tasks of benchmark `name` (all, or those named in `tasks`), from the hub or a local mirror."""
    import mteb

    check_benchmarks([name])
    chosen = list(mteb.get_benchmark(name).tasks)
    if list(tasks) != ["all"]:
        chosen = [t for t in chosen if t.metadata.name in set(tasks)]
    return chosen if mirror is None else [mirrored_task(t, mirror) for t in chosen]


def select_tasks(benchmarks: Sequence[str], tasks: Sequence[str]) -> dict[str, list[str]]:
    """{benchmark: its task names to run} (`["all"]`: all); a name in no benchmark is refused."""
    import mteb

    check_benchmarks(benchmarks)
    members = {b: [t.metadata.name for t in mteb.get_benchmark(b).tasks] for b in benchmarks}
    if list(tasks) == ["all"]:
        return members
    known = {t for names in members.values() for t in names}
    unknown = sorted(set(tasks) - known)
    if unknown:
        raise ValueError(f"mteb_tasks: {unknown} are in none of the benchmarks {list(benchmarks)}; ['all'] runs all")
    return {b: [t for t in names if t in set(tasks)] for b, names in members.items() if set(names) & set(tasks)}


def benchmark_table(benchmark: str, ours: dict[str, float], label: str = "this run"):
    """Ours x 100 with the mean over tasks, beside the public figures: per task for MTEB(Code, v1) (`comparison_table`),
    else the means of `PUBLIC_MEANS`."""
    import pandas as pd

    if benchmark == "MTEB(Code, v1)":
        return comparison_table(ours, label)
    frame = results_frame({label: ours})
    public = PUBLIC_MEANS.get(benchmark, {}).get("scores", {})
    rows = [pd.DataFrame({"mean": [score]}, index=[f"{model} (public)"]) for model, score in public.items()]
    return pd.concat([*rows, frame]).round(2)


def evaluate_benchmarks(
    model,
    benchmarks: Sequence[str],
    tasks: Sequence[str],
    cache_dir: str | Path,
    mirror: str | Path | None = None,
    label: str = "this run",
    batch_size: int = 16,
    max_length: int = 2048,
) -> dict[str, dict[str, Any]]:
    """{benchmark: {"table": `benchmark_table`, "sizes": `mteb_task_sizes`}} through `run_mteb`; `tasks` as in
    `select_tasks`; `model` an `MTEBEncoder`, or an encoder wrapped in one."""
    if not isinstance(model, MTEBEncoder):
        model = MTEBEncoder(model, batch_size=batch_size, max_length=max_length)
    results = {}
    for benchmark, names in select_tasks(benchmarks, tasks).items():
        chosen = benchmark_tasks(benchmark, names, mirror)
        scores = run_mteb(model, chosen, cache_dir)
        results[benchmark] = {"table": benchmark_table(benchmark, scores, label), "sizes": mteb_task_sizes(chosen)}
    return results


def benchmarks_markdown(
    results: dict[str, dict[str, Any]],
    benchmarks: Sequence[str],
    contamination: str = "",
    max_length: int | None = None,
) -> str:
    """`metrics/mteb_code.md`: each benchmark's table, the contamination note and the sources."""
    tables = "\n".join(results_markdown(found["table"], f"{name}, main score x 100", found["sizes"],
                                        max_length=max_length) for name, found in results.items())  # fmt: skip
    return f"{tables}\n{contamination}\n{SIZES_NOTE}\n\nPublic figures:\n{public_sources(benchmarks)}\n"


def public_sources(benchmarks: Sequence[str]) -> str:
    """The sources of the public figures shown for these benchmarks, one line each."""
    lines = ["- MTEB(Code, v1): public MTEB results; the C2LLM rows equal the paper's table 2."] * (
        "MTEB(Code, v1)" in benchmarks
    )
    lines += [f"- {b}: {PUBLIC_MEANS[b]['source']}." for b in benchmarks if b in PUBLIC_MEANS]
    return "\n".join(lines)


SIZES_NOTE = (
    "Queries and documents per task: mteb's statistics of the evaluated split, summed over a task's subsets "
    "(a query ranks against its own subset's documents)."
)


def mteb_task_sizes(tasks: Sequence[Any]) -> dict[str, dict[str, int]]:
    """{task: {"queries", "documents"}} from mteb's statistics; tasks without them left out."""
    sizes = {}
    for task in tasks:
        stats = (task.metadata.descriptive_stats or {}).get(task.metadata.eval_splits[0]) or {}
        queries, documents = stats.get("num_queries"), stats.get("num_documents")
        relevant = stats.get("relevant_docs_statistics") or {}
        if queries is None and relevant.get("average_relevant_docs_per_query"):  # older statistics: derive them
            queries = round(relevant["num_relevant_docs"] / relevant["average_relevant_docs_per_query"])
            documents = stats["num_samples"] - queries if "num_samples" in stats else None
        if queries is not None and documents is not None:
            sizes[task.metadata.name] = {"queries": int(queries), "documents": int(documents)}
    return sizes


def comparison_table(ours: dict[str, float], label: str = "this run"):
    """Ours (nDCG@10 in [0, 1]) beside the reference rows, x 100, with full and contamination-clean means."""
    import pandas as pd

    rows = {name: dict(zip(MTEB_CODE_TASKS, scores, strict=True)) for name, scores in REFERENCE_SCORES.items()}
    rows[label] = {t: 100 * ours[t] for t in MTEB_CODE_TASKS if t in ours}
    frame = pd.DataFrame(rows).T[[t for t in MTEB_CODE_TASKS if t in ours] or list(MTEB_CODE_TASKS)]
    frame["mean"] = frame.mean(axis=1)
    clean = [t for t in frame.columns if t not in CONTAMINATED and t != "mean"]
    frame["mean without CodeEditSearch"] = frame[clean].mean(axis=1)
    return frame.round(2)
