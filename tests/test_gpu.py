"""GPU paths (bf16, flash-attention 2): skipped cleanly on machines without CUDA."""

import numpy as np
import pytest
import torch

from c2llm_lib import C2LLMEncoder, ModelConfig
from c2llm_lib.model import TINY_BACKBONE
from c2llm_lib.model.backbone import flash_attention_available

from conftest import requires_cuda

TEXTS = ["def add(a, b):\n    return a + b", "x = 1", "SELECT name FROM users;"]


@requires_cuda
def test_bf16_on_cuda_matches_float32_on_cpu():
    torch.manual_seed(0)
    gpu = C2LLMEncoder.from_config(ModelConfig(backbone=TINY_BACKBONE, device="cuda", pma_heads=4, use_lora=False))
    assert next(gpu.base_model.parameters()).dtype == torch.bfloat16  # dtype "auto" on CUDA
    assert gpu.pooler.fc_q.weight.dtype == torch.float32  # the head stays in fp32
    torch.manual_seed(0)
    cpu = C2LLMEncoder.from_config(ModelConfig(backbone=TINY_BACKBONE, device="cpu", dtype="float32", pma_heads=4,
                                                 use_lora=False))  # fmt: skip
    a, b = gpu.encode(TEXTS), cpu.encode(TEXTS)
    assert np.isfinite(a).all() and (a * b).sum(1).min() > 0.99  # cosine of bf16 vs fp32 embeddings


@requires_cuda
@pytest.mark.skipif(not flash_attention_available(), reason="flash-attn is not installed")
def test_flash_attention_matches_sdpa_with_left_padding():
    cfg = dict(backbone=TINY_BACKBONE, device="cuda", dtype="bfloat16", pma_heads=4, use_lora=False)
    torch.manual_seed(0)
    flash = C2LLMEncoder.from_config(ModelConfig(**cfg, attn_implementation="flash_attention_2"))
    torch.manual_seed(0)
    sdpa = C2LLMEncoder.from_config(ModelConfig(**cfg, attn_implementation="sdpa"))
    assert (flash.encode(TEXTS) * sdpa.encode(TEXTS)).sum(1).min() > 0.99


def test_flash_attention_is_refused_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this checks the CPU-only refusal")
    with pytest.raises(RuntimeError, match="needs CUDA"):
        C2LLMEncoder.from_config(
            ModelConfig(backbone=TINY_BACKBONE, attn_implementation="flash_attention_2", use_lora=False)
        )
