"""The run a preflight checks: its parameters resolved exactly as the runner resolves them (params file, overlay,
`--set`, `--only`), as the stage dataclasses, and what follows from them: the backbone's architecture, the rows and
optimizer steps of the whole run, and its checkpoints (paper section 4.1: 3 epochs of ~3M pairs, 4 checkpoints).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from c2llm_lib.config import (
    CompareStage,
    DataStage,
    EvalStage,
    LaunchConfig,
    MergeStage,
    ModelConfig,
    TrainConfig,
    from_dict,
)

from ..scale import PAPER_PAIRS, QWEN25_CODER_05B, Arch, arch_of, known_arch


@dataclass
class Setup:
    """Everything a run of this params file would be given."""

    name: str
    params_file: str
    overlay: str | None
    sets: dict[str, Any]
    notebooks: list[str]  # the notebooks the run executes (all, or `--only`)
    model: ModelConfig
    train: TrainConfig
    launch: LaunchConfig
    data: DataStage
    merge: MergeStage
    evaluation: EvalStage
    compare: CompareStage
    outputs: Path
    resolved: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def run_dir(self) -> Path:
        return self.outputs / self.name

    def runs(self, number: str) -> bool:
        """Whether the run executes notebook `number` ("01" ... "06")."""
        return any(n.startswith(number) for n in self.notebooks)

    @property
    def trains(self) -> bool:
        """Whether the run trains: notebook 02, or notebook 06's recipes or pooling study on this run's compute (batch,
        length, K)."""
        compared = self.compare.compare_recipes or self.compare.compare_poolings
        return self.runs("02") or (self.runs("06") and bool(compared))


def world_size(setup: Setup, nproc: int) -> int:
    """The ranks one global batch is split over: notebook 02's nproc x nnodes (notebook 06 trains in its kernel)."""
    return nproc * setup.launch.nnodes if setup.runs("02") else 1


def _stage(cls: type, values: dict[str, Any], source: str):
    names = {f.name for f in dataclasses.fields(cls)}
    return from_dict(cls, {k: v for k, v in values.items() if k in names}, source)


def load_setup(params_file: str | Path, sets: dict[str, Any] | None = None, overlay: str | Path | None = None,
               outputs: str | Path = "outputs", only: list[str] | None = None) -> Setup:  # fmt: skip
    """The run's parameters as `pipeline.run_pipeline` resolves them; a bad file, key or value is the runner's own
    `ConfigError`, naming it."""
    from c2llm_lib.params import resolve_run

    name, given, resolved, selected = resolve_run(params_file, sets or {}, overlay, only)
    source = str(params_file)
    train_values = resolved["02_train_lora_contrastive"]
    return Setup(
        name=name, params_file=source, overlay=None if overlay is None else str(overlay), sets=dict(sets or {}),
        notebooks=selected, model=_stage(ModelConfig, train_values, source),
        train=_stage(TrainConfig, train_values, source), launch=_stage(LaunchConfig, train_values, source),
        data=_stage(DataStage, resolved["01_data_prep"], source),
        merge=_stage(MergeStage, resolved["03_merge_checkpoints"], source),
        evaluation=_stage(EvalStage, resolved["04_eval_mteb_code"], source),
        compare=_stage(CompareStage, resolved["06_recipe_comparison"], source), outputs=Path(outputs),
        resolved=resolved,
    )  # fmt: skip


def backbone_arch(model: ModelConfig) -> Arch | None:
    """The architecture of the run's backbone, without loading weights: the tiny model's, the GGUF alias's (the 0.5B),
    a local directory's config.json, or a Qwen2.5-Coder name's; None when none of these says."""
    from c2llm_lib.model.backbone import REAL_GGUF_BACKBONE, TINY_BACKBONE, tiny_qwen2_config

    if model.backbone == TINY_BACKBONE:
        return arch_of(tiny_qwen2_config(), TINY_BACKBONE)
    if model.backbone == REAL_GGUF_BACKBONE:
        return QWEN25_CODER_05B
    config = Path(model.backbone).expanduser() / "config.json"
    if config.is_file():
        try:
            return arch_of(_Attributes(json.loads(config.read_text())), model.backbone)
        except (OSError, ValueError, AttributeError):  # unreadable, not JSON, a size missing or not a number
            return known_arch(model.backbone)
    return known_arch(model.backbone)


class _Attributes:
    """A config.json's keys as attributes (what `arch_of` reads), with transformers' defaults where it omits one."""

    def __init__(self, values: dict[str, Any]):
        if not isinstance(values, dict):
            raise ValueError("config.json must hold an object")
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:  # only called for a missing key
        if name in ("num_key_value_heads", "tie_word_embeddings", "name_or_path"):
            return None
        raise AttributeError(name)


@dataclass(frozen=True)
class RowCount:
    """How many training rows the run will see per (dataset, language) group, and where the count comes from."""

    groups: dict[str, int]  # "dataset/language" -> rows
    source: str  # a sentence: the run's prepared data, the offline snapshot, the mirror, or the paper's figure
    exact: bool  # False: an upper bound or the paper's figure

    @property
    def rows(self) -> int:
        return sum(self.groups.values())

    def steps_per_epoch(self, global_batch: int) -> int:
        """Global batches per epoch: each group gives whole batches, remainders are dropped (`batching.py`)."""
        return sum(n // global_batch for n in self.groups.values())


def prepared_rows(run_dir: Path) -> RowCount | None:
    """The rows notebook 01 prepared for this run (`data/train`), read without writing anything; None if absent."""
    path = run_dir / "data" / "train"
    if not (path / "dataset_info.json").is_file() and not (path / "state.json").is_file():
        return None
    from datasets import load_from_disk

    try:
        table = load_from_disk(str(path)).select_columns(["dataset", "language"])
    except Exception:  # unreadable: notebook 02 will say so; the preflight falls back to the estimates
        return None
    groups = Counter(f"{d}/{lang}" for d, lang in zip(table["dataset"], table["language"], strict=True))
    return RowCount(dict(groups), f"the run's prepared data ({path}, {sum(groups.values()):,} rows)", True)


def offline_rows(data: DataStage) -> RowCount:
    """The offline snapshot's training rows per group, capped at `rows_per_group` (before decontamination)."""
    from c2llm_lib.data.offline import load_snapshot

    groups = Counter(f"{r['dataset']}/{r['language']}" for r in load_snapshot() if r["split"] == "train")
    if data.rows_per_group is not None:
        groups = Counter({k: min(n, data.rows_per_group) for k, n in groups.items()})
    return RowCount(dict(groups), "the offline snapshot's training rows (before decontamination: at most)", False)


def row_count(setup: Setup, mirror_groups: dict[str, int] | None = None, own: RowCount | None = None) -> RowCount:
    """The run's training rows: notebook 01's product when it has run, else the user's files or code as the inputs
    check read them (`own`; no rows, an unknown count, when they were not read), else the offline snapshot, else the
    mirror's training pairs (`mirror_groups`, counted by the inputs check), else the paper's ~3M pairs."""
    found = prepared_rows(setup.run_dir)
    if found is not None:
        return found
    if own is not None:
        return own
    if setup.data.data_source in ("files", "code"):  # the user's data, unread or unreadable: no estimate stands in
        return RowCount({}, f"unknown: your {setup.data.data_source} were not read (see inputs/training data)", False)
    if setup.data.data_source == "offline":
        return offline_rows(setup.data)
    if mirror_groups:
        cap = setup.data.rows_per_group
        groups = {k: n if cap is None else min(n, cap) for k, n in mirror_groups.items()}
        return RowCount(groups, "the training pairs in hub_mirror (before decontamination and deduplication: at most)",
                        False)  # fmt: skip
    per_group = PAPER_PAIRS if setup.data.rows_per_group is None else setup.data.rows_per_group
    return RowCount({"paper": per_group}, f"the paper's ~{PAPER_PAIRS / 1e6:.0f}M pairs (section 4.1; no data "
                    "prepared yet and the sources' sizes unknown)", False)  # fmt: skip


def total_steps(train: TrainConfig, rows: RowCount) -> int:
    """The run's optimizer steps, as `Trainer` counts them: epochs of whole global batches, capped at max_steps."""
    full = rows.steps_per_epoch(train.global_batch_size) * train.epochs
    return min(train.max_steps, full) if train.max_steps else full
