"""benchmarks/paper_scale_plan.py, whose figures docs/paper-scale.md quotes: parameter counts against the published
totals, models built from the configs, and the tiny encoder's own LoRA and PMA head; steps per epoch; the FLOP count."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2Model

from conftest import TINY_LORA, build_tiny

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "paper_scale_plan.py"
spec = importlib.util.spec_from_file_location("paper_scale_plan", PATH)
scale = sys.modules.setdefault("paper_scale_plan", importlib.util.module_from_spec(spec))
spec.loader.exec_module(scale)


def test_backbone_counts_are_the_published_ones():
    # Qwen2.5-0.5B: 494,032,768 parameters (tied LM head); Qwen2.5-7B: 7,615,616,512 (its own LM head)
    assert scale.backbone_params(scale.QWEN25_CODER_05B, lm_head=True) == 494_032_768
    assert scale.backbone_params(scale.QWEN25_CODER_7B, lm_head=True) == 7_615_616_512


@pytest.mark.parametrize("arch", [scale.QWEN25_CODER_05B, scale.QWEN25_CODER_7B], ids=lambda a: a.name)
def test_backbone_counts_equal_a_model_built_from_the_config(arch):
    config = Qwen2Config(vocab_size=arch.vocab, hidden_size=arch.hidden, intermediate_size=arch.intermediate,
                         num_hidden_layers=arch.layers, num_attention_heads=arch.heads,
                         num_key_value_heads=arch.kv_heads, tie_word_embeddings=arch.tied)  # fmt: skip
    with torch.device("meta"):  # shapes only, no memory
        model = Qwen2Model(config)
    assert sum(p.numel() for p in model.parameters()) == scale.backbone_params(arch)


def test_lora_and_pma_counts_equal_the_tiny_encoders():
    enc = build_tiny(**TINY_LORA)  # hidden 64, intermediate 128, 2 layers, 4 heads, 2 KV heads; LoRA r = 4
    tiny = scale.Arch("tiny", 64, 2, 4, 2, 128, 151936, True)
    lora = sum(p.numel() for n, p in enc.backbone.named_parameters() if "lora_" in n)
    assert lora == scale.lora_params(tiny, r=4)
    assert sum(p.numel() for p in enc.pooler.parameters()) == scale.pma_params(64)


def test_steps_and_flops():
    plan = scale.plan(scale.Recipe(scale.QWEN25_CODER_05B), gradient_checkpointing=False)
    assert plan["steps_per_epoch"] == 11_718 and plan["steps"] == 3 * 11_718  # 3M pairs / 256, 3 epochs
    assert plan["texts_per_gpu_per_step"] == 288  # 256 rows x (query, positive, 7 negatives) / 8 GPUs
    matmul = scale.matmul_params(scale.QWEN25_CODER_05B)
    lora = scale.lora_params(scale.QWEN25_CODER_05B, 64)
    attention = 2 * 24 * 896 * 1025  # causal QK^T and AV: 2 L h (T + 1) per token
    head = 4 * 896 * 896 + 4 * 896 + 2 * 896 * 896 / 1024  # PMA at d = 896: fc_k, fc_v, scores, sum; fc_o per text
    forward = 2 * matmul + 2 * lora + attention + head
    backward = 2 * matmul + 2 * (2 * lora + attention + head)  # frozen: input gradients; LoRA, attention, head: 2x
    assert plan["flops_per_step"] == pytest.approx((forward + backward) * 256 * 9 * 1024, rel=1e-12)
    assert plan["hours"] == pytest.approx(plan["flops_total"] / (8 * 989e12 * 0.35) / 3600)
    with_gc = scale.plan(scale.Recipe(scale.QWEN25_CODER_7B), grad_cache=True)
    assert 4 < with_gc["compute_in_forwards"] < 4.1 and with_gc["total_chosen_gb"] < 80  # the 7B plan fits an H100
    assert scale.plan(scale.Recipe(scale.QWEN25_CODER_7B))["total_chosen_gb"] > 80  # without GradCache it does not
