"""How sure a difference of retrieval scores is: a paired bootstrap over queries (Efron & Tibshirani 1993, "An
Introduction to the Bootstrap", chapters 13-16; for IR metrics, Sakai 2006, "Evaluating evaluation metrics based on
the bootstrap").

A score here is a mean of per-query nDCG@10 over a task's queries, and a comparison puts two models on the *same*
queries. Some queries are easy for every model and some hard for every model, so two models' per-query scores are
strongly correlated; the bootstrap therefore resamples the per-query *differences* (paired), not each model's scores
on its own, which would add the spread of query difficulty to the interval and hide real differences in noise.

`paired_bootstrap(a, b)` takes {task: {query id: score}} for models A and B on identical queries and gives, per task
and for the mean over tasks, the observed difference of means A - B and its 95 % percentile interval from
`RESAMPLES` resamples with the fixed seed `SEED`:
- within a task, queries are drawn with replacement, as many as the task has;
- the mean over tasks (every task weighs the same, as the tables' mean column does) resamples every task at once in
  each resample, so its interval holds the noise of all tasks together;
- "within noise" when the interval holds 0.
`bootstrap_mean(a)` is the same resampling for one model's mean (the error bars of a figure). Several training seeds
of one model enter as one per-query score, the mean of the seeds' scores on that query (`seed_mean`): the interval is
then over queries, for the seed-averaged model; the seeds' own spread is reported beside it, not folded in.

What it cannot do: the queries are a sample of one held-out split, so the interval says how much the difference moves
with another draw of such queries, not with another data set, another training run or another corpus sample; and
with many comparisons at 95 % some intervals exclude 0 by chance (no correction is made).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

RESAMPLES = 2000  # B: the percentiles of 2,000 resamples move by about 0.1 point between seeds
SEED = 0
LEVEL = 0.95
MEAN = "mean"  # the key of the mean over tasks

QueryScores = Mapping[str, Mapping[str, float]]  # {task: {query id: nDCG@10 in [0, 1]}}


@dataclass(frozen=True)
class Interval:
    """An observed statistic (a difference of means, or a mean) and its bootstrap percentile interval, in the units of
    the scores given (nDCG@10 in [0, 1]); `queries` counts the queries behind it."""

    value: float
    low: float
    high: float
    queries: int
    resamples: int = RESAMPLES
    level: float = LEVEL

    @property
    def within_noise(self) -> bool:
        """The interval holds 0: no difference can be told from this sample of queries."""
        return self.low <= 0.0 <= self.high

    def scaled(self, factor: float) -> Interval:
        """The same interval in other units (x 100 for the tables)."""
        return Interval(self.value * factor, self.low * factor, self.high * factor, self.queries, self.resamples,
                        self.level)  # fmt: skip

    def to_dict(self) -> dict[str, float | int | bool]:
        return {**asdict(self), "within_noise": self.within_noise}


def aligned(a: QueryScores, b: QueryScores, names: tuple[str, str] = ("A", "B")) -> dict[str, np.ndarray]:
    """{task: (n, 2) array} of A's and B's score on each query of each task, in A's query order. The two must hold the
    same tasks and, per task, the same query ids: a comparison over different queries is not paired, and is refused
    with the task and the ids that differ."""
    if set(a) != set(b):
        raise ValueError(f"{names[0]} and {names[1]} are scored on different tasks: {sorted(set(a) ^ set(b))}")
    if not a:
        raise ValueError(f"no task scores to compare for {names[0]} and {names[1]}")
    out = {}
    for task in a:
        only = sorted(set(a[task]) ^ set(b[task]))
        if only:
            raise ValueError(
                f"task {task!r}: {names[0]} and {names[1]} are scored on different queries ({len(only)} differ, "
                f"e.g. {only[:3]}); a paired comparison needs the same queries"
            )
        if not a[task]:
            raise ValueError(f"task {task!r}: no query scores")
        out[task] = np.array([[a[task][q], b[task][q]] for q in a[task]], dtype=np.float64)  # (n, 2)
    return out


def _resampled_means(values: Mapping[str, np.ndarray], resamples: int, seed: int) -> dict[str, np.ndarray]:
    """{task: (B,) means of `resamples` resamples of the task's per-query values} and MEAN: (B,) their mean over tasks,
    every task resampled in each of the B resamples. One generator, tasks in sorted order: reproducible."""
    rng = np.random.default_rng(seed)
    out = {}
    for task in sorted(values):
        v = values[task]  # (n,)
        idx = rng.integers(0, len(v), size=(resamples, len(v)))  # (B, n)
        out[task] = v[idx].mean(axis=1)  # (B,)
    out[MEAN] = np.mean([out[t] for t in sorted(values)], axis=0)  # (B,)
    return out


def _intervals(values: Mapping[str, np.ndarray], resamples: int, seed: int, level: float) -> dict[str, Interval]:
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if MEAN in values:
        raise ValueError(f"a task may not be named {MEAN!r}: that is the key of the mean over tasks")
    boot = _resampled_means(values, resamples, seed)
    tail = 100 * (1 - level) / 2
    observed = {t: float(v.mean()) for t, v in values.items()}
    observed[MEAN] = float(np.mean([observed[t] for t in sorted(values)]))
    sizes = {t: len(v) for t, v in values.items()}
    sizes[MEAN] = sum(sizes.values())
    out = {}
    for key in [*sorted(values), MEAN]:
        low, high = np.percentile(boot[key], [tail, 100 - tail])
        out[key] = Interval(observed[key], float(low), float(high), sizes[key], resamples, level)
    return out


def paired_bootstrap(
    a: QueryScores,
    b: QueryScores,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
    names: tuple[str, str] = ("A", "B"),
) -> dict[str, Interval]:
    """{task: Interval, MEAN: Interval} of the difference A - B of mean per-query scores, paired over queries."""
    pairs = aligned(a, b, names)
    return _intervals({t: p[:, 0] - p[:, 1] for t, p in pairs.items()}, resamples, seed, level)


def bootstrap_mean(a: QueryScores, resamples: int = RESAMPLES, seed: int = SEED, level: float = LEVEL):
    """{task: Interval, MEAN: Interval} of one model's mean per-query score (queries resampled as above)."""
    if not a or any(not q for q in a.values()):
        raise ValueError("no query scores to resample")
    return _intervals({t: np.array(list(q.values()), dtype=np.float64) for t, q in a.items()}, resamples, seed, level)


def seed_mean(runs: Sequence[QueryScores]) -> dict[str, dict[str, float]]:
    """Per query, the mean of several seeds' scores ({task: {query id: mean}}); every seed must hold the same tasks
    and queries (a seed scored on other queries is an error naming it)."""
    if not runs:
        raise ValueError("no seeds to average")
    first = runs[0]
    for i, run in enumerate(runs[1:], start=1):
        aligned(first, run, ("seed 0", f"seed {i}"))  # the same tasks and queries, or a named error
    return {task: {q: float(np.mean([run[task][q] for run in runs])) for q in first[task]} for task in first}


def task_means(scores: QueryScores) -> dict[str, float]:
    """{task: mean per-query score}: the table's score of each task."""
    return {task: float(np.mean(list(q.values()))) for task, q in scores.items()}


def cell(interval: Interval, scale: float = 100.0, digits: int = 1) -> str:
    """The table's cell for a difference, x `scale`: "+3.2 [-1.0, +7.5]"."""
    i = interval.scaled(scale)
    return f"{i.value:+.{digits}f} [{i.low:+.{digits}f}, {i.high:+.{digits}f}]"


def sentence(a: str, b: str, where: str, interval: Interval) -> str:
    """One comparison in words, built from its numbers: which side is ahead, by how much, and whether the 95 % interval
    holds 0 ("within noise")."""
    i = interval.scaled(100)
    span = f"95 % interval [{i.low:+.1f}, {i.high:+.1f}] over {i.queries} queries"
    if interval.within_noise:
        return f"{where}: {a} - {b} = {i.value:+.1f} ({span}): within noise."
    ahead = a if i.value > 0 else b
    return f"{where}: {a} - {b} = {i.value:+.1f} ({span}): {ahead} is ahead."


Differences = Mapping[tuple[str, str], Mapping[str, Interval]]  # {(A, B): {task: Interval, MEAN: Interval}}


def differences(
    rows: Mapping[str, QueryScores], pairs: Sequence[tuple[str, str]], resamples: int = RESAMPLES, seed: int = SEED
) -> dict[tuple[str, str], dict[str, Interval]]:
    """{(A, B): {task: Interval, MEAN: Interval}} of A - B for each pair, A and B named rows of `rows` ({model: {task:
    {query id: score}}}); a pair naming a model without per-query scores is an error naming it."""
    missing = sorted({m for pair in pairs for m in pair} - set(rows))
    if missing:
        raise KeyError(f"no per-query scores for {missing}; known: {sorted(rows)}")
    return {(a, b): paired_bootstrap(rows[a], rows[b], resamples, seed, names=(a, b)) for a, b in pairs}


def differences_markdown(diffs: Differences, title: str) -> str:
    """The differences as a markdown table, x 100: one row per comparison, the mean over tasks first, then each task,
    then whether the mean's interval holds 0."""
    if not diffs:
        return ""
    first = next(iter(diffs.values()))
    tasks = [t for t in first if t != MEAN]
    header = "| A - B | mean | " + " | ".join(tasks) + " | mean within noise? |\n|---|" + "---|" * (len(tasks) + 2)
    lines = []
    for (a, b), d in diffs.items():
        noise = "yes" if d[MEAN].within_noise else "no"
        lines.append(f"| {a} - {b} | " + " | ".join(cell(d[t]) for t in (MEAN, *tasks)) + f" | {noise} |")
    example = first[MEAN]
    note = (f"nDCG@10 x 100: the difference of means A - B (positive when A scores higher) and its {example.level:.0%} "
            f"interval, a paired bootstrap over queries ({example.resamples:,} resamples, seed {SEED}; the mean over "
            "tasks resamples every task at once). Within noise: the interval holds 0.")  # fmt: skip
    return f"#### {title}\n\n{note}\n\n{header}\n" + "\n".join(lines) + "\n"


def differences_record(diffs: Differences) -> list[dict]:
    """The differences as JSON (nDCG@10 in [0, 1]): [{"a", "b", "intervals": {task: Interval as a dict}}]."""
    return [{"a": a, "b": b, "intervals": {task: i.to_dict() for task, i in d.items()}} for (a, b), d in diffs.items()]


def difference_sentences(diffs: Differences) -> list[str]:
    """Per comparison, the mean over tasks in words (`sentence`) and the tasks where one side is ahead beyond noise."""
    out = []
    for (a, b), d in diffs.items():
        tasks = {t: i for t, i in d.items() if t != MEAN}
        groups = {f"{a} ahead on": [t for t, i in tasks.items() if i.low > 0],
                  f"{b} ahead on": [t for t, i in tasks.items() if i.high < 0],
                  "within noise on": [t for t, i in tasks.items() if i.within_noise]}  # fmt: skip
        parts = [f"{what} {', '.join(names)}" for what, names in groups.items() if names]
        out.append(f"{sentence(a, b, 'mean over tasks', d[MEAN])} Per task: {'; '.join(parts)}.")
    return out
