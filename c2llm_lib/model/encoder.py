"""`C2LLMEncoder`: backbone + pooler, the encode/save/load API (paper section 3, table 1): texts formatted as released,
cut on the right, padded on the left; a saved folder is self-contained (docs/encoder.md#what-it-is-made-of).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import numbers
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from tqdm.auto import tqdm
from transformers import MODEL_MAPPING, AutoConfig, AutoModel, PreTrainedTokenizerBase, Qwen2Config

from ..batching import length_batches
from ..config import ModelConfig, from_dict
from ..files import CorruptFile, atomic_directory, check_no_pickles, check_target, load_json, load_tensors
from ..hardware import resolve_device, resolve_dtype
from . import released
from .backbone import (
    add_lora,
    enable_gradient_checkpointing,
    load_backbone,
    load_saved_tokenizer,
    load_tokenizer,
    prepare_tokenizer,
    resolve_attn_implementation,
)
from .poolers import build_pooler, load_pooler_weights, save_pooler

FORMAT_VERSION = 1
KINDS = ("query", "document")
PLURALS = {"query": "queries", "document": "documents"}  # the progress bar's label
CHUNK = 4096  # texts tokenised at a time when only their token lengths are needed (`token_lengths`)


def _check_unicode(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate: no tokenizer can encode it
        raise ValueError(
            f"{what} is not valid Unicode: {text[err.start]!r} at character {err.start} is a lone surrogate "
            f"(half of a UTF-16 pair): {text!r:.80}"
        ) from None


def _check_prompt(kind: str, instruction: Any) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be 'query' or 'document', got {kind!r}")
    if instruction is None:
        return
    if not isinstance(instruction, str):
        raise TypeError(f"instruction must be a str or None, got {type(instruction).__name__}: {instruction!r:.80}")
    _check_unicode(instruction, "the instruction")


def _check_texts(texts: Any) -> list[str]:
    if isinstance(texts, str):
        raise TypeError("encode() takes a list of texts, got a single str; wrap it: encode([text])")
    if not isinstance(texts, Sequence):
        raise TypeError(f"encode() takes a list of texts, got {type(texts).__name__}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"text {i} is {type(text).__name__}, not str: {text!r:.80}")
        _check_unicode(text, f"text {i}")
    return list(texts)


def token_rows(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int, append_eos: bool
) -> list[list[int]]:
    """Token ids of formatted texts: no special tokens, cut on the right at `max_length`, with `append_eos` the EOS
    appended after the cut."""
    eos = [tokenizer.eos_token_id] if append_eos else []
    if max_length < len(eos) + 1:
        raise ValueError(f"max_length={max_length} leaves no room for text")
    if not texts:
        return []
    ids = tokenizer(
        list(texts),
        add_special_tokens=False,
        truncation=True,
        max_length=max_length - len(eos),
        return_attention_mask=False,
    )["input_ids"]
    return [row + eos for row in ids]


def tokenize_left_padded(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int, append_eos: bool
) -> dict[str, torch.Tensor]:
    """Left-padded `input_ids` and `attention_mask` (B, T) of `token_rows`. Shared with `st_modules.Backbone`."""
    rows = token_rows(tokenizer, texts, max_length, append_eos)
    width = max([1, *(len(r) for r in rows)])
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T)
    for i, row in enumerate(rows):
        if row:
            input_ids[i, width - len(row) :] = torch.tensor(row)
            attention_mask[i, width - len(row) :] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def last_hidden_states(backbone: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Last hidden states (B, T, d_LLM) of a left-padded batch, zero at padding; positions count real tokens."""
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T): real tokens count 0, 1, ...
    out = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    hidden = out.last_hidden_state  # (B, T, d_LLM)
    return hidden.masked_fill(~attention_mask.bool()[..., None], 0.0)


class C2LLMEncoder(nn.Module):
    """A code embedding model: causal backbone, then PMA (or a baseline pooler)."""

    def __init__(self, backbone: nn.Module, tokenizer: PreTrainedTokenizerBase, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.directory: Path | None = None  # the folder its weights were loaded from (from_pretrained, from_released)
        # the dtype its base was converted from the configured source in, while the base is still those tensors
        # (from_config sets it; save_pretrained and from_pretrained keep it; saved_base reads it)
        self.base_loaded_as: str | None = None
        self.backbone = backbone
        self.tokenizer = prepare_tokenizer(tokenizer)
        hidden = self.backbone_config.hidden_size
        self.pooler = build_pooler(
            config.pooling, hidden, config.embedding_dim, config.pma_heads, config.pma_score_scale
        ).to(device=self.device, dtype=torch.float32)

    # construction ---------------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: ModelConfig | dict[str, Any]) -> C2LLMEncoder:
        """A fresh encoder: backbone as configured, a newly initialised head, LoRA if asked for."""
        cfg = config if isinstance(config, ModelConfig) else from_dict(ModelConfig, config, "model config")
        backbone = load_backbone(cfg)
        if cfg.gradient_checkpointing:
            enable_gradient_checkpointing(backbone)
        if cfg.use_lora:
            backbone = add_lora(backbone, cfg)
        encoder = cls(backbone, load_tokenizer(cfg), cfg)
        encoder.base_loaded_as = _dtype_name(encoder.base_model)
        return encoder

    @property
    def device(self) -> torch.device:
        return next(self.backbone.parameters()).device

    @property
    def backbone_config(self):
        return self.base_model.config

    @property
    def base_model(self) -> nn.Module:
        return self.backbone.get_base_model() if hasattr(self.backbone, "get_base_model") else self.backbone

    @property
    def embedding_dim(self) -> int:
        return self.config.embedding_dim or self.backbone_config.hidden_size

    # text -> tokens ----------------------------------------------------------------------------
    def format_texts(self, texts: Sequence[str], kind: str = "query", instruction: str | None = None) -> list[str]:
        """Prompted texts: `instruction` and a newline (none after one ending in a space or newline) before queries, the
        document prefix (or `instruction`) before documents."""
        _check_prompt(kind, instruction)
        if kind == "query":
            prefix = "" if not instruction else instruction if instruction[-1] in " \n" else instruction + "\n"
        else:
            prefix = self.config.document_prefix if instruction is None else instruction
        return [prefix + t for t in texts]

    def tokenize(
        self,
        texts: Sequence[str],
        kind: str = "query",
        instruction: str | None = None,
        max_length: int | None = None,
    ) -> dict[str, torch.Tensor]:
        """Left-padded `input_ids` and `attention_mask` (B, T), EOS appended after truncation if configured."""
        return self.tokenize_formatted(self.format_texts(texts, kind, instruction), max_length)

    def tokenize_formatted(self, texts: Sequence[str], max_length: int | None = None) -> dict[str, torch.Tensor]:
        """Like `tokenize`, for texts that already carry their instruction or document prefix."""
        return tokenize_left_padded(
            self.tokenizer, texts, max_length or self.config.max_length, self.config.eos_appended
        )

    def token_lengths(self, texts: Sequence[str], max_length: int | None = None, chunk: int = CHUNK) -> list[int]:
        """Tokens `tokenize_formatted` gives each formatted text (EOS included), tokenised `chunk` texts at a time."""
        length, eos = max_length or self.config.max_length, self.config.eos_appended
        starts = range(0, max(len(texts), 1), chunk)  # one call without texts, for the check of `length`
        return [len(row) for s in starts for row in token_rows(self.tokenizer, texts[s : s + chunk], length, eos)]

    # tokens -> embeddings ----------------------------------------------------------------------
    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T, d_LLM); with `lora_compute: backbone` under LoRA, autocast to a 16-bit backbone's dtype (the adapter's
        matmuls too)."""
        dtype = next(self.base_model.parameters()).dtype
        wanted = self.config.lora_compute == "backbone" and self.base_model is not self.backbone
        autocast = wanted and dtype in (torch.bfloat16, torch.float16)
        with torch.autocast(self.device.type, dtype=dtype) if autocast else contextlib.nullcontext():
            return last_hidden_states(self.backbone, input_ids.to(self.device), attention_mask.to(self.device))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Unnormalised float32 embeddings (B, d) [and PMA attention (B, H, T)]."""
        hidden = self.hidden_states(input_ids, attention_mask)  # (B, T, d_LLM)
        mask = attention_mask.to(self.device)
        if return_attention:
            if self.config.pooling != "pma":
                raise ValueError(f"return_attention needs pooling='pma', this encoder uses {self.config.pooling!r}")
            return self.pooler(hidden, mask, return_attention=True)
        return self.pooler(hidden, mask)  # (B, d)

    def encode(
        self,
        texts: Sequence[str],
        *,
        kind: str = "query",
        instruction: str | None = None,
        batch_size: int = 32,
        max_length: int | None = None,
        normalize: bool = True,
        show_progress: bool | None = None,
        sort_by_length: bool = True,
    ) -> np.ndarray:
        """Embeddings of `texts` as float32 (N, d), in input order; `sort_by_length` batches texts of similar length."""
        texts = _check_texts(texts)
        _check_prompt(kind, instruction)
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral):
            raise TypeError(f"batch_size must be an int, got {type(batch_size).__name__} {batch_size!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        out = np.empty((len(texts), self.embedding_dim), dtype=np.float32)
        if not texts:
            return out
        if sort_by_length:  # texts of similar token length together: little compute is spent on padding
            lengths = [n for s in range(0, len(texts), CHUNK)
                       for n in self.token_lengths(self.format_texts(texts[s : s + CHUNK], kind, instruction),
                                                   max_length)]  # fmt: skip
            batches = length_batches(lengths, batch_size, fill=self.device.type != "cpu")
        else:
            batches = [list(range(s, min(s + batch_size, len(texts)))) for s in range(0, len(texts), batch_size)]
        show = len(batches) > 8 if show_progress is None else show_progress
        was_training = self.training
        self.eval()
        try:
            with torch.inference_mode():
                for idx in tqdm(batches, desc=f"encode {PLURALS[kind]}", disable=not show):
                    batch = self.tokenize([texts[i] for i in idx], kind, instruction, max_length)
                    emb = self(**batch)  # (b, d)
                    if normalize:
                        emb = F.normalize(emb, dim=-1)
                    out[idx] = emb.float().cpu().numpy()
        finally:
            self.train(was_training)
        return out

    # persistence -------------------------------------------------------------------------------
    def save_pretrained(self, directory: str | os.PathLike, overwrite: bool = False) -> Path:
        """Writes a self-contained directory atomically; into a symlinked folder, where the link points."""
        target = check_target(directory, overwrite)
        with atomic_directory(target) as staging:
            base = self.base_model
            weights = {
                k.replace(".base_layer", ""): v.detach().contiguous().cpu()
                for k, v in base.state_dict().items()
                if "lora_" not in k
            }
            (staging / "backbone").mkdir()
            config = copy.deepcopy(base.config)
            config.dtype = next(base.parameters()).dtype  # AutoModel's "auto" dtype reads it: the stored one, not the
            config.save_pretrained(staging / "backbone")  # loaded one (a merge upcasts a bf16 backbone to float32)
            save_file(weights, staging / "backbone" / "model.safetensors", metadata={"format": "pt"})
            if base is not self.backbone:
                self.backbone.save_pretrained(staging / "adapter")
            save_pooler(self.pooler, staging / "pooler.safetensors")  # float32, as the head computes
            self.tokenizer.save_pretrained(staging / "tokenizer")
            record = {
                "format_version": FORMAT_VERSION,
                "model": self.config.to_dict(),
                "hidden_size": self.backbone_config.hidden_size,
                "embedding_dim": self.embedding_dim,
                "backbone_dtype": _dtype_name(base),
                # the base as converted from the configured source, or None (cast or merged since: not the source's)
                "base_loaded_as": self.base_loaded_as if self.base_loaded_as == _dtype_name(base) else None,
            }
            (staging / "c2llm_config.json").write_text(json.dumps(record, indent=2) + "\n")
        return Path(directory)

    @classmethod
    def from_pretrained(
        cls,
        directory: str | os.PathLike,
        *,
        device: str | None = None,
        dtype: str | None = None,
        trainable: bool = False,
    ) -> C2LLMEncoder:
        """Loads a directory written by `save_pretrained` (LoRA kept as an adapter, trainable if asked)."""
        root = Path(directory)
        record_path = root / "c2llm_config.json"
        if not record_path.is_file():
            raise FileNotFoundError(
                f"{record_path} not found: {root} is not a C2LLMEncoder directory "
                "(for a released codefuse-ai checkpoint use C2LLMEncoder.from_released)"
            )
        record = load_json(record_path, "encoder record")
        if record.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{record_path}: format_version {record.get('format_version')} is not {FORMAT_VERSION}")
        for part in ("backbone", "tokenizer"):
            if not (root / part).is_dir():
                raise FileNotFoundError(f"{root / part}: the {part} folder is missing; {root} is incomplete")
        if not isinstance(record.get("model"), dict):
            raise CorruptFile(f"{record_path}: 'model' must hold the encoder's settings, got {record.get('model')!r}")
        saved = from_dict(ModelConfig, record["model"], str(record_path))
        if saved.use_lora != (root / "adapter").is_dir():
            raise FileNotFoundError(
                f"{record_path} says use_lora={saved.use_lora}, but {root / 'adapter'} "
                + ("is missing: the LoRA update would be lost" if saved.use_lora else "exists: it would be ignored")
            )
        cfg = dataclasses.replace(
            saved,
            device=device or saved.device,
            dtype=dtype or record.get("backbone_dtype", saved.dtype),  # the stored dtype unless told otherwise
            gradient_checkpointing=saved.gradient_checkpointing and trainable,
        )
        target_device = resolve_device(cfg.device)
        torch_dtype = resolve_dtype(cfg.dtype, target_device)
        backbone = cls._load_saved_backbone(root / "backbone", torch_dtype, cfg.attn_implementation, target_device)
        rows = backbone.get_input_embeddings().num_embeddings
        tokenizer = load_saved_tokenizer(root / "tokenizer", backbone.config, rows)
        if cfg.gradient_checkpointing:
            enable_gradient_checkpointing(backbone)
        if saved.use_lora:
            backbone = cls._load_adapter(backbone, root / "adapter", trainable)
        encoder = cls(backbone, tokenizer, cfg)
        encoder.directory = root
        encoder.base_loaded_as = record.get("base_loaded_as")  # stays true while the base keeps its stored dtype
        load_pooler_weights(encoder.pooler, root / "pooler.safetensors", record_path)
        if record.get("embedding_dim", encoder.embedding_dim) != encoder.embedding_dim:
            raise CorruptFile(f"{record_path}: embedding_dim {record['embedding_dim']} is not the loaded encoder's "
                              f"{encoder.embedding_dim}")  # fmt: skip
        return encoder

    @classmethod
    def saved_base(cls, directory: str | os.PathLike, config: ModelConfig) -> C2LLMEncoder | None:
        """An encoder of `config` (no LoRA, a fresh head) on the frozen base beside a saved LoRA adapter: the weights
        `from_config(config)` loads, read from the folder instead of converted again; None unless the folder holds an
        adapter over its base as converted from the source (`base_loaded_as`) in `config`'s dtype."""
        root = Path(directory)
        if not (root / "adapter").is_dir() or not (root / "c2llm_config.json").is_file():
            return None
        record = load_json(root / "c2llm_config.json", "encoder record")
        device = resolve_device(config.device)
        dtype = _dtype_name(resolve_dtype(config.dtype, device))
        if not record.get("backbone_dtype") == record.get("base_loaded_as") == dtype:
            return None
        attn = config.attn_implementation
        backbone = cls._load_saved_backbone(root / "backbone", getattr(torch, dtype), attn, device)
        rows = backbone.get_input_embeddings().num_embeddings
        encoder = cls(backbone, load_saved_tokenizer(root / "tokenizer", backbone.config, rows), config)
        encoder.base_loaded_as = dtype
        encoder.directory = root  # its weights come from this folder: the evaluation key hashes it
        return encoder

    @staticmethod
    def _load_adapter(backbone: nn.Module, folder: Path, trainable: bool) -> nn.Module:
        """peft's LoRA adapter of a saved folder, its weights read by `files.load_tensors`, never by peft."""
        from peft import PeftConfig, PeftModel, set_peft_model_state_dict

        check_no_pickles(folder)
        weights_file = folder / "adapter_model.safetensors"
        tensors = load_tensors(weights_file, "LoRA adapter")
        load_json(folder / "adapter_config.json", "LoRA adapter configuration")  # missing or corrupt: named
        config = PeftConfig.from_pretrained(folder)
        config.inference_mode = not trainable
        model = PeftModel(backbone, config)
        result = set_peft_model_state_dict(model, tensors)
        missing = sorted(k for k in result.missing_keys if "lora_" in k)
        if missing or result.unexpected_keys:
            raise CorruptFile(
                f"{weights_file} does not fit the adapter of {folder / 'adapter_config.json'}: missing "
                f"{missing[:5]}{' ...' if len(missing) > 5 else ''}; unexpected {sorted(result.unexpected_keys)[:5]}"
            )
        return model if trainable else model.eval()

    @staticmethod
    def _load_saved_backbone(folder: Path, dtype: torch.dtype, attn_implementation: str, device: torch.device):
        """The base model of a saved folder; a missing weight is an error listing the keys."""
        weights_file = folder / "model.safetensors"
        state = load_tensors(weights_file, "backbone weights")
        config = AutoConfig.from_pretrained(folder)
        model_class = MODEL_MAPPING[type(config)]
        backbone, info = model_class.from_pretrained(
            None,
            config=config,
            state_dict=state,
            dtype=dtype,
            attn_implementation=resolve_attn_implementation(attn_implementation, device, dtype),
            output_loading_info=True,
        )
        tied = set(getattr(backbone, "all_tied_weights_keys", None) or {})  # filled from their source weight
        missing = sorted(set(info["missing_keys"]) - tied)
        unexpected = sorted(info["unexpected_keys"])
        if missing or unexpected:
            raise ValueError(
                f"{weights_file} does not fit the backbone of {folder / 'config.json'}: missing keys {missing}; "
                f"unexpected keys {unexpected}"
            )
        backbone.config.use_cache = False
        return backbone.to(device)

    @classmethod
    def from_released(
        cls,
        directory: str | os.PathLike,
        *,
        device: str = "auto",
        dtype: str = "auto",
        attn_implementation: str = "auto",
        max_length: int = 2048,
        pooling: str = "pma",
    ) -> C2LLMEncoder:
        """A codefuse-ai/C2LLM checkpoint without remote code; `pooling` "mean" or "last_token" replaces its head."""
        root = Path(directory)
        pooler_settings, backbone_fields = released.read_released_config(root)
        if pooling != "pma":
            pooler_settings = {**pooler_settings, "embedding_dim": None}
        cfg = ModelConfig(
            backbone=str(root),
            use_lora=False,  # the release's weights are whole: no adapter
            pooling=pooling,
            device=device,
            dtype=dtype,
            attn_implementation=attn_implementation,
            max_length=max_length,
            **pooler_settings,
        )
        target_device = resolve_device(device)
        torch_dtype = resolve_dtype(dtype, target_device)
        qwen = Qwen2Config(**backbone_fields)
        backbone = AutoModel.from_config(
            qwen,
            dtype=torch_dtype,
            attn_implementation=resolve_attn_implementation(attn_implementation, target_device, torch_dtype),
        )
        backbone.config.use_cache = False
        # the release's config.json names a model type transformers does not know: the tokenizer gets the backbone's
        tokenizer = load_saved_tokenizer(root, qwen, backbone.get_input_embeddings().num_embeddings)
        encoder = cls(backbone.to(target_device), tokenizer, cfg)
        expected = set(encoder.state_dict())
        state = released.map_released_state_dict(released.read_released_weights(root), expected, head=pooling == "pma")
        encoder.load_state_dict(state, strict=True)
        encoder.directory = root
        return encoder


def _dtype_name(what: nn.Module | torch.dtype) -> str:
    """ "bfloat16" for torch.bfloat16 or a module whose first parameter has it."""
    dtype = what if isinstance(what, torch.dtype) else next(what.parameters()).dtype
    return str(dtype).removeprefix("torch.")
