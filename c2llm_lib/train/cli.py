"""`python -m c2llm_lib.train`: the entry point torchrun starts on every rank, and its report of throughput and peak
memory. A named error prints one `error: ...` line and exits 1.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from ..checks import ConfigError
from ..config import LaunchConfig, ModelConfig, TrainConfig, from_dict
from ..distributed import all_gather_json, die_with_parent, init_distributed
from ..hardware import peak_memory, reset_peak_memory
from ..model import C2LLMEncoder
from .checkpoints import identity_differences, training_identity
from .loop import Trainer


def throughput(metrics: list[dict[str, Any]]) -> dict[str, float]:
    """Steps, step seconds, real tokens, tokens per second and padding efficiency (real tokens / computed slots)."""
    seconds = sum(m["seconds"] for m in metrics)
    tokens = sum(m["tokens"] for m in metrics)
    out = {
        "steps": len(metrics),
        "seconds": seconds,
        "tokens": tokens,
        "tokens_per_second": tokens / max(seconds, 1e-9),
    }
    recorded = [m for m in metrics if m.get("padding_efficiency")]
    if recorded:
        slots = sum(m["tokens"] / m["padding_efficiency"] for m in recorded)
        out["padding_efficiency"] = sum(m["tokens"] for m in recorded) / slots
    return out


def split_params(params: dict[str, Any], source: str) -> tuple[ModelConfig, TrainConfig]:
    """A flat params mapping -> (ModelConfig, TrainConfig); notebook 02's launch keys are checked and set aside."""
    import dataclasses

    keys = {cls: {f.name for f in dataclasses.fields(cls)} for cls in (LaunchConfig, ModelConfig, TrainConfig)}
    unknown = sorted(set(params).difference(*keys.values()))
    if unknown:
        raise ConfigError(f"{source}: unknown parameter(s) {unknown} (neither a model nor a training parameter)")
    _, model, train = [
        from_dict(cls, {k: v for k, v in params.items() if k in names}, source) for cls, names in keys.items()
    ]
    return model, train


def agree_with_rank_0(identity: dict[str, Any]) -> None:
    """Raises on every rank, naming the ranks and what differs, unless all training identities equal rank 0's."""
    identities = all_gather_json(identity)
    differ = {r: identity_differences(identities[0], theirs) for r, theirs in enumerate(identities)}
    differ = {r: d for r, d in differ.items() if d}
    if differ:
        what = "; ".join(
            f"rank {r}: {'; '.join(d)}".replace("in the checkpoint", "on rank 0") for r, d in differ.items()
        )
        raise ValueError(f"rank(s) {sorted(differ)} would train something else than rank 0 ({what}): every machine "
                         "needs the same params, the same prepared rows and the same resolved dtype")  # fmt: skip


def read_params(path: str) -> dict[str, Any]:
    """The flat YAML mapping of a params file; anything else is a ConfigError naming it."""
    import yaml

    try:
        params = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise ConfigError(f"--params {path}: no such file") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"--params {path}: not UTF-8 text (byte {err.object[err.start]:#04x} at {err.start})"
        ) from None
    except OSError as err:
        raise ConfigError(f"--params {path}: cannot be read ({type(err).__name__}: {err.strerror})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(
            f"--params {path}: does not parse as YAML: {getattr(err, 'problem', None) or err}{where}"
        ) from None
    if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
        raise ConfigError(f"--params {path}: must be a flat mapping of parameter names to values")
    return params


def read_rows(path: str):
    """The prepared rows (a `datasets.save_to_disk` folder); a missing or empty folder is a ConfigError naming it."""
    from datasets import load_from_disk

    if not Path(path).is_dir():
        raise ConfigError(f"--rows {path}: no such folder (a prepared dataset, e.g. outputs/<run>/data/train)")
    try:
        return load_from_disk(path)
    except FileNotFoundError as err:  # datasets: "... is neither a `Dataset` directory nor a `DatasetDict` directory"
        raise ConfigError(f"--rows {path}: not a prepared dataset ({err})") from None


def main(argv: list[str] | None = None) -> None:
    """torchrun [--nproc_per_node N] -m c2llm_lib.train --params P --rows DATA --out CKPTS [--resume CKPT |
    --resume-latest] [--record-dir DIR]; rank 0 writes its step log and summary into DIR (default CKPTS). A named error
    prints one `error: ...` line and exits 1; other exceptions keep their traceback."""
    try:
        train_from_arguments(argv)
    except ConfigError as err:
        one_line = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
        print(f"error: {one_line}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def train_from_arguments(argv: list[str] | None) -> None:
    """`main` without its one-line errors."""
    import argparse

    if "TORCHELASTIC_RUN_ID" in os.environ:  # a torchrun rank: it dies with torchrun, never orphaned
        die_with_parent()

    parser = argparse.ArgumentParser(description="Contrastive LoRA training of a C2LLM encoder (paper section 4.1)")
    parser.add_argument("--params", required=True, help="flat YAML of model and training parameters")
    parser.add_argument("--rows", required=True, help="a prepared dataset (datasets.save_to_disk folder)")
    parser.add_argument("--out", required=True, help="folder for the checkpoints (must be new unless resuming)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--resume", default=None, help="a checkpoint folder to continue from")
    group.add_argument("--resume-latest", action="store_true",
                       help="as notebook 02: resume this training's last complete checkpoint in --out, or move "
                       "another training's checkpoints aside and start at step 0")  # fmt: skip
    parser.add_argument("--record-dir", default=None,
                        help="where rank 0 writes its step log and summary (default: --out)")  # fmt: skip
    args = parser.parse_args(argv)
    params = read_params(args.params)
    model_cfg, train_cfg = split_params(params, args.params)
    out = Path(args.out)
    logs = Path(args.record_dir) if args.record_dir else out
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: is a file, not a folder for the checkpoints")
    if out.exists() and any(out.iterdir()) and args.resume is None and not args.resume_latest:
        raise ConfigError(f"--out {out} already holds checkpoints; pass --resume CHECKPOINT or choose a new --out")
    if not model_cfg.use_lora:
        raise ConfigError(f"{args.params}: training needs use_lora: true")
    rows = read_rows(args.rows)
    rank, world_size = init_distributed()
    if model_cfg.device in ("auto", "cuda") and torch.cuda.is_available():  # each process on its own GPU
        model_cfg.device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    torch.manual_seed(train_cfg.seed)
    encoder = C2LLMEncoder.from_config(model_cfg)
    trainable = sum(p.numel() for p in encoder.parameters() if p.requires_grad)
    dtype = str(next(encoder.base_model.parameters()).dtype).removeprefix("torch.")  # `dtype: auto` resolved here
    # before DDP's constructor (which broadcasts rank 0's weights: it needs equal dtypes), the configs; after it,
    # with the rows' fingerprint, the whole identity
    agree_with_rank_0(training_identity(encoder.config, train_cfg, "", world_size, dtype))
    trainer = Trainer(encoder, rows, train_cfg, out)
    agree_with_rank_0(trainer.identity())
    note = f"Resuming from {args.resume}" if args.resume else "training from step 0"
    if args.resume:
        trainer.resume(args.resume)
    elif args.resume_latest:
        note = trainer.resume_latest()
    steps_log = logs / "steps.jsonl"
    if rank == 0:
        logs.mkdir(parents=True, exist_ok=True)
        header = {"total_steps": trainer.total_steps, "step": trainer.step, "world_size": world_size, "note": note}
        steps_log.write_text(json.dumps(header) + "\n")

    def on_step(metrics: dict[str, Any]) -> None:
        if rank == 0:
            with steps_log.open("a") as fh:
                fh.write(json.dumps(metrics) + "\n")

    reset_peak_memory()
    result = trainer.train(on_step=on_step)
    trainer.save_final()
    if rank == 0:
        (logs / "train_metrics.json").write_text(json.dumps(trainer.metrics, indent=1) + "\n")
        summary = {**throughput(trainer.metrics), **peak_memory(), "world_size": world_size,
                   "final_checkpoint": trainer.checkpoints[-1], "checkpoints": trainer.checkpoints,
                   "checkpoint_steps": trainer.checkpoint_steps, "total_steps": trainer.total_steps,
                   "train_seconds": result.seconds, "data_fingerprint": trainer.data_fingerprint,
                   "trainable_parameters": trainable, "note": note, "negatives_used": trainer.k,
                   "dtype": trainer.identity()["model_config"]["dtype"]}  # fmt: skip
        (logs / "train_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(
            f"trained {result.steps} steps on {world_size} process(es) in {result.seconds:.1f}s; checkpoints in {out}"
        )
    if world_size > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
