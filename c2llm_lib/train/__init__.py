"""Contrastive LoRA training (paper section 4.1): `launch`, `step` (`TrainStep`), `loop` (`Trainer`), `checkpoints`,
`state`, `schedule`, `cli`. See docs/training.md#the-trainer.
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
