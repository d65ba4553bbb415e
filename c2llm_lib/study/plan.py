"""What notebook 06 trains: each recipe's own keys (`RECIPE_KEYS`) over the run's notebook-02 compute, so every model
sees the same rows and steps, and the pooling study's poolers (C2LLM section 3's takeaway; docs/studies.md)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ..checks import ConfigError
from ..config import PARAMS_DIR, CompareStage, ModelConfig, TrainConfig, from_dict
from ..files import MissingInput
from ..train import split_params

RECIPE_KEYS = (  # what a recipe decides; the rest is the run's compute, equal for all
    "pooling", "pma_score_scale", "append_eos", "document_prefix", "prompt_style", "lora_r", "lora_alpha",
    "lora_dropout", "lora_targets", "num_negatives", "tau", "joint_softmax", "gather_with_grad", "learning_rate",
    "pma_learning_rate", "pma_attention_learning_rate", "weight_decay", "lr_schedule", "min_lr_ratio", "max_grad_norm",
    "mrl_dims", "mrl_weights", "grad_cache",
)  # fmt: skip
RUN_RECIPE = "run recipe"  # the recipe of the pooling study's entries: notebook 02's own configuration
POOLING_LABELS = {"pma": "PMA", "last_token": "last token", "mean": "mean"}


def base_configs(run_dir) -> tuple[ModelConfig, TrainConfig, str]:
    """The run's notebook-02 configs and their source: `metrics/train.json`, else `resolved.yaml`."""
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
    """(ModelConfig, TrainConfig) of a recipe on the run's compute: LoRA on, full width, MRL at `dims`."""
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
    """One model to train: a recipe, a pooler of the pooling study, or a PMA projection of a `parent`."""

    label: str
    recipe: str
    model: ModelConfig
    train: TrainConfig
    projected: bool = False
    parent: str | None = None
    study: str = "recipes"


def projections(entry: Entry, pma_dims: Sequence[int], label: str) -> list[Entry]:
    """`entry` (PMA) projecting to each d in `pma_dims` (equations 2-3), labelled `label.format(d=d)`."""
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
    """Each recipe, each PMA recipe again at every width in `pma_dims`, then the pooling study's entries."""
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
    """The run's recipe with each pooler at full width, and PMA projecting to each d in `pma_dims`."""
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
    """The fitting rules with this run's values, as sentences for the results."""
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
    """The seeds every compared model trains with (`compare_seeds`, or notebook 02's), refusing the sweep's seed."""
    seeds = list(comparison.compare_seeds) or [base_train.seed]
    if comparison.compare_sweep and comparison.sweep_seed in seeds:
        source = "compare_seeds" if comparison.compare_seeds else "notebook 02's seed (compare_seeds is empty)"
        raise ConfigError(f"sweep_seed: {comparison.sweep_seed} is also a comparison seed ({source}: {seeds}); the "
                          "sweep's trainings are selected on validation and must not be the ones scored on test: "
                          "choose another sweep_seed")  # fmt: skip
    return seeds
