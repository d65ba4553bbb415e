"""The training loop (paper section 4.1): `Trainer` holds a `TrainStep` and runs it over the sampler's global batches,
with step metrics, checkpoints and exact resuming. See docs/training.md#the-trainer.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..batching import GroupedBatchSampler
from ..checks import ConfigError, unknown_keys
from ..config import TrainConfig
from ..data.records import text_key
from ..distributed import all_gather_json, barrier
from ..files import CorruptFile, load_json
from ..model import C2LLMEncoder
from ..prompts import prompts
from .checkpoints import (
    STATE_JSON,
    Checkpoint,
    CheckpointMismatch,
    apply_weights,
    data_fingerprint,
    identity_differences,
    move_aside,
    read_checkpoint,
    save_checkpoint,
    training_identity,
)
from .schedule import checkpoint_schedule, lr_lambda
from .state import (
    TrainerState,
    optimizer_from_state,
    optimizer_to_state,
    rng_from_json,
    rng_state,
    rng_to_json,
    set_rng_state,
)
from .step import TrainStep


def most_negatives(rows) -> int:
    """The most hard negatives any row holds, from the Arrow list lengths (no text is read)."""
    import pyarrow.compute as pc

    most = 0
    for table in rows.select_columns(["negatives"]).with_format("arrow").iter(batch_size=65_536):
        most = max(most, pc.max(pc.list_value_length(table["negatives"])).as_py() or 0)
    return most


MIN_TEXT_TOKENS = 16  # the least room for text a training length must leave after the longest prompt


def unique_values(rows, column: str) -> list[str]:
    """The distinct values of a string column, from Arrow batches."""
    import pyarrow.compute as pc

    found: set[str] = set()
    for table in rows.select_columns([column]).with_format("arrow").iter(batch_size=65_536):
        found.update(pc.unique(table[column]).to_pylist())
    return sorted(found)


def longest_prompt(encoder: C2LLMEncoder, rows) -> tuple[int, str]:
    """(tokens, prompt) of the longest query instruction or document prefix the rows train with, EOS included."""
    style = encoder.config.prompt_style
    if style == "c2llm":  # each row's own instruction, the encoder's document prefix
        prefixes = [*encoder.format_texts([""], "query", None), *encoder.format_texts([""], "document")]
        prefixes += [encoder.format_texts([""], "query", ins)[0] for ins in unique_values(rows, "instruction")]
    else:  # a peer's prompt set, by dataset; a dataset it has no prompt for fails when its batch is formatted
        prefixes = []
        for dataset in unique_values(rows, "dataset"):
            try:
                query, document = prompts(style, dataset)
            except ValueError:
                continue
            prefixes += [*encoder.format_texts([""], "query", query), *encoder.format_texts([""], "document", document)]
    eos = 1 if encoder.config.eos_appended else 0
    counted = [(len(encoder.tokenizer(p, add_special_tokens=False)["input_ids"]) + eos, p) for p in prefixes]
    return max(counted, default=(eos, ""))


@dataclass
class TrainResult:
    steps: int
    metrics: list[dict[str, Any]]
    checkpoints: list[str]
    seconds: float


class Trainer:
    """Trains `encoder` (with LoRA) on `rows` (unified records), one `TrainStep.take_step` per global batch."""

    def __init__(self, encoder: C2LLMEncoder, rows, cfg: TrainConfig, checkpoint_root: str | Path | None = None):
        self.train_step = TrainStep(encoder, cfg, last_good=self.last_good)
        self.encoder, self.cfg = encoder, cfg
        self.rank, self.world_size = self.train_step.rank, self.train_step.world_size
        self.rows = rows
        self.train_step.k = min(cfg.num_negatives, most_negatives(rows))  # K: what the run asks, at most any row holds
        self.checkpoint_root = Path(checkpoint_root) if checkpoint_root is not None else None
        torch.manual_seed(cfg.seed)
        groups = list(zip(rows["dataset"], rows["language"], strict=True))
        datasets = {name for name, _ in groups}
        unknown = sorted(set(cfg.loss_weights) - datasets)
        if unknown:  # a typo would silently weigh nothing
            raise ConfigError(f"parameter 'loss_weights' names no dataset of the training rows: "
                              f"{unknown_keys(unknown, datasets)}; the rows hold {sorted(datasets)}")  # fmt: skip
        tokens, prompt = longest_prompt(encoder, rows)
        if cfg.max_length < tokens + MIN_TEXT_TOKENS:  # every query would be cut inside or just after its prompt
            raise ConfigError(f"parameter 'max_length' ({cfg.max_length} tokens) leaves no room for text: the run's "
                              f"longest prompt, {prompt!r}, takes {tokens}; give at least {tokens + MIN_TEXT_TOKENS} "
                              f"({MIN_TEXT_TOKENS} tokens of text)")  # fmt: skip
        self.sampler = GroupedBatchSampler(
            groups,
            [text_key(t) for t in rows["query"]],
            [text_key(t) for t in rows["positive"]],
            cfg.global_batch_size,
            self.world_size,
            self.rank,
            cfg.seed,
        )
        steps_per_epoch = len(self.sampler)
        if steps_per_epoch == 0:
            raise ValueError(
                f"no global batch of {cfg.global_batch_size} rows can be formed: every (dataset, language) group "
                "is smaller; lower global_batch_size"
            )
        self.total_steps = min(cfg.max_steps or steps_per_epoch * cfg.epochs, steps_per_epoch * cfg.epochs)
        self.checkpoint_steps = checkpoint_schedule(cfg, self.total_steps)
        if self.checkpoint_steps and self.checkpoint_root is None:
            raise ValueError("checkpoint_steps or checkpoint_fractions are set but no checkpoint_root was given")
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(cfg.warmup_steps, self.total_steps, cfg.min_lr_ratio, cfg.lr_schedule)
        )
        self.train_step.scheduler = self.scheduler  # the step steps it; its length is the run's
        self.metrics: list[dict[str, Any]] = []
        self.checkpoints: list[str] = []

    @property
    def optimizer(self) -> torch.optim.AdamW:
        return self.train_step.optimizer

    @property
    def step(self) -> int:
        """Optimizer steps taken: the step's own count, which its messages name."""
        return self.train_step.step

    @property
    def k(self) -> int:
        """K, the hard negatives per row the step uses."""
        return self.train_step.k

    @functools.cached_property
    def data_fingerprint(self) -> str:
        return data_fingerprint(self.rows)

    def identity(self) -> dict[str, Any]:
        """What a checkpoint must share with this trainer to be resumed by it (`training_identity`)."""
        dtype = str(next(self.encoder.base_model.parameters()).dtype).removeprefix("torch.")  # `auto` resolved
        return training_identity(self.encoder.config, self.cfg, self.data_fingerprint, self.world_size, dtype)

    def last_good(self) -> str:
        return self.checkpoints[-1] if self.checkpoints else "none written yet"

    # the loop ------------------------------------------------------------------------------------
    def train(self, on_step: Callable[[dict[str, Any]], None] | None = None, progress: bool = True) -> TrainResult:
        """Optimizer steps until `total_steps`, checkpointing as scheduled; `on_step(metrics)` after each, on every
        rank."""
        start = time.perf_counter()
        self.encoder.train()
        bar = tqdm(total=self.total_steps, initial=self.step, disable=self.rank != 0 or not progress, desc="train")
        while self.step < self.total_steps:
            for indices in self.sampler:
                batch = self.rows[indices]
                logged = self.train_step.take_step(batch)
                self.train_step.step += 1
                self.metrics.append({"step": self.step, "epoch": self.sampler.epoch, **logged})
                bar.update(1)
                bar.set_postfix(loss=f"{logged['loss']:.3f}", data=logged["dataset"][:20])
                if self.step in self.checkpoint_steps:
                    self.save(self.step)
                if on_step is not None:
                    on_step(self.metrics[-1])
                if self.step >= self.total_steps:
                    break
            else:
                self.sampler.set_epoch(self.sampler.epoch + 1)
        bar.close()
        return TrainResult(self.step, self.metrics, self.checkpoints, time.perf_counter() - start)

    def save_final(self) -> str:
        """A checkpoint of the last step, unless one was just written; returns its path."""
        name = f"step-{self.step:06d}"
        if not self.checkpoints or not self.checkpoints[-1].endswith(name):
            self.save(self.step)
        return self.checkpoints[-1]

    def save(self, step: int) -> None:
        path = self.checkpoint_root / f"step-{step:06d}"
        self.checkpoints.append(str(path))  # before the state is taken, so a resumed run lists it too
        rngs = all_gather_json(rng_to_json(rng_state()))  # every rank's own RNG, rank order
        if self.rank == 0:
            save_checkpoint(path, self.encoder, self.state(rngs))
        barrier()

    # resuming ------------------------------------------------------------------------------------
    def state(self, rngs: list[dict[str, Any]]) -> TrainerState:
        """(JSON part, optimizer tensors) of the trainer; `rngs`: every rank's `rng_to_json`, in rank order."""
        optimizer, tensors = optimizer_to_state(self.optimizer.state_dict())
        values = {
            "step": self.step,
            "training": self.identity(),
            "optimizer": optimizer,
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "rng": rngs,
            "metrics": self.metrics,
            "checkpoints": self.checkpoints,
        }
        return values, tensors

    def resume(self, checkpoint: str | Path | Checkpoint) -> None:
        """Continues a checkpoint of this same training (else refused, naming what differs), each rank with its own
        RNG."""
        checkpoint = checkpoint if isinstance(checkpoint, Checkpoint) else read_checkpoint(checkpoint)
        state, source = checkpoint.state, checkpoint.path / STATE_JSON
        differ = identity_differences(state["training"], self.identity()) if isinstance(state["training"], dict) else [
            "the checkpoint records no training identity"]  # fmt: skip
        if differ:
            raise CheckpointMismatch(
                f"{checkpoint.path} was written by another training; it differs from this run in "
                + "; ".join(differ)
                + ". Resume only with the configuration, rows and number of processes that wrote it"
            )
        if not isinstance(state["rng"], list) or len(state["rng"]) != self.world_size:
            raise CorruptFile(f"{source}: expected the RNG states of {self.world_size} rank(s)")
        rng = rng_from_json(state["rng"][self.rank], source)
        optimizer = optimizer_from_state(state["optimizer"], checkpoint.state_tensors, source)
        for saved, current in zip(optimizer["param_groups"], self.optimizer.param_groups, strict=False):
            saved.update({k: tuple(v) for k, v in saved.items() if isinstance(current.get(k), tuple)})  # betas
        apply_weights(checkpoint, self.encoder)
        try:
            self.optimizer.load_state_dict(optimizer)
            self.scheduler.load_state_dict(state["scheduler"])
            self.sampler.load_state_dict(state["sampler"])
        except (KeyError, TypeError, ValueError) as err:
            raise CorruptFile(f"{source}: the saved trainer state does not fit ({type(err).__name__}: {err})") from None
        self.train_step.step, self.metrics = int(state["step"]), state["metrics"]
        self.checkpoints = list(state["checkpoints"])
        if self.checkpoint_root is not None:  # where they are now (a run directory may have moved)
            self.checkpoints = [str(self.checkpoint_root / Path(c).name) for c in self.checkpoints]
        set_rng_state(rng)

    def resume_latest(self) -> str:
        """What notebook 02 does before training; returns a sentence saying what it did. Empty folder: step 0.
        Checkpoints of this training: resume from the last complete one (a later corrupt one moved to
        `<folder>.corrupt-<time>/`). Anything else: the folder moved to `<folder>.replaced-<time>/`, then step 0."""
        root = self.checkpoint_root
        if root is None:
            raise ValueError("resume_latest needs the checkpoint_root this trainer writes to")
        if not root.is_dir() or not any(root.iterdir()):
            return f"{root} holds no checkpoint: training from step 0"
        found = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-"))
        ours, foreign, recorded = self.identity(), [], 0
        for path in found:
            try:
                saved = load_json(path / STATE_JSON, "trainer state")["training"]
                differ = identity_differences(saved, ours)
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # unreadable: judged below, as incomplete
            recorded += 1
            if differ:
                foreign.append((path, differ))
        resume_from, notes, corrupt = None, [], []
        if not foreign and recorded:
            for path in reversed(found):
                try:
                    resume_from = read_checkpoint(path)
                    break
                except (OSError, ValueError) as err:
                    notes.append(f"{path.name} is incomplete or corrupt ({err}); falling back to the previous one.")
                    corrupt.append(path)
        barrier()  # every rank has read the folder before rank 0 moves anything
        if resume_from is None:
            if foreign:
                path, differ = foreign[0]
                why = f"{path.name} was trained with a different setup ({'; '.join(differ[:3])})"
            elif recorded:
                why = "none of its checkpoints is complete"
            else:
                why = "nothing in it records which training wrote it (another format, or no checkpoint)"
            moved = move_aside(root, "replaced") if self.rank == 0 else root
            if self.rank == 0:
                root.mkdir()
            barrier()
            return " ".join([*notes, f"{root} held no resumable checkpoint of this training: {why}. Moved it to "
                             f"{moved} (nothing deleted); training from step 0"])  # fmt: skip
        if corrupt and self.rank == 0:
            aside = root.with_name(f"{root.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
            aside.mkdir(exist_ok=True)
            for path in corrupt:
                os.replace(path, aside / path.name)
            notes.append(f"Moved {[p.name for p in corrupt]} to {aside}.")
        barrier()
        self.resume(resume_from)
        return " ".join([*notes, f"Resuming this training from {resume_from.path} (step {self.step} of "
                         f"{self.total_steps})"])  # fmt: skip
