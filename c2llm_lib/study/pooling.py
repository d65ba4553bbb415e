"""The pooling study (C2LLM section 3's claims for its head, on equal terms): PMA against the last token and the mean,
PMA projecting to d (equations 2-3) against truncation to d, and PMA's encoding cost, each difference with its 95 %
interval (docs/studies.md#the-pooling-study)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..config import ModelConfig, TrainConfig
from ..eval.intervals import (
    MEAN,
    bootstrap_mean,
    difference_sentences,
    differences,
    differences_markdown,
    differences_record,
    training_bootstrap_mean,
    training_differences,
)
from ..figures import pooling_study
from ..hardware import cpu_info, resolve_device, resolve_dtype
from .plan import Entry
from .sweep import Grid, edge_sentences, markdown_table, rates_label, sweep_frame, sweep_markdown
from .trainings import query_rows, seed_query_rows
from .trainings import timings as times


def study_pairs(entries) -> list[tuple[str, str]]:
    """PMA against each other pooler, and each PMA projection against PMA truncated to its width."""
    full = [e.label for e in entries if e.study == "poolings" and not e.projected]
    pairs = [("PMA", other) for other in full if other != "PMA"] if "PMA" in full else []
    return pairs + [(e.label, f"{e.parent}, truncated to {e.model.embedding_dim}")
                    for e in entries if e.study == "poolings" and e.projected]  # fmt: skip


def _mean(per_task: dict[str, float]) -> float:
    return 100 * sum(per_task.values()) / len(per_task)


def pooling_frame(results: dict[str, dict[str, Any]], chosen: dict[str, Any] | None = None):
    """One row per full-width pooler: rates, each seed's and the mean nDCG@10 x 100, tasks, throughput."""
    import pandas as pd

    rows = {}
    for label, result in results.items():
        if result["projected"]:
            continue
        width = str(result["width"])
        row: dict[str, Any] = {}
        if chosen and label in chosen:
            sweep_result, _ = chosen[label]
            row["rates"], row["validation"] = rates_label(sweep_result.best.rates), 100 * sweep_result.best.score
        row.update({f"seed {s}": _mean(scores[width]) for s, scores in result["seeds"].items()})
        row["mean"] = _mean(result["scores"][width])
        row.update({t: 100 * v for t, v in result["scores"][width].items()})
        row["encode tokens/s"] = result["encode"].get("tokens_per_second")
        rows[label] = row
    return pd.DataFrame(rows).T


def dimension_frame(results: dict[str, dict[str, Any]], full: str = "PMA"):
    """Mean nDCG@10 x 100 against width d for PMA projection and truncation, over seeds and per seed."""
    import pandas as pd

    base = results[full]
    width = base["width"]
    projected = {r["width"]: r for r in results.values() if r["projected"]}
    rows = {}
    for d in sorted({width, *projected, *(int(x) for x in base["scores"])}, reverse=True):
        source = base if d == width else projected.get(d)
        truncated = base["scores"].get(str(d))
        row = {"PMA projection": _mean(source["scores"][str(d)]) if source else None,
               "truncation": _mean(truncated) if truncated else None}  # fmt: skip
        for s in base["seeds"]:
            row[f"projection, seed {s}"] = _mean(source["seeds"][s][str(d)]) if source else None
        for s, scores in base["seeds"].items():
            row[f"truncation, seed {s}"] = _mean(scores[str(d)]) if str(d) in scores else None
        rows[d] = row
    return pd.DataFrame(rows).T.rename_axis("d").astype(float)


def mean_intervals(
    results: dict[str, dict[str, Any]], full: str = "PMA", seed_rows: dict[str, list] | None = None
) -> dict[str, dict[Any, Any]]:
    """The figure's error bars (x 100): over trainings and queries with `seed_rows`, else queries."""

    def interval(row: str, per_task):
        if seed_rows is not None:
            return training_bootstrap_mean(seed_rows[row])[MEAN].scaled(100)
        return bootstrap_mean(per_task)[MEAN].scaled(100)

    out: dict[str, dict[Any, Any]] = {"poolers": {}, "PMA projection": {}, "truncation": {}}
    for label, r in results.items():
        if r["projected"]:
            out["PMA projection"][r["width"]] = interval(label, r["queries"][str(r["width"])])
        else:
            out["poolers"][label] = interval(label, r["queries"][str(r["width"])])
    if full in results:
        base = results[full]
        for d, per_task in base["queries"].items():
            row = full if int(d) == base["width"] else f"{full}, truncated to {d}"
            out["truncation"][int(d)] = interval(row, per_task)
        out["PMA projection"][base["width"]] = out["truncation"][base["width"]]
    return out


def overhead(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """{pooler: real tokens encoded per second in its test evaluation} at full width (mean over seeds)."""
    return {label: r["encode"]["tokens_per_second"] for label, r in results.items()
            if not r["projected"] and r["encode"].get("tokens_per_second")}  # fmt: skip


def study_sentences(
    frame, dims, diffs, speeds: dict[str, float], seeds: Sequence[int], training_diffs=None, sweep_seed=None
) -> str:
    """The study's outcome in sentences built from its numbers."""
    import pandas as pd

    lines = []
    if "rates" in frame.columns:
        at = f" by trainings at seed {sweep_seed}, which are not scored on test" if sweep_seed is not None else ""
        lines.append(f"Rates chosen on the validation split{at}: " + "; ".join(
            f"{p} {r['rates']} (validation {r['validation']:.1f})" for p, r in frame.iterrows()) + ".")  # fmt: skip
    seed_columns = [c for c in frame.columns if c.startswith("seed ")]
    lines.append(f"Test mean nDCG@10 over {len(seeds)} seed(s) ({', '.join(map(str, seeds))}): " + "; ".join(
        f"{p} {r['mean']:.1f} (" + ", ".join(f"{c} {r[c]:.1f}" for c in seed_columns) + ")"
        for p, r in frame.sort_values("mean", ascending=False).iterrows()) + ".")  # fmt: skip
    if training_diffs:
        lines.append("Each difference below is judged by its interval over trainings and queries; the interval over "
                     "queries alone (the table beside it) treats the seeds' mean as if it were the model, and is "
                     "narrower.")  # fmt: skip
        lines += difference_sentences(training_diffs)
        narrow = [f"{a} - {b}" for (a, b), d in training_diffs.items()
                  if d[MEAN].within_noise and not diffs[(a, b)][MEAN].within_noise]  # fmt: skip
        if narrow:
            lines.append("Beyond noise over queries but within noise over trainings (another set of seeds could "
                         "reverse it): " + "; ".join(narrow) + ".")  # fmt: skip
    else:
        lines += difference_sentences(diffs)
    for d, row in dims.iterrows() if dims is not None else ():
        if pd.notna(row["PMA projection"]) and pd.notna(row["truncation"]) and d != dims.index.max():
            lines.append(f"At d={d}: PMA projection {row['PMA projection']:.1f}, truncation {row['truncation']:.1f}.")
    if "PMA" in speeds and "last token" in speeds:
        ratio = speeds["PMA"] / speeds["last token"]
        lines.append(f"Encoding throughput in the test evaluation: PMA {speeds['PMA']:.0f} real tokens/s, last token "
                     f"{speeds['last token']:.0f} ({100 * (ratio - 1):+.0f} %); one measurement per seed on a shared "
                     "machine, so a few percent either way is timing noise.")  # fmt: skip
    if not training_diffs:
        lines.append("Seeds enter each interval as the per-query mean of their scores: the interval is over queries, "
                     "and the seed columns show how far the seeds themselves differ; with one seed nothing says how "
                     "far another training would move a model.")  # fmt: skip
    return "\n".join(f"- {line}" for line in lines)


def study_record(frame, dims, diffs, results, chosen, setting: dict[str, Any], training_diffs=None) -> dict[str, Any]:
    """What `metrics/pooling_study.json` holds: tables, differences, per-model scores, sweeps and setting."""
    tables = {
        "poolers": json.loads(frame.to_json(orient="index")),
        "dimensions": json.loads(dims.to_json(orient="index")) if dims is not None else None,
    }
    return {**tables, "differences": differences_record(diffs),
            "differences over trainings": differences_record(training_diffs or {}), "models": results,
            "sweeps": {label: found.to_dict() for label, (found, _) in (chosen or {}).items()},
            "setting": setting}  # fmt: skip


def study_setting(
    base_model, base_train, seeds, grid, split, tasks, per_seed, chosen=None, sweep_seed=None
) -> dict[str, Any]:
    """The machine, shared compute, seeds, grid, split, task sizes and timings (a reused training counted once), and
    which trainings were selected on validation and which scored on test."""
    device = resolve_device(base_model.device)
    timings = {f"{label}, seed {seed}": {**times(found), "folder": found["folder"]}
               for label, by_seed in per_seed.items() for seed, found in by_seed.items()}  # fmt: skip
    for label, (found, _) in (chosen or {}).items():
        for point in found.points:
            timings[f"sweep: {label}, {rates_label(point.rates)}"] = {**point.seconds, "folder": point.folder}
    trained = {t["folder"]: t.get("train s") or 0 for t in timings.values()}  # a training counts once
    total = sum(trained.values()) + sum((t.get("evaluate s") or 0) + (t.get("load s") or 0) for t in timings.values())
    dtype = str(resolve_dtype(base_model.dtype, device)).removeprefix("torch.")
    return {"cpu": cpu_info(), "device": str(device), "dtype": dtype,
            "backbone": base_model.backbone, "steps": base_train.max_steps, "global_batch_size":
            base_train.global_batch_size, "max_length": base_train.max_length, "num_negatives":
            base_train.num_negatives, "seeds": list(seeds), "grid": dataclasses.asdict(grid) if grid else None,
            "validation": split.summary() if split else None,
            "test tasks": {t.name: {"queries": len(t.queries), "documents": len(t.corpus)} for t in tasks},
            "timings": timings, "timed seconds": total, "sweep seed": sweep_seed,
            "selected on validation": [{"model": label, "rates": rates_label(point.rates), "seed": sweep_seed,
                                        "chosen": i == found.chosen, "folder": point.folder}
                                       for label, (found, _) in (chosen or {}).items()
                                       for i, point in enumerate(found.points)],
            "scored on test": [{"model": label, "seed": seed, "folder": found["folder"]}
                               for label, by_seed in per_seed.items() for seed, found in by_seed.items()]}  # fmt: skip


def frame_markdown(frame) -> str:
    """A frame as markdown: numbers to 0.1, blanks for missing ones."""

    def cell(_, value) -> str:
        if value is None or (isinstance(value, float) and value != value):
            return ""
        return f"{value:.1f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)

    return markdown_table(frame, cell)


def study_markdown(
    run: str, frame, dims, diffs, sentences: str, setting: dict[str, Any], sweeps=None, training_diffs=None
) -> str:
    """`metrics/pooling_study.md`: the tables, differences, sweep, sentences and setting on one page."""
    cpu = setting["cpu"]
    lines = [f"### The pooling study, run {run}", "",
             f"Machine: {cpu.get('model')} ({', '.join(cpu.get('capabilities', [])) or 'no listed capability'}), "
             f"{cpu.get('threads')} threads, {setting['device']}, {setting['dtype']}. Backbone {setting['backbone']}; "
             f"{setting['steps']} steps of {setting['global_batch_size']} rows, K = {setting['num_negatives']}, length "
             f"{setting['max_length']}; seeds {setting['seeds']}. Timed trainings and evaluations: "
             f"{setting['timed seconds'] / 60:.0f} min.", "",
             "nDCG@10 x 100 on the held-out test tasks; each seed's mean, and the mean over seeds (per query the mean "
             "of the seeds' scores).", "", frame_markdown(frame.rename_axis("pooler")),
             *(["Mean nDCG@10 x 100 against the embedding width d.", "", frame_markdown(dims)]
               if dims is not None else []),
             differences_markdown(training_diffs or {}, "Differences with 95 % intervals over trainings and queries"),
             differences_markdown(diffs, "Differences with 95 % intervals over queries (the seeds' mean as one "
                                         "model)")]  # fmt: skip
    if sweeps:
        seed = setting.get("sweep seed")
        lines += [f"#### The sweep (validation split{f', seed {seed}' if seed is not None else ''})", "",
                  sweep_markdown(sweep_frame(sweeps))]  # fmt: skip
        if setting.get("grid"):
            lines += [f"- {line}" for line in edge_sentences(sweeps, Grid(**setting["grid"]))] + [""]
        tested = sorted({t["seed"] for t in setting.get("scored on test", [])})
        lines += [
            f"Selected on validation: the {len(setting.get('selected on validation', []))} sweep trainings "
            f"above (seed {seed}); none of them is scored on test. Every test score comes from a training at "
            f"seed(s) {tested}, trained afresh at the chosen rates (folders in the record's setting).",
            "",
        ]
    return "\n".join(lines) + "\n" + sentences + "\n"


@dataclass
class PoolingStudy:
    """The pooling study of one run: tables, differences, error bars, sentences, record, markdown, figure."""

    table: Any
    dimensions: Any
    differences: dict
    training_differences: dict
    intervals: dict[str, dict[Any, Any]]
    outcome: str
    setting: dict[str, Any]
    record: dict[str, Any]
    markdown: str
    figure: Any

    @property
    def differences_markdown(self) -> str:
        return differences_markdown(self.training_differences, "Differences over trainings and queries") + (
            differences_markdown(self.differences, "Differences over queries"))  # fmt: skip


def compare_poolings(
    entries: Sequence[Entry], results: dict[str, dict[str, Any]], per_seed: dict[str, dict[int, dict[str, Any]]],
    seeds: Sequence[int], tasks, base_model: ModelConfig, base_train: TrainConfig, sweeps, run: str,
) -> PoolingStudy | None:  # fmt: skip
    """The pooling study of the "poolings" entries, or None when no pooler was compared."""
    study = {e.label: results[e.label] for e in entries if e.study == "poolings"}
    if not study:
        return None
    chosen, sweep_seed = (sweeps.chosen, sweeps.seed) if sweeps else (None, None)
    poolers = pooling_frame(study, chosen)
    widths = dimension_frame(study) if "PMA" in study else None
    study_diffs = differences(query_rows(study), study_pairs(entries))
    seed_rows = seed_query_rows(per_seed, list(study)) if len(seeds) > 1 else None
    training_diffs = training_differences(seed_rows, study_pairs(entries)) if seed_rows else {}
    intervals = mean_intervals(study, seed_rows=seed_rows)
    findings = study_sentences(poolers, widths, study_diffs, overhead(study), seeds, training_diffs, sweep_seed)
    swept = {label: found for label, found in (chosen or {}).items() if label in study}
    setting = study_setting(base_model, base_train, seeds, sweeps.grid if sweeps else None,
                            sweeps.validation if sweeps else None, tasks, {label: per_seed[label] for label in study},
                            swept, sweep_seed)  # fmt: skip
    return PoolingStudy(
        poolers, widths, study_diffs, training_diffs, intervals, findings, setting,
        study_record(poolers, widths, study_diffs, study, chosen, setting, training_diffs),
        study_markdown(run, poolers, widths, study_diffs, findings, setting, swept, training_diffs),
        pooling_study(poolers, intervals),
    )  # fmt: skip
