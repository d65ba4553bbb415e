"""What the notebooks and the pipeline share: the stages, their parameters cells (the rule for that cell:
docs/runner.md#notebooks-by-hand), and `open_stage`, the one call right after it.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

from .checks import ConfigError
from .config import (
    AttentionStage,
    CompareStage,
    DataStage,
    EvalStage,
    LaunchConfig,
    MergeStage,
    ModelConfig,
    SearchStage,
    TrainConfig,
    from_dict,
)
from .runs import RunDir

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
RUN_KEYS = ("run", "outputs_dir")  # every notebook declares these; the pipeline sets them
STAGES: dict[str, tuple[type, ...]] = {
    "01_data_prep": (DataStage,),
    "02_train_lora_contrastive": (ModelConfig, TrainConfig, LaunchConfig),
    "03_merge_checkpoints": (MergeStage,),
    "04_eval_mteb_code": (EvalStage,),
    "05_pma_attention": (AttentionStage,),
    "06_recipe_comparison": (CompareStage,),
    "07_search_code": (SearchStage,),
}
ON_REQUEST = ("07_search_code",)  # run only when named (--only 07): a plain run of the pipeline stops before them


def stage_keys(name: str) -> list[str]:
    """The parameters a stage's notebook must declare: the run keys and every field of its dataclasses."""
    keys = list(RUN_KEYS)
    for cls in STAGES[name]:
        keys += [f.name for f in dataclasses.fields(cls) if f.name not in keys]
    return keys


def parameters_cell(path: Path) -> tuple[int, str]:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    tagged = [(i, c) for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        raise ConfigError(f"{path}: expected exactly one cell tagged 'parameters', found {len(tagged)}")
    return tagged[0][0], tagged[0][1].source


def read_parameters(path: Path) -> dict[str, Any]:
    """{name: default} of a notebook's parameters cell; anything but annotated literal assignments is refused."""
    _, source = parameters_cell(path)
    values: dict[str, Any] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name) or node.value is None:
            raise ConfigError(f"{path}: the parameters cell may only hold annotated assignments (line {node.lineno})")
        try:
            values[node.target.id] = ast.literal_eval(node.value)
        except ValueError:
            raise ConfigError(
                f"{path}: parameter {node.target.id!r} is not a literal (line {node.lineno}); "
                "papermill cannot override derived values"
            ) from None
    return values


def open_stage(namespace: dict[str, Any], stage: str) -> tuple[Any, ...]:
    """(RunDir, *validated stage configs) from a notebook's variables (`globals()`)."""
    missing = [k for k in stage_keys(stage) if k not in namespace]
    if missing:
        raise ConfigError(f"notebook {stage}: the parameters cell lacks {missing}")
    run = RunDir.open(namespace["run"], namespace["outputs_dir"])
    configs = []
    for cls in STAGES[stage]:
        names = [f.name for f in dataclasses.fields(cls)]
        configs.append(from_dict(cls, {n: namespace[n] for n in names}, f"notebook {stage} parameters"))
    return (run, *configs)
