"""Notebook 06's trainings and scores: each training in its own process, in a folder keyed by its configs, resolved
compute and rows, reused when finished; scored per query at full width and each truncation, the scores kept beside it. A
sweep training is never scored on test."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from ..config import ModelConfig, TrainConfig
from ..eval.intervals import seed_mean, task_means
from ..eval.scoring import RetrievalTask, task_embeddings, truncation_query_scores
from ..files import CorruptFile, load_json
from ..hardware import resolve_device, resolve_dtype
from ..prompts import prompts
from ..retrieval import corpus_text
from ..train import data_fingerprint, encoder_from_checkpoint, move_aside
from ..train.launch import train_in_subprocess
from .plan import Entry
from .sweep import RATE_KEYS, sweep


def resolved_compute(model: ModelConfig) -> dict[str, str]:
    """The device and dtype `model` resolves to on this machine (for cache keys)."""
    device = resolve_device(model.device)
    return {"device": device.type, "dtype": str(resolve_dtype(model.dtype, device)).removeprefix("torch.")}


def config_key(model: ModelConfig, train: TrainConfig, rows: str, compute: dict[str, str] | None = None) -> str:
    """A short hash of a training's configs, resolved compute and `rows` fingerprint: its folder's name."""
    compute = compute if compute is not None else resolved_compute(model)
    blob = json.dumps({"model": model.to_dict(), "train": train.to_dict(), "rows": rows, "compute": compute},
                      sort_keys=True)  # fmt: skip
    return hashlib.blake2b(blob.encode(), digest_size=5).hexdigest()


def training_folder(model: ModelConfig, train: TrainConfig, rows_dir: Path, work_dir: Path) -> tuple[str, Path]:
    """(the rows' fingerprint, `work_dir/<config_key>`) of a training of `model` and `train`."""
    from datasets import load_from_disk

    rows = data_fingerprint(load_from_disk(str(rows_dir)))
    return rows, Path(work_dir) / config_key(model, train, rows)


def train_recipe(model: ModelConfig, train: TrainConfig, rows_dir: Path, work_dir: Path, log=print) -> dict[str, Any]:
    """The summary of one training in its own process under `work_dir/<config_key>/`; a finished one on the same rows is
    reused, one on other rows moved aside (nothing deleted)."""
    rows, folder = training_folder(model, train, rows_dir, work_dir)
    summary = folder / "checkpoints" / "train_summary.json"
    finished = summary.is_file()
    recorded = load_json(summary, "training summary").get("data_fingerprint") if finished else None
    if finished and recorded == rows:
        log(f"reusing the finished training in {folder}")
    else:
        if finished:
            moved = move_aside(folder, "other-rows")
            log(f"{folder} holds a training trained on other rows (fingerprint {recorded}; the rows in {rows_dir}: "
                f"{rows}): moved it to {moved}, training again")  # fmt: skip
        if (folder / "checkpoints").exists():  # an interrupted earlier attempt: its partial checkpoints are ours
            shutil.rmtree(folder / "checkpoints")
        folder.mkdir(parents=True, exist_ok=True)
        train_in_subprocess(model, train, rows_dir, folder, log)
    losses = [m["loss"] for m in json.loads((folder / "checkpoints" / "train_metrics.json").read_text())]
    n = min(5, len(losses))  # `loss_first` and `loss_last`: the mean loss of the first and last 5 steps
    return {**json.loads(summary.read_text()), "loss_first": sum(losses[:n]) / n, "loss_last": sum(losses[-n:]) / n}


@dataclasses.dataclass
class Setup:
    """What every training and scoring of one comparison shares: run, rows, work folder, encoding settings."""

    run_dir: Any  # runs.RunDir
    rows_dir: Path
    work_dir: Path
    batch_size: int = 16
    max_length: int | None = None
    log: Callable = print


def evaluate_queries(
    encoder,
    tasks: Sequence[RetrievalTask],
    dims: Sequence[int],
    batch_size: int = 16,
    max_length: int | None = None,
    prompts_of: Callable | None = None,
) -> dict[str, Any]:
    """One encoding pass scored at full width and each smaller d in `dims`: {"width", "scores", "queries", "encode"}
    (real tokens/s); `prompts_of(config, task)` gives a task's prompts."""
    width = encoder.embedding_dim
    widths = [width, *(d for d in dims if d < width)]
    queries: dict[str, dict[str, dict[str, float]]] = {str(d): {} for d in widths}
    seconds, texts, tokens = 0.0, 0, 0
    for task in tasks:
        prompt = prompts_of(encoder.config, task) if prompts_of else None
        start = time.perf_counter()
        q, d = task_embeddings(encoder, task, batch_size, max_length, prompt)  # (Q, width), (N, width)
        seconds += time.perf_counter() - start
        texts += len(q) + len(d)
        tokens += encoded_tokens(encoder, task, max_length or encoder.config.max_length, prompt)
        for dim, per_query in truncation_query_scores(task, q, d, widths).items():
            queries[str(dim)][task.name] = per_query
    scores = {d: {t: sum(v.values()) / len(v) for t, v in by_task.items()} for d, by_task in queries.items()}
    encode = {"seconds": seconds, "texts": texts, "tokens": tokens, "tokens_per_second": tokens / max(seconds, 1e-9)}
    return {"width": width, "scores": scores, "queries": queries, "encode": encode}


def encoded_tokens(encoder, task: RetrievalTask, max_length: int, prompt: tuple[str, str] | None = None) -> int:
    """The real tokens `encoder` reads for a task (formatted, cut at `max_length`, EOS included)."""
    query, document = prompt or prompts(encoder.config.prompt_style, task.name, encoder.config.document_prefix)
    eos = 1 if encoder.config.eos_appended else 0
    texts = encoder.format_texts(list(task.queries.values()), "query", query) + encoder.format_texts(
        [corpus_text(t) for t in task.corpus.values()], "document", document)  # fmt: skip
    lengths = [len(ids) for ids in encoder.tokenizer(texts, add_special_tokens=False)["input_ids"]]
    return sum(min(n, max_length - eos) + eos for n in lengths)


def scored_training(
    setup: Setup,
    model: ModelConfig,
    train: TrainConfig,
    tasks: Sequence[RetrievalTask],
    dims: Sequence[int],
    prompts_of: Callable | None = None,
) -> dict[str, Any]:
    """A training and its `evaluate_queries`, cached in its folder under `evaluation_key`."""
    training = train_recipe(model, train, setup.rows_dir, setup.work_dir, setup.log)
    folder = Path(training["final_checkpoint"]).parent.parent  # <work_dir>/<config_key>
    prompts = {t.name: list(prompts_of(model, t)) if prompts_of else None for t in tasks}
    key = evaluation_key(tasks, prompts, dims, setup.batch_size, setup.max_length, folder / "checkpoints",
                         resolved_compute(model))  # fmt: skip
    cached = folder / f"scores-{key}.json"
    if cached.is_file():
        setup.log(f"reusing the scores in {cached}")
        found = load_json(cached, "cached comparison scores")
        missing = [k for k in ("width", "scores", "queries", "encode") if k not in found]
        if missing:
            raise CorruptFile(f"{cached}: cached scores without {missing}; delete it to score the training again")
    else:
        start = time.perf_counter()
        encoder = encoder_from_checkpoint(training["final_checkpoint"]).eval()
        loaded = time.perf_counter() - start
        found = evaluate_queries(encoder, tasks, dims, setup.batch_size, setup.max_length, prompts_of)
        found["encode"]["load_seconds"] = loaded
        del encoder
        setup.run_dir.save_json(cached.relative_to(setup.run_dir.root), found)
    return {**found, "training": training, "folder": str(folder)}


def timings(found: dict[str, Any]) -> dict[str, float | None]:
    """{"train s", "evaluate s", "load s"} of a `scored_training` result (a reused one keeps the times it took)."""
    return {"train s": found["training"].get("train_seconds"), "evaluate s": found["encode"]["seconds"],
            "load s": found["encode"].get("load_seconds")}  # fmt: skip


def evaluation_key(
    tasks, prompts: dict, dims, batch_size: int, max_length: int | None, checkpoints: Path, compute: dict[str, str]
) -> str:
    """A short hash of what a scoring depends on: tasks, prompts, widths, batch, length, compute, training."""
    from ..eval.mteb import task_fingerprint

    summary = (checkpoints / "train_summary.json").read_bytes()
    blob = json.dumps({"tasks": [task_fingerprint(t) for t in tasks], "prompts": prompts, "dims": sorted(dims),
                       "batch_size": batch_size, "max_length": max_length, "compute": compute,
                       "training": hashlib.sha256(summary).hexdigest()}, sort_keys=True)  # fmt: skip
    return hashlib.blake2b(blob.encode(), digest_size=6).hexdigest()


def sweep_entries(
    entries: Sequence[Entry], grid, seed: int, setup: Setup, validation
) -> dict[str, tuple[Any, TrainConfig]]:
    """{label: (SweepResult, chosen TrainConfig)} of every full-width entry, swept at `seed`."""

    def score(model: ModelConfig, train: TrainConfig) -> tuple[dict[str, float], str, dict[str, float]]:
        found = scored_training(setup, model, train, validation.tasks, [], validation.prompts)
        return found["scores"][str(found["width"])], found["folder"], timings(found)

    chosen = {}
    for entry in entries:
        if not entry.projected:
            setup.log(f"sweep: {entry.label}")
            chosen[entry.label] = sweep(entry.model, dataclasses.replace(entry.train, seed=seed), grid, score)
    return chosen


def final_trainings(
    entries: Sequence[Entry], seeds: Sequence[int], chosen: dict[str, tuple[Any, TrainConfig]] | None = None
) -> list[tuple[Entry, int, TrainConfig]]:
    """(entry, seed, TrainConfig) to score: each entry at each seed, at its swept or own rates."""
    out = []
    for entry in entries:
        train = entry.train
        if chosen:
            picked = chosen[entry.parent or entry.label][1]
            train = dataclasses.replace(train, **{k: getattr(picked, k) for k in RATE_KEYS})
        out += [(entry, seed, dataclasses.replace(train, seed=seed)) for seed in seeds]
    return out


def sweep_folders(chosen: dict[str, tuple[Any, TrainConfig]] | None) -> set[str]:
    """The folders of every training the sweep ran: trainings selected (or passed over) on validation."""
    return {point.folder for found, _ in (chosen or {}).values() for point in found.points}


def score_trainings(
    trainings: Sequence[tuple[Entry, int, TrainConfig]], setup: Setup, tasks: Sequence[RetrievalTask],
    dims: Sequence[int], selected: Collection[str] = (),
) -> dict[str, dict[int, dict[str, Any]]]:  # fmt: skip
    """{label: {seed: `scored_training`}} on test; a training in `selected` (the sweep's) is refused."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for entry, seed, train in trainings:
        setup.log(f"{entry.label}, seed {seed}")
        if selected:
            folder = str(training_folder(entry.model, train, setup.rows_dir, setup.work_dir)[1])
            if folder in selected:
                raise RuntimeError(f"{entry.label}, seed {seed}: its training ({folder}) is one the sweep ran and "
                                   "chose on validation; test scores come from fresh trainings only (give the sweep "
                                   "a seed of its own, sweep_seed)")  # fmt: skip
        found = scored_training(setup, entry.model, train, tasks, [] if entry.projected else dims)
        out.setdefault(entry.label, {})[seed] = found
    return out


def over_seeds(entry: Entry, per_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """An entry's table result: per-query means over seeds, task scores, per-seed scores, training figures."""
    runs = list(per_seed.values())
    widths = list(runs[0]["queries"])
    queries = {d: seed_mean([r["queries"][d] for r in runs]) for d in widths}

    def mean_numbers(records: list[dict[str, Any]]) -> dict[str, float]:
        keys = [k for k, v in records[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return {k: sum(r[k] for r in records) / len(records) for k in keys if all(k in r for r in records)}

    return {"recipe": entry.recipe, "width": runs[0]["width"], "projected": entry.projected,
            "mrl": bool(entry.train.mrl_dims), "scores": {d: task_means(q) for d, q in queries.items()},
            "queries": queries, "training": mean_numbers([r["training"] for r in runs]),
            "encode": mean_numbers([r["encode"] for r in runs]),
            "seeds": {str(s): r["scores"] for s, r in per_seed.items()}}  # fmt: skip


def query_rows(
    results: dict[str, dict[str, Any]], bm25: dict[str, dict[str, float]] | None = None
) -> dict[str, dict[str, dict[str, float]]]:
    """{row: {task: {query id: nDCG@10}}}: each model, each "<label>, truncated to <d>", and BM25."""
    rows = {}
    for label, result in results.items():
        for d, per_task in result["queries"].items():
            rows[label if int(d) == result["width"] else f"{label}, truncated to {d}"] = per_task
    if bm25:
        rows["BM25"] = bm25
    return rows


def seed_query_rows(
    per_seed: dict[str, dict[int, dict[str, Any]]], labels: Sequence[str]
) -> dict[str, list[dict[str, dict[str, float]]]]:
    """{row: [each seed's {task: {query id: nDCG@10}}]} of `labels`, named as `query_rows` names them."""
    rows: dict[str, list[dict[str, dict[str, float]]]] = {}
    for label in labels:
        runs = list(per_seed[label].values())
        for d in runs[0]["queries"]:
            name = label if int(d) == runs[0]["width"] else f"{label}, truncated to {d}"
            rows[name] = [run["queries"][d] for run in runs]
    return rows
