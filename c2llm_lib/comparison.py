"""C2LLM, jina-code-embeddings and CodeXEmbed trained on equal terms (C2LLM section 3's takeaway against the
peers' choices: PMA vs last-token pooling, per-dataset instructions vs task prefixes, a projecting head vs MRL,
rank 64 vs rank 8, GradCache).

Each recipe is a params file (`params/c2llm-0.5b.yaml`, `params/jina-code-0.5b.yaml`,
`params/codexembed-style.yaml`). Only its *recipe* keys are taken (`RECIPE_KEYS`: pooler, prompts, LoRA, loss,
negatives, learning rate and schedule, MRL, GradCache). Everything that sets the compute (backbone, precision,
sequence length, batch size, steps, seed, PMA heads) comes from the run's own notebook-02 configuration, so
every recipe sees the same rows, the same number of optimizer steps of the same global batch, and the same
seed. Three adjustments fit the files to a short run on any backbone; `adjustments` lists them for the results:
- warmup: the run's `warmup_steps` (CodeXEmbed's 50 warmup steps would outlast a 20-step run);
- MRL: a recipe with MRL trains at the full width and at every compared dimension (for Qwen2.5-Coder-0.5B
  and dims [512, 256, 128, 64] that is jina's own list);
- K: a recipe asks for K hard negatives and gets min(K, the run's mined K).

The same engine runs the pooling study (`pooling_entries`, `compare_poolings`): notebook 02's own recipe with each
pooler, and PMA projecting to each width (`ablations.py` makes its tables). With `compare_sweep`, each full-width
model first trains at every point of one grid of learning rates on the training rows without a validation split
(`validation.py`, `sweep.py`), at the sweep's own seed (`sweep_seed`), and keeps the point with the best validation
score (`sweep_entries`); a projection trains at its full width's rates (`final_trainings`). Every model then trains
afresh once per seed of `compare_seeds` (`study_seeds`), none of which may be the sweep's: a training chosen on
validation for its score carries that selection onto the test tasks, so no test score comes from one (`sweep_folders`
names them, `score_trainings` refuses them, and the records list them).

Each training runs in its own process (`python -m c2llm_lib.train`, which dies with the process that started it) in
a folder named by a hash of its configs, the dtype and device they resolve to on this machine (`dtype: auto` is
bf16 on one CPU and fp32 on another), and the rows it trains on (`config_key`), and a finished training there is
reused only when the rows it recorded are the rows given (another is moved aside and trained again). Its peak memory
is its own;
throughput counts real tokens embedded with a graph per second of training steps, and memory is the peak
from the end of loading to the end of training (weights, optimizer state and activations; GPU memory on a
GPU, resident memory on a CPU), so a loader's transient spike does not hide the recipes' differences.
Quality is nDCG@10 on the offline held-out tasks with each recipe's own prompts, from one encoding pass per
model, scored query by query at the full width and at each compared dimension (truncated and re-normalised;
`eval.truncation_query_scores` scores exactly as the mteb path does), and kept beside the training
(`scored_training`: `scores-<evaluation_key>.json`, read back while the tasks, prompts, widths, length, batch size,
resolved dtype and training are the same), so a killed comparison resumes without training or scoring anything
twice. Several seeds are one model whose per-query score is the mean of the seeds' (`over_seeds`); each seed's own
per-query scores stay beside it (`seed_query_rows`) for the intervals over trainings. For a dimension d the
comparison has: a PMA recipe trained to project to d (equations 2-3), every recipe's full embedding truncated to d,
and so jina's MRL-trained truncation beside plain ones. Each difference the table states (`recipe_pairs`) comes with
its 95 % interval from a paired bootstrap over queries, and with several seeds also over trainings (`uncertainty.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

import yaml

from .config import PARAMS_DIR, CompareStage, ConfigError, ModelConfig, TrainConfig, from_dict
from .distributed import die_with_parent
from .eval import RetrievalTask, task_embeddings, truncation_query_scores
from .figures import TRAINING_COLUMNS
from .files import CorruptFile, MissingInput, load_json
from .hardware import resolve_device, resolve_dtype
from .prompts import prompts
from .retrieval import corpus_text
from .sweep import RATE_KEYS, sweep, timings
from .train import data_fingerprint, encoder_from_checkpoint, move_aside, split_params
from .uncertainty import difference_sentences, differences_record, seed_mean, task_means

REPO = Path(__file__).resolve().parent.parent
RECIPE_KEYS = (  # what a recipe decides; the rest is the run's compute, equal for all
    "pooling", "pma_score_scale", "append_eos", "document_prefix", "prompt_style", "lora_r", "lora_alpha",
    "lora_dropout", "lora_targets", "num_negatives", "tau", "joint_softmax", "gather_with_grad", "learning_rate",
    "pma_learning_rate", "pma_attention_learning_rate", "weight_decay", "lr_schedule", "min_lr_ratio", "max_grad_norm",
    "mrl_dims", "mrl_weights", "grad_cache",
)  # fmt: skip


def base_configs(run_dir) -> tuple[ModelConfig, TrainConfig, str]:
    """The run's notebook-02 configuration and where it was read: `metrics/train.json` when notebook 02 ran,
    else `resolved.yaml`, where the pipeline records every notebook's parameters before running any (so
    `--only 01 06` needs no training of the run's own)."""
    trained = run_dir.root / "metrics" / "train.json"
    if trained.is_file():
        record = json.loads(trained.read_text())
        model = from_dict(ModelConfig, record["model_config"], str(trained))
        return model, from_dict(TrainConfig, record["train_config"], str(trained)), str(trained)
    resolved = run_dir.root / "resolved.yaml"
    if resolved.is_file():
        params = (yaml.safe_load(resolved.read_text()) or {}).get("02_train_lora_contrastive", {})
        params = {k: v for k, v in params.items() if k not in ("run", "outputs_dir")}
        return (*split_params(params, f"{resolved} (02_train_lora_contrastive)"), str(resolved))
    raise MissingInput(
        f"neither {trained} nor {resolved} exists: run notebook 02, or the pipeline (e.g. --only 01 06), first"
    )


def load_recipe(name: str, params_dir: str | Path = PARAMS_DIR) -> dict[str, Any]:
    """The recipe keys of `params/<name>.yaml` (those it sets; the others keep the dataclass defaults)."""
    path = Path(params_dir) / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in Path(params_dir).glob("*.yaml"))
        raise ConfigError(f"compare_recipes: no params file {path} for recipe {name!r}; known: {known}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a flat mapping of parameter names to values")
    return {key: data[key] for key in RECIPE_KEYS if key in data}


def recipe_configs(
    base_model: ModelConfig, base_train: TrainConfig, recipe: dict[str, Any], dims: Sequence[int], source: str
) -> tuple[ModelConfig, TrainConfig]:
    """(ModelConfig, TrainConfig) of a recipe on the run's compute: recipe keys over the run's configuration,
    LoRA on, full width, no intermediate checkpoints, and MRL (if the recipe has it) at `dims`."""
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    defaults_model, defaults_train = ModelConfig(), TrainConfig()
    model_keys = {k: recipe.get(k, getattr(defaults_model, k)) for k in RECIPE_KEYS if k in model_fields}
    train_keys = {k: recipe.get(k, getattr(defaults_train, k)) for k in RECIPE_KEYS if k not in model_fields}
    if train_keys["mrl_dims"]:
        train_keys.update(mrl_dims=sorted(dims, reverse=True), mrl_weights=[])
    try:
        model = dataclasses.replace(base_model, **model_keys, use_lora=True, embedding_dim=None)
        train = dataclasses.replace(base_train, **train_keys, checkpoint_steps=[], checkpoint_fractions=[])
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    return model, train


@dataclasses.dataclass
class Entry:
    """One model to train: a recipe on the run's compute, the run's own recipe with one pooler (`study`
    "poolings"), or a PMA model projecting to a smaller width, which trains at the rates of its `parent` (the
    full-width entry of the same recipe) when rates are chosen by a sweep."""

    label: str
    recipe: str
    model: ModelConfig
    train: TrainConfig
    projected: bool = False
    parent: str | None = None
    study: str = "recipes"


RUN_RECIPE = "run recipe"  # the recipe of the pooling study's entries: notebook 02's own configuration
POOLING_LABELS = {"pma": "PMA", "last_token": "last token", "mean": "mean"}


def projections(entry: Entry, pma_dims: Sequence[int], label: str) -> list[Entry]:
    """`entry` (a PMA model) projecting to each d in `pma_dims` (equations 2-3), MRL kept below d; labelled
    `label.format(d=d)`."""
    out = []
    for d in pma_dims:
        small = dataclasses.replace(entry.train, mrl_dims=[x for x in entry.train.mrl_dims if x < d], mrl_weights=[])
        projecting = dataclasses.replace(entry.model, embedding_dim=d)
        out.append(Entry(label.format(d=d), entry.recipe, projecting, small, True, entry.label, entry.study))
    return out


def plan(
    base_model: ModelConfig,
    base_train: TrainConfig,
    recipes: Sequence[str],
    dims: Sequence[int],
    pma_dims: Sequence[int],
    params_dir: str | Path = PARAMS_DIR,
    poolings: Sequence[str] = (),
) -> list[Entry]:
    """The trainings of a comparison: each recipe, and each PMA recipe again at every width in `pma_dims`; then the
    pooling study (`pooling_entries`)."""
    entries = []
    for name in recipes:
        source = str(Path(params_dir) / f"{name}.yaml")
        model, train = recipe_configs(base_model, base_train, load_recipe(name, params_dir), dims, source)
        entries.append(Entry(name, name, model, train))
        if model.pooling == "pma":
            entries += projections(entries[-1], pma_dims, name + ", PMA d={d}")
    return entries + pooling_entries(base_model, base_train, poolings, pma_dims)


def pooling_entries(
    base_model: ModelConfig, base_train: TrainConfig, poolings: Sequence[str], pma_dims: Sequence[int]
) -> list[Entry]:
    """The pooling study (section 3's takeaway): the run's own recipe (notebook 02's model and training) with each
    pooler in `poolings`, LoRA on, at full width, and PMA also projecting to each d in `pma_dims`. A pooler without
    parameters gets no head rates (it has no head)."""
    unknown = sorted(set(poolings) - set(POOLING_LABELS))
    if unknown:
        raise ConfigError(f"compare_poolings: unknown poolers {unknown}; choose from {sorted(POOLING_LABELS)}")
    model = dataclasses.replace(base_model, use_lora=True, embedding_dim=None, append_eos=None)
    train = dataclasses.replace(base_train, checkpoint_steps=[], checkpoint_fractions=[])
    entries = []
    for pooling in poolings:
        rates = {} if pooling == "pma" else {"pma_learning_rate": None, "pma_attention_learning_rate": None}
        entry = Entry(POOLING_LABELS[pooling], RUN_RECIPE, dataclasses.replace(model, pooling=pooling),
                      dataclasses.replace(train, **rates), study="poolings")  # fmt: skip
        entries.append(entry)
        if pooling == "pma":
            entries += projections(entry, pma_dims, "PMA d={d}")
    return entries


def recipe_frame(entries: Sequence[Entry]):
    """The recipe keys of each planned training, side by side (the differences the comparison is about)."""
    import pandas as pd

    rows = {}
    for e in entries:
        settings = {**e.model.to_dict(), **e.train.to_dict()}
        rows[e.label] = {k: settings[k] for k in ("embedding_dim", *RECIPE_KEYS, "warmup_steps")}
    frame = pd.DataFrame(rows).astype(str)
    return frame[frame.nunique(axis=1) > 1] if len(rows) > 1 else frame


def adjustments(
    base_train: TrainConfig, most_negatives: int, seeds: Sequence[int] = (), sweep_seed: int | None = None
) -> list[str]:
    """The fitting rules above, with this run's values, as sentences for the results. `most_negatives`: the most hard
    negatives a training row holds (`train.most_negatives`), the K a training runs with at most; `sweep_seed`: the
    sweep's seed when rates were swept."""
    seeds = list(seeds) or [base_train.seed]
    rates = (f"each model trains at the learning rates its own sweep chose on the validation split (at seed "
             f"{sweep_seed}; a projection at its full width's), then afresh at each compared seed, so no test score "
             "comes from a training selected on validation; no model trains on the validation rows"
             if sweep_seed is not None else
             "each model trains at its own learning rates: its file's, or the run's for the pooling study")  # fmt: skip
    return [
        f"every recipe warms up for the run's {base_train.warmup_steps} steps, whatever its file says",
        "a recipe with MRL trains at the full width and at each compared dimension",
        f"a recipe asking for K hard negatives trains with min(K, {most_negatives}): {most_negatives} is the most any "
        "training row holds, and a row with fewer has its empty slots masked out of the loss",
        f"all share the run's compute: {base_train.max_steps or 'all'} steps, global batch "
        f"{base_train.global_batch_size}, sequence length {base_train.max_length}, seed(s) "
        f"{', '.join(map(str, seeds))}",
        rates,
    ]


def study_seeds(comparison: CompareStage, base_train: TrainConfig) -> list[int]:
    """The seeds every compared model trains with (`compare_seeds`, or notebook 02's seed), none of them the sweep's
    (`sweep_seed`, when rates are swept): a training selected on validation would carry its selection onto the test
    tasks."""
    seeds = list(comparison.compare_seeds) or [base_train.seed]
    if comparison.compare_sweep and comparison.sweep_seed in seeds:
        source = "compare_seeds" if comparison.compare_seeds else "notebook 02's seed (compare_seeds is empty)"
        raise ConfigError(f"sweep_seed: {comparison.sweep_seed} is also a comparison seed ({source}: {seeds}); the "
                          "sweep's trainings are selected on validation and must not be the ones scored on test: "
                          "choose another sweep_seed")  # fmt: skip
    return seeds


def resolved_compute(model: ModelConfig) -> dict[str, str]:
    """The device and dtype `model` trains and encodes in on this machine (`dtype: auto` and `device: auto` resolved),
    which a training's or a scoring's cache key holds instead of the settings' names."""
    device = resolve_device(model.device)
    return {"device": device.type, "dtype": str(resolve_dtype(model.dtype, device)).removeprefix("torch.")}


def config_key(model: ModelConfig, train: TrainConfig, rows: str, compute: dict[str, str] | None = None) -> str:
    """A short hash of a training: its configurations, the device and dtype they resolve to (`resolved_compute`,
    computed when not given) and `rows`, the fingerprint of the rows it trains on (`train.data_fingerprint`). The
    folder a training writes to, reused when none of them changed."""
    compute = compute if compute is not None else resolved_compute(model)
    blob = json.dumps({"model": model.to_dict(), "train": train.to_dict(), "rows": rows, "compute": compute},
                      sort_keys=True)  # fmt: skip
    return hashlib.blake2b(blob.encode(), digest_size=5).hexdigest()


def training_folder(model: ModelConfig, train: TrainConfig, rows_dir: Path, work_dir: Path) -> tuple[str, Path]:
    """(the fingerprint of the rows saved in `rows_dir`, the folder `work_dir/<config_key>` a training of `model` and
    `train` on them writes to)."""
    from datasets import load_from_disk

    rows = data_fingerprint(load_from_disk(str(rows_dir)))
    return rows, Path(work_dir) / config_key(model, train, rows)


def train_recipe(model: ModelConfig, train: TrainConfig, rows_dir: Path, work_dir: Path, log=print) -> dict[str, Any]:
    """Trains one configuration on the rows saved in `rows_dir`, in its own process (`python -m c2llm_lib.train`),
    under `work_dir/<config_key>/`.

    Returns the training summary (steps, seconds, tokens, tokens_per_second, peak_rss_gb [, peak_cuda_gb],
    data_fingerprint, final_checkpoint). A folder that already holds a finished training of the same configuration
    on the same rows (the fingerprint its summary records) is reused; one whose summary records other rows is moved
    aside (`<hash>.other-rows-<time>`, nothing deleted) and trained again. A failed training raises with its error,
    the command and where its full log is."""
    rows, folder = training_folder(model, train, rows_dir, work_dir)
    summary = folder / "checkpoints" / "train_summary.json"
    if summary.is_file():
        recorded = load_json(summary, "training summary").get("data_fingerprint")
        if recorded == rows:
            log(f"reusing the finished training in {folder}")
            return with_loss_trend(json.loads(summary.read_text()), folder / "checkpoints")
        moved = move_aside(folder, "other-rows")
        log(f"{folder} holds a training trained on other rows (fingerprint {recorded}; the rows in {rows_dir}: "
            f"{rows}): moved it to {moved}, training again")  # fmt: skip
    if (folder / "checkpoints").exists():  # an interrupted earlier attempt: its partial checkpoints are ours
        import shutil

        shutil.rmtree(folder / "checkpoints")
    folder.mkdir(parents=True, exist_ok=True)
    params = folder / "params.yaml"
    params.write_text(yaml.safe_dump({**model.to_dict(), **train.to_dict()}, sort_keys=True))
    command = [sys.executable, "-m", "c2llm_lib.train", "--params", str(params), "--rows", str(rows_dir),
               "--out", str(folder / "checkpoints")]  # fmt: skip
    log_file = folder / "train.log"
    log(f"training in {folder} (follow it: tail -f {log_file})")
    with open(log_file, "w") as out:  # streamed, so a long training can be followed; it dies with this process
        done = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True,
                              preexec_fn=functools.partial(die_with_parent, os.getpid()))  # fmt: skip
    if done.returncode != 0:
        lines = [line for line in log_file.read_text().splitlines() if line.strip()] or ["(no output)"]
        raise RuntimeError(f"training failed (exit {done.returncode}): {lines[-1]}\n"
                           f"command: {' '.join(command)}\nfull log: {log_file}")  # fmt: skip
    return with_loss_trend(json.loads(summary.read_text()), folder / "checkpoints")


def with_loss_trend(summary: dict[str, Any], checkpoints: Path, window: int = 5) -> dict[str, Any]:
    """The summary with `loss_first` and `loss_last`: the mean training loss of the first and of the last
    `window` steps (from `train_metrics.json`), so that a recipe that did not learn is seen to."""
    losses = [m["loss"] for m in json.loads((checkpoints / "train_metrics.json").read_text())]
    n = min(window, len(losses))
    return {**summary, "loss_first": sum(losses[:n]) / n, "loss_last": sum(losses[-n:]) / n}


def evaluate_queries(
    encoder,
    tasks: Sequence[RetrievalTask],
    dims: Sequence[int],
    batch_size: int = 16,
    max_length: int | None = None,
    prompts_of: Callable | None = None,
) -> dict[str, Any]:
    """One encoding pass of `encoder` on `tasks`, scored at its full width and each smaller d in `dims` (truncated and
    re-normalised): {"width", "scores": {str(d): {task: nDCG@10}}, "queries": {str(d): {task: {query id: nDCG@10}}}
    (each score the mean of its queries), "encode": {"seconds", "texts", "tokens", "tokens_per_second"}}: the real
    tokens embedded (instruction, and EOS where appended, included; cut at the length) per second of encoding, which
    the pooling study reads as each pooler's inference cost. `prompts_of(config, task)` gives a task's (query
    instruction, document prefix); None: the prompt set of the encoder's style (`eval.task_embeddings`)."""
    import time

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
    """The real tokens `encoder` reads for a task's queries and documents (formatted, cut at `max_length`, EOS
    included when it appends one)."""
    query, document = prompt or prompts(encoder.config.prompt_style, task.name, encoder.config.document_prefix)
    eos = 1 if encoder.config.eos_appended else 0
    texts = encoder.format_texts(list(task.queries.values()), "query", query) + encoder.format_texts(
        [corpus_text(t) for t in task.corpus.values()], "document", document)  # fmt: skip
    lengths = [len(ids) for ids in encoder.tokenizer(texts, add_special_tokens=False)["input_ids"]]
    return sum(min(n, max_length - eos) + eos for n in lengths)


def evaluate_model(
    encoder, tasks: Sequence[RetrievalTask], dims: Sequence[int], batch_size: int = 16, max_length: int | None = None
) -> dict[str, dict[str, float]]:
    """{str(d): {task: nDCG@10}} at the encoder's full width and each smaller d in `dims`, from one encoding."""
    return evaluate_queries(encoder, tasks, dims, batch_size, max_length)["scores"]


@dataclasses.dataclass
class Setup:
    """What every training and scoring of one comparison shares: the run (which writes the cached scores), the rows
    the trainings read, where they train (`comparison/`), and how models are encoded."""

    run_dir: Any  # runs.RunDir
    rows_dir: Path
    work_dir: Path
    batch_size: int = 16
    max_length: int | None = None
    log: Callable = print


def scored_training(
    setup: Setup,
    model: ModelConfig,
    train: TrainConfig,
    tasks: Sequence[RetrievalTask],
    dims: Sequence[int],
    prompts_of: Callable | None = None,
) -> dict[str, Any]:
    """A training (`train_recipe`: reused when finished on the same rows) and its `evaluate_queries` on `tasks`, with
    "training" (its summary) and "folder". The evaluation is kept in the training's folder
    (`scores-<evaluation_key>.json`) and read back while its key holds: the tasks (queries, corpus, qrels), the
    prompts, the widths, the batch size and length (bf16 embeddings move slightly with padding) and the training's
    summary; so a resumed study re-encodes nothing it has scored."""
    import time

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
        return {**found, "training": training, "folder": str(folder)}
    start = time.perf_counter()
    encoder = encoder_from_checkpoint(training["final_checkpoint"]).eval()
    loaded = time.perf_counter() - start
    found = evaluate_queries(encoder, tasks, dims, setup.batch_size, setup.max_length, prompts_of)
    found["encode"]["load_seconds"] = loaded
    del encoder
    setup.run_dir.save_json(cached.relative_to(setup.run_dir.root), found)
    return {**found, "training": training, "folder": str(folder)}


def evaluation_key(
    tasks, prompts: dict, dims, batch_size: int, max_length: int | None, checkpoints: Path, compute: dict[str, str]
) -> str:
    """A short hash of what an evaluation of a training depends on (`scored_training`), the device and dtype it
    encodes in (`resolved_compute`) included."""
    from .mteb_code import task_fingerprint

    summary = (checkpoints / "train_summary.json").read_bytes()
    blob = json.dumps({"tasks": [task_fingerprint(t) for t in tasks], "prompts": prompts, "dims": sorted(dims),
                       "batch_size": batch_size, "max_length": max_length, "compute": compute,
                       "training": hashlib.sha256(summary).hexdigest()}, sort_keys=True)  # fmt: skip
    return hashlib.blake2b(blob.encode(), digest_size=6).hexdigest()


def sweep_entries(
    entries: Sequence[Entry], grid, seed: int, setup: Setup, validation
) -> dict[str, tuple[Any, TrainConfig]]:
    """{label: (sweep.SweepResult, the chosen TrainConfig)} of every full-width entry: each point of `grid` trained at
    `seed` (the sweep's own, `sweep_seed`: never a seed scored on test) and scored on the validation tasks of
    `validation` (`validation.ValidationSplit`, with its prompts)."""

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
    """(entry, seed, TrainConfig) of every training to score: each entry at each seed, at the rates its sweep chose
    (a projection at its parent's), or at its own rates when nothing was swept."""
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
    """{label: {seed: `scored_training` result}} on the test tasks; a projection is scored at its own width only.
    `selected`: the folders of the trainings the sweep ran (`sweep_folders`); a test training that is one of them is
    refused before it is scored (its validation score chose it, so its test score would carry that selection)."""
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
    """An entry's result for the tables: per query the mean over its seeds (`uncertainty.seed_mean`), each task's
    score the mean of those, each seed's own scores, and the mean of the seeds' training and encoding figures."""
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


def training_peak(training: dict[str, Any]) -> float | None:
    """The memory a training needed beyond loading: CUDA's peak on a GPU, else the resident peak of its training
    window, else (not Linux) the whole process's peak."""
    return training.get("peak_cuda_gb", training.get("train_peak_rss_gb", training.get("peak_rss_gb")))


def comparison_frame(results: dict[str, dict[str, Any]], bm25: dict[str, float] | None = None):
    """One row per (model, dimension): its curve (how the dimension is reached), per-task nDCG@10 x 100, their
    mean, and the training's tokens/s, peak memory (GB) and seconds on the rows of trained models.

    `results` maps a model label to {"recipe", "width", "projected" (a PMA trained to output this width), "mrl"
    (trained with MRL), "scores" ({str(d): {task: nDCG}}), "training" (a `train_recipe` summary)}."""
    import pandas as pd

    rows = []
    for label, result in results.items():
        truncation = f"{result['recipe']}: {'MRL truncation' if result['mrl'] else 'truncation'}"
        for d, per_task in result["scores"].items():
            trained = int(d) == result["width"]
            curve = f"{result['recipe']}: PMA projection" if result["projected"] else truncation
            training = result["training"] if trained else {}
            rows.append({"model": label if trained else f"{label}, truncated to {d}", "recipe": result["recipe"],
                         "dim": int(d), "curve": curve, **{t: 100 * v for t, v in per_task.items()},
                         "tokens/s": training.get("tokens_per_second"),
                         "peak memory GB": training_peak(training),
                         "train s": training.get("seconds"), "loss_first": training.get("loss_first"),
                         "loss_last": training.get("loss_last")})  # fmt: skip
    if bm25:
        rows.append({"model": "BM25", "recipe": "BM25", "dim": 0, "curve": "BM25",
                     **{t: 100 * v for t, v in bm25.items()}})  # fmt: skip
    frame = pd.DataFrame(rows).set_index("model")
    tasks = [c for c in frame.columns if c not in ("recipe", "dim", "curve", *TRAINING_COLUMNS)]
    frame.insert(3, "mean", frame[tasks].mean(axis=1))
    return frame.round(2)


def dimension_table(frame):
    """Mean nDCG@10 per curve (rows) and dimension (columns, widest first): the quality-vs-dimension plot's data.
    A PMA projection curve starts at its recipe's full width."""
    models = frame[frame["curve"] != "BM25"]
    table = models.pivot_table(index="curve", columns="dim", values="mean", aggfunc="first")
    for curve in table.index:
        if curve.endswith(": PMA projection"):
            recipe = curve.removesuffix(": PMA projection")
            full = models[(models["recipe"] == recipe) & ~models["curve"].str.endswith("PMA projection")]
            widest = full[full["dim"] == full["dim"].max()]
            if len(widest):
                table.loc[curve, int(widest["dim"].iloc[0])] = widest["mean"].iloc[0]
    return table[sorted(table.columns, reverse=True)]


def query_rows(
    results: dict[str, dict[str, Any]], bm25: dict[str, dict[str, float]] | None = None
) -> dict[str, dict[str, dict[str, float]]]:
    """{row of `comparison_frame`: {task: {query id: nDCG@10}}}: each model at full width under its label, each
    truncation as "<label>, truncated to <d>", and BM25: the per-query scores behind the table, for its intervals."""
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
    """{row: [each seed's {task: {query id: nDCG@10}}]} for the models `labels` of `score_trainings`' result, rows
    named as `query_rows` names them (a truncation under "<label>, truncated to <d>"): what the intervals over
    trainings resample (`uncertainty.training_differences`)."""
    rows: dict[str, list[dict[str, dict[str, float]]]] = {}
    for label in labels:
        runs = list(per_seed[label].values())
        for d in runs[0]["queries"]:
            name = label if int(d) == runs[0]["width"] else f"{label}, truncated to {d}"
            rows[name] = [run["queries"][d] for run in runs]
    return rows


def recipe_pairs(entries: Sequence[Entry], bm25: bool = True) -> list[tuple[str, str]]:
    """The comparisons the recipe table states with intervals: the first recipe against each other recipe (and BM25)
    at full width, and each PMA projection against its recipe's full embedding truncated to the same width."""
    recipes = [e.label for e in entries if e.study == "recipes" and not e.projected]
    if not recipes:
        return []
    pairs = [(recipes[0], other) for other in recipes[1:]] + [(recipes[0], "BM25")] * bm25
    return pairs + [(e.label, f"{e.parent}, truncated to {e.model.embedding_dim}")
                    for e in entries if e.study == "recipes" and e.projected]  # fmt: skip


def verdict(frame, dims_table, notes: Sequence[str] = (), diffs=None) -> str:
    """The outcome in plain sentences, whatever it is, from the numbers of `comparison_frame` and, when given, the
    intervals of the differences (`uncertainty.differences`: "within noise" where the interval holds 0)."""
    trained = frame.dropna(subset=["tokens/s"])
    full = trained[~trained["curve"].str.endswith("PMA projection")].sort_values("mean", ascending=False)
    lines = ["At full width, mean nDCG@10 ranks " + ", then ".join(
        f"{m} ({r['mean']:.1f}, d={int(r['dim'])})" for m, r in full.iterrows()) + "."]  # fmt: skip
    if "BM25" in frame.index:
        bm25 = frame.loc["BM25", "mean"]
        beaten = [m for m, r in full.iterrows() if r["mean"] > bm25]
        outcome = f"{', '.join(beaten)} beat it." if beaten else "no recipe beats it."
        lines.append(f"BM25 scores {bm25:.1f}; {outcome}")
    if len(dims_table.columns) > 1:
        smallest = min(dims_table.columns)
        at = dims_table[smallest].dropna().sort_values(ascending=False)
        lines.append(f"At d={smallest}: " + ", ".join(f"{c} {v:.1f}" for c, v in at.items()) + ".")
        for curve, row in dims_table.iterrows():
            row = row.dropna()
            if len(row) > 1:
                top, low = row[max(row.index)], row[min(row.index)]
                lines.append(f"{curve}: {top:.1f} at d={max(row.index)}, {low:.1f} at d={min(row.index)} "
                             f"({low - top:+.1f}).")  # fmt: skip
    speed = trained.sort_values("tokens/s", ascending=False)
    lines.append("Training throughput (real tokens/s): " + ", ".join(
        f"{m} {r['tokens/s']:.0f}" for m, r in speed.iterrows()) + "; peak memory (GB): " + ", ".join(
        f"{m} {r['peak memory GB']:.2f}" for m, r in speed.iterrows()) + ".")  # fmt: skip
    if trained["loss_first"].notna().all():
        lines.append("Training loss, mean of the first and the last 5 steps: " + ", ".join(
            f"{m} {r['loss_first']:.2f} to {r['loss_last']:.2f} ({100 * (r['loss_last'] / r['loss_first'] - 1):+.0f} %)"
            for m, r in trained.iterrows()) + ".")  # fmt: skip
    lines += difference_sentences(diffs or {})
    lines += [f"Setting: {note}." for note in notes]
    return "\n".join(f"- {line}" for line in lines)


def comparison_markdown(frame, title: str) -> str:
    """The comparison table as markdown: scores to 0.1, throughput to whole tokens/s, blanks where a column does not
    apply (a truncation trains nothing; BM25 has no dimension)."""
    columns = [c for c in frame.columns if c not in ("recipe", "curve")]
    digits = {"dim": 0, "tokens/s": 0, "peak memory GB": 2, "train s": 1, "loss_first": 2, "loss_last": 2}

    def cell(column: str, value) -> str:
        if value is None or value != value or (column == "dim" and value == 0):  # NaN != NaN
            return ""
        return f"{value:.{digits.get(column, 1)}f}"

    header = "| model | " + " | ".join(columns) + " |\n|---|" + "---|" * len(columns) + "\n"
    rows = "".join(
        f"| {m} | " + " | ".join(cell(c, frame.loc[m, c]) for c in columns) + " |\n" for m in frame.index.unique()
    )
    return f"### {title}\n\nnDCG@10 x 100 on the offline held-out tasks.\n\n{header}{rows}"


def record(
    frame, dims_table, trainings: dict[str, Any], notes: Sequence[str], compute_from: str, diffs=None
) -> dict[str, Any]:
    """What `metrics/comparison.json` holds: the table (null where a column does not apply), the curves, each
    training's summary, the fitting notes, where the run's compute was read, and the differences with their
    intervals (`uncertainty.differences_record`)."""
    curves = {c: {int(d): float(v) for d, v in dims_table.loc[c].dropna().items()} for c in dims_table.index}
    return {"table": json.loads(frame.reset_index().to_json(orient="records")), "dimensions": curves,
            "trainings": trainings, "notes": list(notes), "compute_from": compute_from,
            "differences": differences_record(diffs or {})}  # fmt: skip
