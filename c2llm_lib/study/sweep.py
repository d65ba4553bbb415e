"""Learning rates chosen on a validation split (notebook 06): one small grid of LoRA, head and attention-logit rates for
every model, each point trained once at the sweep's seed and scored on validation; a choice at a grid's end bounds the
rate from one side only (docs/studies.md#rates-chosen-on-a-validation-split)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import ModelConfig, TrainConfig

RATE_KEYS = ("learning_rate", "pma_learning_rate", "pma_attention_learning_rate")


@dataclass
class Grid:
    """The rates each compared model is tried at."""

    learning_rates: list[float]
    pma_learning_rates: list[float]
    pma_attention_learning_rates: list[float]

    def __post_init__(self) -> None:
        for key in ("learning_rates", "pma_learning_rates", "pma_attention_learning_rates"):
            values = getattr(self, key)
            if not values or any(not v > 0 for v in values) or len(set(values)) != len(values):
                raise ValueError(f"sweep_{key} must be distinct positive rates, got {values}")


def points(model: ModelConfig, train: TrainConfig, grid: Grid) -> list[TrainConfig]:
    """`train` at every point of the grid that applies to `model` (its pooler), in grid order."""
    pma = model.pooling == "pma"  # a pooler without parameters has no head or attention rate
    heads, attentions = (grid.pma_learning_rates, grid.pma_attention_learning_rates) if pma else ([None], [None])
    return [
        dataclasses.replace(train, learning_rate=lr, pma_learning_rate=head, pma_attention_learning_rate=attention)
        for lr, head, attention in itertools.product(grid.learning_rates, heads, attentions)
    ]


def rates(train: TrainConfig, model: ModelConfig) -> dict[str, float | None]:
    """The rates a training uses as the optimizer applies them; none without pooler parameters."""
    if model.pooling != "pma":
        return {"learning_rate": train.learning_rate}
    head = train.learning_rate if train.pma_learning_rate is None else train.pma_learning_rate
    attention = head if train.pma_attention_learning_rate is None else train.pma_attention_learning_rate
    return {"learning_rate": train.learning_rate, "pma_learning_rate": head, "pma_attention_learning_rate": attention}


def rates_label(chosen: dict[str, float | None]) -> str:
    """ "LoRA 3e-04, head 1e-03, attention 3e-03" (the parts a training has)."""
    names = {"learning_rate": "LoRA", "pma_learning_rate": "head", "pma_attention_learning_rate": "attention"}
    return ", ".join(f"{names[k]} {v:.0e}" for k, v in chosen.items() if v is not None)


@dataclass
class SweepPoint:
    """One trained point: its rates, its validation scores, and the folder of its training."""

    rates: dict[str, float | None]
    score: float  # mean nDCG@10 over the validation tasks
    per_task: dict[str, float]
    folder: str
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # its training's and its scoring's


@dataclass
class SweepResult:
    points: list[SweepPoint]
    chosen: int  # index into points

    @property
    def best(self) -> SweepPoint:
        return self.points[self.chosen]

    def to_dict(self) -> dict[str, Any]:
        return {"points": [dataclasses.asdict(p) for p in self.points], "chosen": self.chosen,
                "chosen_rates": self.best.rates}  # fmt: skip


def choose(scores: Sequence[float]) -> int:
    """The index of the best validation score; the first of equal ones (grid order: lower rates first)."""
    if not scores:
        raise ValueError("the sweep has no point to choose from")
    if any(s != s for s in scores):  # NaN != NaN
        raise ValueError(f"a validation score is not a number: {list(scores)}")
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def sweep(
    model: ModelConfig,
    train: TrainConfig,
    grid: Grid,
    score: Callable[[ModelConfig, TrainConfig], tuple[dict[str, float], str, dict[str, float]]],
) -> tuple[SweepResult, TrainConfig]:
    """Trains and scores every point of `grid` for `model`; returns the sweep and the chosen TrainConfig."""
    configs = points(model, train, grid)
    found = []
    for config in configs:
        per_task, folder, seconds = score(model, config)
        if not per_task:
            raise ValueError("a sweep point was scored on no validation task")
        mean = sum(per_task.values()) / len(per_task)
        found.append(SweepPoint(rates(config, model), mean, per_task, folder, seconds))
    best = choose([p.score for p in found])
    return SweepResult(found, best), configs[best]


NAMES = {"learning_rate": "LoRA rate", "pma_learning_rate": "head rate",
         "pma_attention_learning_rate": "attention-logit rate"}  # fmt: skip


def edges(chosen_rates: dict[str, float | None], grid: Grid) -> dict[str, str]:
    """{rate key: "largest" | "smallest"} for each chosen rate at an end of a grid axis of several values."""
    found = {}
    for key, value in chosen_rates.items():
        axis = getattr(grid, key + "s")  # the grid's axis of each rate: learning_rates for learning_rate, ...
        if value is None or len(axis) < 2:
            continue
        if value == max(axis):
            found[key] = "largest"
        elif value == min(axis):
            found[key] = "smallest"
    return found


def edge_sentences(chosen: dict[str, tuple[SweepResult, TrainConfig]], grid: Grid) -> list[str]:
    """One sentence per model whose chosen rates sit at an end of the grid."""
    lines = []
    for label, (found, _) in chosen.items():
        ends = edges(found.best.rates, grid)
        if ends:
            parts = " and ".join(f"its {NAMES[k]} {found.best.rates[k]:.0e} is the grid's {end}"
                                 for k, end in ends.items())  # fmt: skip
            beyond = ("rates beyond them" if len(ends) > 1 else
                      f"a rate {'above' if 'largest' in ends.values() else 'below'} it")  # fmt: skip
            lines.append(f"{label}: {parts}, so {beyond} may score better; the sweep bounds the best rate from one "
                         "side and does not find it.")  # fmt: skip
    return lines


def sweep_frame(chosen: dict[str, tuple[SweepResult, TrainConfig]]):
    """One row per (model, grid point): rates, validation nDCG@10 x 100 and per task, and whether chosen."""
    import pandas as pd

    rows = []
    for label, (found, _) in chosen.items():
        for i, point in enumerate(found.points):
            rows.append({"model": label, "rates": rates_label(point.rates), "validation": 100 * point.score,
                         **{t: 100 * v for t, v in point.per_task.items()}, "chosen": i == found.chosen})  # fmt: skip
    return pd.DataFrame(rows).set_index(["model", "rates"])


def markdown_table(frame, cell: Callable[[str, Any], str]) -> str:
    """`frame` as a markdown table, its index first; `cell(column, value)` writes each value."""
    names, columns = [str(name or "") for name in frame.index.names], list(frame.columns)
    lines = ["| " + " | ".join([*names, *columns]) + " |", "|" + "---|" * (len(names) + len(columns))]
    for index, row in frame.iterrows():
        keys = index if isinstance(index, tuple) else (index,)
        lines.append("| " + " | ".join([*map(str, keys), *(cell(c, row[c]) for c in columns)]) + " |")
    return "\n".join(lines) + "\n"


def sweep_markdown(frame) -> str:
    """The sweep as markdown (scores to 0.1, the chosen point marked)."""
    return markdown_table(
        frame, lambda _, value: "**yes**" if value is True else "" if value is False else f"{value:.1f}"
    )


@dataclass
class Sweeps:
    """A study's sweep: grid, seed, validation split and {model: (SweepResult, chosen TrainConfig)}."""

    grid: Grid
    seed: int
    validation: Any
    chosen: dict[str, tuple[SweepResult, TrainConfig]]

    @property
    def table(self):
        return sweep_frame(self.chosen)

    @property
    def edges(self) -> list[str]:
        return edge_sentences(self.chosen, self.grid)

    @property
    def record(self) -> dict[str, Any]:
        return {"validation": self.validation.summary(), "grid": dataclasses.asdict(self.grid), "seed": self.seed,
                "models": {label: found.to_dict() for label, (found, _) in self.chosen.items()}}  # fmt: skip
