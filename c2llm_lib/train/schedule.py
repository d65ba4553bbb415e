"""The optimizer schedule (paper section 4.1): warmup then cosine or linear decay, and the steps to checkpoint."""

from __future__ import annotations

import math

from ..checks import ConfigError
from ..config import TrainConfig


def lr_lambda(warmup: int, total: int, min_ratio: float, schedule: str = "cosine"):
    """Multiplier of the peak learning rate at optimizer step s (0-based): linear warmup, then decay to `min_ratio`."""
    if schedule not in ("cosine", "linear"):
        raise ValueError(f"unknown learning-rate schedule {schedule!r}; choose cosine or linear")

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        decay = 1 - progress if schedule == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
        return min_ratio + (1 - min_ratio) * decay

    return factor


def checkpoint_schedule(cfg: TrainConfig, total_steps: int) -> list[int]:
    """`checkpoint_steps` and the `checkpoint_fractions` of `total_steps` (rounded half up, at least 1; 1.0 is the
    last step), sorted and unique; one past the end is an error."""
    beyond = sorted(s for s in cfg.checkpoint_steps if s > total_steps)
    if beyond:
        raise ConfigError(
            f"parameter 'checkpoint_steps' {beyond} lie beyond this training's {total_steps} optimizer steps; "
            "lower them, or use checkpoint_fractions (e.g. [0.7, 0.8, 0.9, 1.0]), which scale with the run"
        )
    from_fractions = {min(total_steps, max(1, math.floor(f * total_steps + 0.5))) for f in cfg.checkpoint_fractions}
    return sorted(set(cfg.checkpoint_steps) | from_fractions)
