"""Truncation known answer, and a trained encoder gets its own fingerprint."""

import dataclasses

import numpy as np
import pytest
import torch

from c2llm_lib import ModelConfig
from c2llm_lib.config import TrainConfig
from c2llm_lib.eval.mteb import fingerprint
from c2llm_lib.model import C2LLMEncoder
from c2llm_lib.retrieval import Truncated
from c2llm_lib.train import Trainer

from training_rows import make_rows


def train_variant(model: ModelConfig, train: TrainConfig, rows) -> C2LLMEncoder:
    """A fresh encoder of configuration `model`, trained with the recipe `train` on `rows` (no checkpoints)."""
    torch.manual_seed(train.seed)
    encoder = C2LLMEncoder.from_config(dataclasses.replace(model, use_lora=True))
    Trainer(encoder, rows, dataclasses.replace(train, checkpoint_steps=[], checkpoint_fractions=[])).train()
    return encoder.eval()


def test_truncation_known_answer(make_encoder):
    enc = make_encoder(pma_heads=4)
    texts = ["def f(x):\n    return x", "print(1)"]
    full = enc.encode(texts, normalize=False)
    cut = Truncated(enc, 8).encode(texts)
    expected = full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(cut, expected, rtol=1e-6)
    with pytest.raises(ValueError, match="truncate"):
        Truncated(enc, 1000)


def test_a_variant_trains_and_gets_its_own_fingerprint(make_encoder):
    cfg = ModelConfig(backbone="tiny-random-qwen2", device="cpu", dtype="float32", pma_heads=4, lora_r=4,
                      lora_alpha=8, embedding_dim=16)  # fmt: skip
    train = TrainConfig(max_steps=2, global_batch_size=4, num_negatives=1, max_length=64, warmup_steps=0,
                        checkpoint_steps=[])  # fmt: skip
    encoder = train_variant(cfg, train, make_rows())
    assert encoder.embedding_dim == 16 and not encoder.training
    untrained = make_encoder(pma_heads=4, use_lora=True, lora_r=4, lora_alpha=8, embedding_dim=16)
    assert fingerprint(encoder) != fingerprint(untrained)
    assert fingerprint(untrained) == fingerprint(make_encoder(pma_heads=4, use_lora=True, lora_r=4, lora_alpha=8,
                                                              embedding_dim=16))  # fmt: skip
    assert fingerprint(Truncated(encoder, 8)) != fingerprint(encoder)
