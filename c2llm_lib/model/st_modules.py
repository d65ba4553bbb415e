"""The encoder as sentence-transformers modules (paper section 3): `Backbone` and `Pooler` run the encoder's own
functions and check what they load; `export.load_export` checks `modules.json` before they are imported.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from sentence_transformers.base.modules import InputModule, Module
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..files import CorruptFile, load_json
from .backbone import load_saved_tokenizer, prepare_tokenizer
from .encoder import C2LLMEncoder, last_hidden_states, tokenize_left_padded
from .poolers import POOLINGS, build_pooler, load_pooler_weights, save_pooler

DTYPES = ("float32", "bfloat16", "float16")  # what `Backbone.torch_dtype` may name
Rules = dict[str, tuple[Any, str]]  # setting -> (its check, what it must be)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_settings(path: Path, rules: Rules, what: str) -> dict[str, Any]:
    """The settings file `path`; raises `CorruptFile` naming the file and key for a missing, unknown or invalid one."""
    settings = load_json(path, what)
    unknown, missing = sorted(set(settings) - set(rules)), sorted(set(rules) - set(settings))
    if unknown or missing:
        raise CorruptFile(f"{path}: unknown keys {unknown}, missing keys {missing}; expected {sorted(rules)}")
    for key, (valid, wanted) in rules.items():
        if not valid(settings[key]):
            raise CorruptFile(f"{path}: {key} must be {wanted}, got {settings[key]!r}")
    return settings


BACKBONE_RULES = {
    "max_seq_length": (lambda v: _integer(v) and v >= 2, "an int of at least 2"),
    "append_eos": (lambda v: isinstance(v, bool), "true or false"),
    "torch_dtype": (lambda v: v in DTYPES, f"one of {list(DTYPES)}"),
}
POOLER_RULES = {
    "pooling": (lambda v: v in POOLINGS, f"one of {list(POOLINGS)}"),
    "hidden_size": (lambda v: _integer(v) and v > 0, "a positive int"),
    "embedding_dim": (lambda v: v is None or (_integer(v) and v > 0), "null or a positive int"),
    "pma_heads": (lambda v: _integer(v) and v > 0, "a positive int"),
    "pma_score_scale": (lambda v: v in ("full_width", "per_head"), "'full_width' or 'per_head'"),
}
HUB = ("token", "cache_folder", "revision", "local_files_only")  # the hub arguments sentence-transformers passes


def _load_settings(module: type[Module], path: str, subfolder: str, kwargs: dict[str, Any], rules: Rules, what: str):
    """(the module's folder on disk, downloaded first when `path` is a hub id; its checked settings file)."""
    folder = module.load_dir_path(path, subfolder, **{k: v for k, v in kwargs.items() if k in HUB})
    if folder is None:
        raise FileNotFoundError(f"{path}/{subfolder}: no such folder")
    return Path(folder), read_settings(Path(folder) / module.config_file_name, rules, what)


class Backbone(InputModule):
    """Tokenizer and causal backbone: formatted texts -> `token_embeddings` (B, T, d_LLM), zero at padding."""

    config_file_name = "c2llm_backbone.json"
    config_keys = ["max_seq_length", "append_eos", "torch_dtype"]
    save_in_root = True

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, max_seq_length: int, append_eos: bool
    ) -> None:
        super().__init__()
        self.auto_model = model
        self.tokenizer = prepare_tokenizer(tokenizer)
        self.max_seq_length = max_seq_length
        self.append_eos = append_eos

    @property
    def torch_dtype(self) -> str:
        """The dtype the backbone's weights are stored and loaded in (config.json's own field can be stale)."""
        return str(next(self.auto_model.parameters()).dtype).removeprefix("torch.")

    def preprocess(self, inputs, prompt: str | None = None, **kwargs) -> dict[str, torch.Tensor]:
        texts = [(prompt or "") + text for text in inputs]
        return tokenize_left_padded(self.tokenizer, texts, self.max_seq_length, self.append_eos)

    def forward(self, features: dict[str, torch.Tensor], **kwargs) -> dict[str, torch.Tensor]:
        hidden = last_hidden_states(self.auto_model, features["input_ids"], features["attention_mask"])  # (B, T, d)
        features["token_embeddings"] = hidden
        return features

    def get_embedding_dimension(self) -> int:
        return self.auto_model.config.hidden_size

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        self.auto_model.save_pretrained(output_path, safe_serialization=True)
        self.save_tokenizer(output_path)
        self.save_config(output_path)

    @classmethod
    def load(
        cls, model_name_or_path: str, subfolder: str = "", model_kwargs: dict[str, Any] | None = None, **kwargs
    ) -> Backbone:
        folder, settings = _load_settings(
            cls, model_name_or_path, subfolder, kwargs, BACKBONE_RULES, "backbone settings"
        )
        model_kwargs = dict(model_kwargs or {})
        dtype = model_kwargs.pop("dtype", None) or model_kwargs.pop("torch_dtype", None)
        dtype = getattr(torch, dtype) if isinstance(dtype, str) and dtype != "auto" else dtype
        dtype = dtype if isinstance(dtype, torch.dtype) else getattr(torch, settings["torch_dtype"])
        attn = model_kwargs.pop("attn_implementation", "auto")
        # the weights read by files.load_tensors, a missing or unexpected tensor an error (C2LLMEncoder's loader)
        model = C2LLMEncoder._load_saved_backbone(folder, dtype, attn, torch.device("cpu"))
        tokenizer = load_saved_tokenizer(folder, model.config, model.get_input_embeddings().num_embeddings)
        return cls(model, tokenizer, settings["max_seq_length"], settings["append_eos"])


class Pooler(Module):
    """`token_embeddings` (B, T, d_LLM) and `attention_mask` (B, T) -> `sentence_embedding` (B, d), unnormalised."""

    config_keys = ["pooling", "hidden_size", "embedding_dim", "pma_heads", "pma_score_scale"]

    def __init__(
        self,
        pooling: str,
        hidden_size: int,
        embedding_dim: int | None = None,
        pma_heads: int = 32,
        pma_score_scale: str = "full_width",
    ) -> None:
        super().__init__()
        self.pooling, self.hidden_size, self.embedding_dim = pooling, hidden_size, embedding_dim
        self.pma_heads, self.pma_score_scale = pma_heads, pma_score_scale
        self.pooler = build_pooler(pooling, hidden_size, embedding_dim, pma_heads, pma_score_scale).float()

    def forward(self, features: dict[str, torch.Tensor], **kwargs) -> dict[str, torch.Tensor]:
        mask = features["attention_mask"]  # (B, T)
        features["sentence_embedding"] = self.pooler(features["token_embeddings"], mask)  # (B, d), float32
        return features

    def get_embedding_dimension(self) -> int:
        return self.embedding_dim or self.hidden_size

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        self.save_config(output_path)
        save_pooler(self.pooler, os.path.join(output_path, "model.safetensors"))  # float32, its head recorded

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", **kwargs) -> Pooler:
        folder, config = _load_settings(cls, model_name_or_path, subfolder, kwargs, POOLER_RULES, "pooler config")
        settings = folder / cls.config_file_name
        try:
            module = cls(**config)
        except ValueError as err:  # e.g. a width the heads do not divide
            raise CorruptFile(f"{settings}: {err}") from None
        weights = folder / "model.safetensors"
        if weights.is_file() or any(True for _ in module.pooler.parameters()):  # mean and last token: no weights
            load_pooler_weights(module.pooler, weights, settings)  # the head recorded in it must be this one
        return module

    def __repr__(self) -> str:
        return f"Pooler({json.dumps(self.get_config_dict())})"
