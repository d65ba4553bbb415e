"""Contrastive LoRA training (paper section 4.1): `launch`, `step` (`TrainStep`), `loop` (`Trainer`), `checkpoints`,
`state`, `schedule`, `cli`. See docs/training.md#the-trainer.
"""

from ..batching import micro_batches  # re-exported: tests and benchmarks import it from here
from ..config import TrainConfig
from .checkpoints import (
    STATE_JSON,
    CheckpointMismatch,
    checkpoints_to_merge,
    data_fingerprint,
    encoder_from_checkpoint,
    identity_differences,
    move_aside,
    read_checkpoint,
    save_checkpoint,
)
from .cli import split_params, throughput
from .loop import Trainer, most_negatives
from .schedule import checkpoint_schedule, lr_lambda
from .state import optimizer_to_state
from .step import NonFiniteGradients, NonFiniteLoss, NonFiniteWeights, TrainStep, head_groups

__all__ = [
    "STATE_JSON", "CheckpointMismatch", "NonFiniteGradients", "NonFiniteLoss", "NonFiniteWeights", "TrainConfig",
    "TrainStep", "Trainer", "checkpoint_schedule", "checkpoints_to_merge", "data_fingerprint",
    "encoder_from_checkpoint", "head_groups", "identity_differences", "lr_lambda", "micro_batches", "most_negatives",
    "move_aside", "optimizer_to_state", "read_checkpoint", "save_checkpoint", "split_params", "throughput",
]  # fmt: skip
