"""Paired bootstrap intervals of retrieval score differences: over queries (Efron & Tibshirani 1993; for IR metrics,
Sakai 2006), and over trainings and queries (two-level, Davison & Hinkley 1997, section 3.8). The mean over tasks
resamples every task at once. What an interval can say: docs/evaluation.md#how-sure-each-difference-is."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

RESAMPLES = 2000  # B: the percentiles of 2,000 resamples move by about 0.1 point between seeds
SEED = 0
LEVEL = 0.95
MEAN = "mean"  # the key of the mean over tasks
QueryScores = Mapping[str, Mapping[str, float]]  # {task: {query id: nDCG@10 in [0, 1]}}


@dataclass(frozen=True)
class Interval:
    """A statistic and its bootstrap percentile interval, in the scores' units, over `queries` queries."""

    value: float
    low: float
    high: float
    queries: int
    resamples: int = RESAMPLES
    level: float = LEVEL
    trainings: tuple[int, ...] = ()  # the trainings (seeds) resampled per model; () for an interval over queries only

    @property
    def over(self) -> str:
        """What the interval is over, in words: "200 queries", or "3 + 3 trainings and 200 queries"."""
        if not self.trainings:
            return f"{self.queries} queries"
        return f"{' + '.join(map(str, self.trainings))} trainings and {self.queries} queries"

    @property
    def within_noise(self) -> bool:
        """The interval holds 0: no difference can be told from this sample of queries."""
        return self.low <= 0.0 <= self.high

    def scaled(self, factor: float) -> Interval:
        """The same interval in other units (x 100 for the tables)."""
        return replace(self, value=self.value * factor, low=self.low * factor, high=self.high * factor)

    def to_dict(self) -> dict[str, float | int | bool | list[int]]:
        return {**asdict(self), "trainings": list(self.trainings), "within_noise": self.within_noise}


def aligned(a: QueryScores, b: QueryScores, names: tuple[str, str] = ("A", "B")) -> dict[str, np.ndarray]:
    """{task: (n, 2) array} of A's and B's per-query scores; different tasks or query ids are refused."""
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


def _check(values: Mapping[str, object], resamples: int, level: float) -> None:
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if MEAN in values:
        raise ValueError(f"a task may not be named {MEAN!r}: that is the key of the mean over tasks")


def _percentiles(boot, observed, sizes, resamples: int, level: float, trainings=()) -> dict[str, Interval]:
    """{task: Interval, MEAN: Interval} from each task's (B,) resampled statistics and its observed value and size; the
    mean over tasks resamples every task at once (each resample's task statistics averaged)."""
    tasks = sorted(boot)
    boot[MEAN] = np.mean([boot[t] for t in tasks], axis=0)  # (B,)
    observed[MEAN] = float(np.mean([observed[t] for t in tasks]))
    sizes[MEAN] = sum(sizes[t] for t in tasks)
    tail = 100 * (1 - level) / 2
    out = {}
    for key in [*tasks, MEAN]:
        low, high = np.percentile(boot[key], [tail, 100 - tail])
        out[key] = Interval(observed[key], float(low), float(high), sizes[key], resamples, level, trainings)
    return out


def _intervals(values: Mapping[str, np.ndarray], resamples: int, seed: int, level: float) -> dict[str, Interval]:
    """The bootstrap over queries of each task's mean of `values`; one generator, tasks sorted."""
    _check(values, resamples, level)
    rng = np.random.default_rng(seed)
    boot = {}
    for task in sorted(values):
        v = values[task]  # (n,)
        idx = rng.integers(0, len(v), size=(resamples, len(v)))  # (B, n)
        boot[task] = v[idx].mean(axis=1)  # (B,)
    observed = {t: float(v.mean()) for t, v in values.items()}
    return _percentiles(boot, observed, {t: len(v) for t, v in values.items()}, resamples, level)


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


def _by_training(runs: Sequence[QueryScores], name: str) -> dict[str, np.ndarray]:
    """{task: (S, n) array} of each training's per-query scores; mismatched trainings are refused."""
    if not runs:
        raise ValueError(f"{name}: no trainings to resample")
    first = runs[0]
    for i, run in enumerate(runs[1:], start=1):
        aligned(first, run, (f"{name}, training 1", f"{name}, training {i + 1}"))
    return {task: np.array([[run[task][q] for q in first[task]] for run in runs], dtype=np.float64) for task in first}


def _resampled(scores: np.ndarray, trainings: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """(R,) means of one task's (S, n) scores over each resample's drawn trainings (R, S) and queries (R, n)."""
    per_query = scores[trainings].mean(axis=1)  # (R, S, n) -> (R, n): mean over the drawn trainings
    return np.take_along_axis(per_query, queries, axis=1).mean(axis=1)  # (R,)


def _training_intervals(
    a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray] | None, resamples: int, seed: int, level: float
) -> dict[str, Interval]:
    """The two-level bootstrap of `training_bootstrap` on {task: (S, n)} arrays (B None: A's mean alone)."""
    _check(a, resamples, level)
    rng = np.random.default_rng(seed)
    tasks = sorted(a)
    counts = (len(a[tasks[0]]),) + ((len(b[tasks[0]]),) if b is not None else ())
    drawn = [rng.integers(0, n, size=(resamples, n)) for n in counts]  # (R, S) trainings per resample, per model
    boot, observed = {}, {}
    for task in tasks:
        n = a[task].shape[1]
        queries = rng.integers(0, n, size=(resamples, n))  # (R, n): one draw of queries, shared by A and B

        boot[task] = _resampled(a[task], drawn[0], queries)
        observed[task] = float(a[task].mean())
        if b is not None:
            boot[task] = boot[task] - _resampled(b[task], drawn[1], queries)
            observed[task] -= float(b[task].mean())
    return _percentiles(boot, observed, {t: a[t].shape[1] for t in tasks}, resamples, level, counts)


def training_bootstrap(
    a_seeds: Sequence[QueryScores],
    b_seeds: Sequence[QueryScores],
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
    names: tuple[str, str] = ("A", "B"),
) -> dict[str, Interval]:
    """{task: Interval, MEAN: Interval} of A - B over trainings (per model) and queries (paired)."""
    a, b = _by_training(a_seeds, names[0]), _by_training(b_seeds, names[1])
    aligned(a_seeds[0], b_seeds[0], names)  # the same tasks and queries for A and B, or a named error
    return _training_intervals(a, b, resamples, seed, level)


def training_bootstrap_mean(
    seeds: Sequence[QueryScores], resamples: int = RESAMPLES, seed: int = SEED, level: float = LEVEL
) -> dict[str, Interval]:
    """{task: Interval, MEAN: Interval} of one model's mean over trainings and queries (`training_bootstrap`)."""
    return _training_intervals(_by_training(seeds, "the model"), None, resamples, seed, level)


def _pairwise(bootstrap, rows: Mapping, pairs: Sequence[tuple[str, str]], what: str, resamples: int, seed: int) -> dict:
    """{(A, B): `bootstrap` of A - B} per pair of `rows`; a model without `what` scores is refused."""
    missing = sorted({m for pair in pairs for m in pair} - set(rows))
    if missing:
        raise KeyError(f"no {what} scores for {missing}; known: {sorted(rows)}")
    return {(a, b): bootstrap(rows[a], rows[b], resamples, seed, names=(a, b)) for a, b in pairs}


def training_differences(
    rows: Mapping[str, Sequence[QueryScores]],
    pairs: Sequence[tuple[str, str]],
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> dict[tuple[str, str], dict[str, Interval]]:
    """`differences` over trainings and queries: `rows` maps a model to its trainings' per-query scores."""
    return _pairwise(training_bootstrap, rows, pairs, "per-training", resamples, seed)


def seed_mean(runs: Sequence[QueryScores]) -> dict[str, dict[str, float]]:
    """{task: {query id: mean over seeds}}; every seed must hold the same tasks and queries."""
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
    """One comparison in words: which side is ahead, by how much, or "within noise" when the 95 % interval holds 0."""
    i = interval.scaled(100)
    span = f"95 % interval [{i.low:+.1f}, {i.high:+.1f}] over {i.over}"
    verdict = "within noise" if interval.within_noise else f"{a if i.value > 0 else b} is ahead"
    return f"{where}: {a} - {b} = {i.value:+.1f} ({span}): {verdict}."


Differences = Mapping[tuple[str, str], Mapping[str, Interval]]  # {(A, B): {task: Interval, MEAN: Interval}}


def differences(
    rows: Mapping[str, QueryScores], pairs: Sequence[tuple[str, str]], resamples: int = RESAMPLES, seed: int = SEED
) -> dict[tuple[str, str], dict[str, Interval]]:
    """{(A, B): {task: Interval, MEAN: Interval}} of A - B per pair of `rows`; unknown models are refused."""
    return _pairwise(paired_bootstrap, rows, pairs, "per-query", resamples, seed)


def differences_markdown(diffs: Differences, title: str) -> str:
    """The differences as a markdown table x 100, mean first, then whether the mean holds 0."""
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
    over = ("a paired bootstrap over queries" if not example.trainings else "a two-level bootstrap over each model's "
            "trainings (seeds, drawn per model) and queries (paired)")  # fmt: skip
    note = (f"nDCG@10 x 100: the difference of means A - B (positive when A scores higher) and its {example.level:.0%} "
            f"interval, {over} ({example.resamples:,} resamples, seed {SEED}; the mean over "
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
