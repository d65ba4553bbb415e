"""ModelConfig validation: unknown keys, types and ranges are refused with the key named."""

import pytest

from c2llm_lib.checks import ConfigError
from c2llm_lib.config import ModelConfig, from_dict


def test_defaults_are_the_released_architecture_and_the_papers_lora():
    """Notebook 02's defaults (tests/test_notebook_params.py): the released backbone from its PyPI GGUF, PMA with 32
    heads, LoRA r = 64, alpha = 32 on every projection (the hub backbone is params/c2llm-0.5b.yaml's)."""
    cfg = ModelConfig()
    assert cfg.backbone == "pypi-gguf:Qwen2.5-Coder-0.5B-Instruct" and cfg.pooling == "pma" and cfg.pma_heads == 32
    assert cfg.use_lora and (cfg.lora_r, cfg.lora_alpha) == (64, 32)
    assert cfg.lora_targets == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert cfg.document_prefix == "Retrieved Answer:" and not cfg.eos_appended
    assert ModelConfig(pooling="last_token").eos_appended and not ModelConfig(pooling="mean").eos_appended


def test_unknown_key_is_named_with_a_suggestion():
    expected = r"params/x.yaml: unknown parameter 'pma_head' \(did you mean 'pma_heads'\?\)"
    with pytest.raises(ConfigError, match=expected):
        from_dict(ModelConfig, {"pma_head": 8}, "params/x.yaml")


@pytest.mark.parametrize(
    "values,message",
    [
        ({"pma_heads": "32"}, "'pma_heads' must be int"),
        ({"pma_heads": True}, "'pma_heads' must be int"),
        ({"pooling": "cls"}, "'pooling' must be"),
        ({"lora_dropout": 1.5}, "'lora_dropout' must be in"),
        ({"embedding_dim": 100}, "'embedding_dim' .* divisible by pma_heads"),
        ({"embedding_dim": 128, "pooling": "mean"}, "only be set with pooling='pma'"),
        ({"max_length": 1}, "'max_length' must be at least 2"),
        ({"lora_targets": []}, "'lora_targets' must name"),
        ({"lora_targets": "q_proj"}, "'lora_targets' must be list"),
    ],
)
def test_bad_values_are_refused(values, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(ModelConfig, values, "test")


def test_not_a_mapping():
    with pytest.raises(ConfigError, match="expected a mapping"):
        from_dict(ModelConfig, ["pooling"], "params/y.yaml")


def test_float_accepts_integers():
    assert ModelConfig(lora_dropout=0).lora_dropout == 0
