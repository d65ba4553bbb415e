"""Notebook 06 in one call: plan the models, sweep rates on a validation split, train and score each model afresh at
every comparison seed, and build the recipe comparison and the pooling study."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import CompareStage
from ..eval import bm25_query_scores, offline_tasks
from ..train import data_fingerprint, most_negatives
from .plan import Entry, adjustments, base_configs, plan, recipe_frame, study_seeds
from .pooling import PoolingStudy, compare_poolings
from .recipes import RecipeStudy, compare_recipes
from .sweep import Grid, Sweeps
from .trainings import Setup, final_trainings, over_seeds, score_trainings, sweep_entries, sweep_folders
from .validation import ValidationSplit, validation_split


@dataclass
class Study:
    """What notebook 06 found: the trained entries and their keys (`models`), summary, notes, seeds, validation split,
    sweep, per-model results, and the two studies (None when not asked)."""

    entries: list[Entry]
    models: Any
    summary: str
    notes: list[str]
    seeds: list[int]
    sweep_seed: int | None
    validation: ValidationSplit | None
    sweep: Sweeps | None
    per_seed: dict[str, dict[int, dict[str, Any]]]
    results: dict[str, dict[str, Any]]
    recipes: RecipeStudy | None
    poolings: PoolingStudy | None

    @property
    def trainings(self) -> dict[str, dict[str, float]]:
        """Each model's training figures (the mean over its seeds), rounded for reading."""
        return {label: {k: round(v, 2) for k, v in r["training"].items()} for label, r in self.results.items()}


def run_study(run_dir, comparison: CompareStage, log=print) -> Study:
    """Runs notebook 06's studies for `run_dir`; trains and caches under `comparison/`, writes nothing else."""
    base_model, base_train, base_source = base_configs(run_dir)
    rows = run_dir.load_dataset("train")
    entries = plan(base_model, base_train, comparison.compare_recipes, comparison.compare_dims,
                   comparison.compare_pma_dims, poolings=comparison.compare_poolings)  # fmt: skip
    seeds = study_seeds(comparison, base_train)
    sweep_seed = comparison.sweep_seed if comparison.compare_sweep else None
    notes = adjustments(base_train, most_negatives(rows), seeds, sweep_seed)
    summary = f"compute from {base_source}; {len(rows)} training rows; seeds {seeds}" + (
        f"; the sweep at seed {sweep_seed}" if sweep_seed is not None else "")  # fmt: skip
    log(summary)
    split, rows_dir = None, run_dir.data_path("train")
    if entries and comparison.compare_sweep:
        split = validation_split(rows, comparison.validation_percent, comparison.validation_limit,
                                 comparison.validation_max_documents, base_train.seed)  # fmt: skip
        rows_dir = run_dir.save_rows(f"comparison/rows-{data_fingerprint(split.rows)}", split.rows)
    setup = Setup(run_dir, rows_dir, run_dir.root / "comparison", comparison.eval_batch_size,
                  comparison.eval_max_length, log)  # fmt: skip
    sweeps = None
    if split:
        grid = Grid(comparison.sweep_learning_rates, comparison.sweep_pma_learning_rates,
                    comparison.sweep_pma_attention_learning_rates)  # fmt: skip
        sweeps = Sweeps(grid, sweep_seed, split, sweep_entries(entries, grid, sweep_seed, setup, split))
    chosen = sweeps.chosen if sweeps else None
    tasks = offline_tasks(limit=comparison.eval_limit, max_documents=comparison.eval_max_documents)
    per_seed = score_trainings(final_trainings(entries, seeds, chosen), setup, tasks, comparison.compare_dims,
                               selected=sweep_folders(chosen))  # fmt: skip
    results = {e.label: over_seeds(e, per_seed[e.label]) for e in entries}
    bm25 = bm25_query_scores(tasks) if entries else {}
    run = run_dir.root.name
    return Study(
        entries, recipe_frame(entries) if entries else "nothing chosen: set compare_recipes or compare_poolings",
        summary, notes, seeds, sweep_seed, split, sweeps, per_seed, results,
        compare_recipes(entries, results, per_seed, bm25, notes, base_source, run),
        compare_poolings(entries, results, per_seed, seeds, tasks, base_model, base_train, sweeps, run),
    )  # fmt: skip
