"""Contrastive LoRA training (paper section 4.1), on torchrun + DDP or a single process.

The parts, each readable in one sitting:
- `launch.py`: the one launcher: in this kernel (`train_stage`), through torchrun, or in a process of its own
  (`train_in_subprocess`, notebook 06's studies);
- `step.py`: `TrainStep`, one optimizer step (length-grouped micro-batches, GradCache, the loss over the global
  batch, the ranks' agreements that the loss and the weights are finite);
- `loop.py`: `Trainer`, which holds a `TrainStep`: the loop over the sampler's global batches, checkpoints, resuming;
- `checkpoints.py`: checkpoint files and the training's identity (what must match to resume or to merge);
- `state.py`: RNG and optimizer state, stored without pickle;
- `schedule.py`: warmup and decay in optimizer steps, and which steps are checkpointed;
- `cli.py`: `python -m c2llm_lib.train`, the entry point torchrun starts on every rank.

The names below are this package's public API (`from c2llm_lib.train import Trainer`).
"""

from ..batching import micro_batches  # re-exported: tests and benchmarks import it from here
from ..config import TrainConfig
from .checkpoints import (
    STATE_JSON,
    STATE_KEYS,
    STATE_TENSORS,
    Checkpoint,
    CheckpointMismatch,
    apply_weights,
    checkpoints_to_merge,
    config_differences,
    data_fingerprint,
    encoder_from_checkpoint,
    identity_differences,
    load_checkpoint_weights,
    move_aside,
    read_checkpoint,
    save_checkpoint,
    training_identity,
)
from .cli import main, split_params, throughput
from .loop import Trainer, TrainResult, most_negatives
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
from .step import NonFiniteGradients, NonFiniteLoss, NonFiniteWeights, TrainStep, head_groups

__all__ = [
    "STATE_JSON", "STATE_KEYS", "STATE_TENSORS", "Checkpoint", "CheckpointMismatch", "NonFiniteGradients",
    "NonFiniteLoss", "NonFiniteWeights", "TrainConfig", "TrainResult", "TrainStep", "Trainer", "TrainerState",
    "apply_weights", "checkpoint_schedule", "checkpoints_to_merge", "config_differences", "data_fingerprint",
    "encoder_from_checkpoint", "head_groups", "identity_differences", "load_checkpoint_weights", "lr_lambda", "main",
    "micro_batches", "most_negatives", "move_aside", "optimizer_from_state", "optimizer_to_state", "read_checkpoint",
    "rng_from_json", "rng_state", "rng_to_json", "save_checkpoint", "set_rng_state", "split_params", "throughput",
    "training_identity",
]  # fmt: skip
