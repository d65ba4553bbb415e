"""Typed parameters, one dataclass per stage, validated on construction.

Parameters are flat (one level of keys) so that a params file is a list of overrides and papermill can
pass each notebook the keys it declares. `from_dict` refuses unknown keys (with a did-you-mean) and
values of the wrong type or range, naming the source (a file, a notebook) and the key.

`ModelConfig` holds the encoder of section 3 of the paper; the defaults are the released
C2LLM-0.5B's architecture (Qwen2.5-Coder-0.5B-Instruct, PMA with 32 heads, d = d_LLM, left padding)
and the paper's LoRA (section 4.1: r = 64, alpha = 32 on every projection).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

C = TypeVar("C")

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class ConfigError(ValueError):
    """A parameter that does not exist, or has the wrong type or value; the message names it."""


def _matches(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(annotation))
    if origin is Literal:
        return value in typing.get_args(annotation)
    if origin is list:
        (item,) = typing.get_args(annotation) or (Any,)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def _describe(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in typing.get_args(annotation))
    if origin is Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(annotation))
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type) and origin is None:
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def from_dict(cls: type[C], data: dict[str, Any], source: str = "parameters") -> C:
    """Builds `cls` from `data`, refusing unknown keys and ill-typed values with a message naming them."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of parameter names to values, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, names, n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ConfigError(f"{source}: unknown parameter {', '.join(hints)} for {cls.__name__}")
    try:
        return cls(**data)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def check_types(obj: Any) -> None:
    """Checks every field of a dataclass instance against its annotation."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if not _matches(value, hints[f.name]):
            raise ConfigError(
                f"parameter {f.name!r} must be {_describe(hints[f.name])}, got {value!r} ({type(value).__name__})"
            )


def require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"parameter {key!r} {message}")


@dataclass
class ModelConfig:
    """The encoder: backbone, pooler and LoRA (paper section 3 and 4.1)."""

    backbone: str = "Qwen/Qwen2.5-Coder-0.5B-Instruct"  # hub id, local directory, or a directory holding gguf_file
    backbone_revision: str | None = None  # pin a hub commit; unpinned hub loads warn
    gguf_file: str | None = None  # file name inside `backbone` (a directory) to load a GGUF checkpoint
    pooling: Literal["pma", "last_token", "mean"] = "pma"
    pma_heads: int = 32
    embedding_dim: int | None = None  # PMA output dimension d; None = the backbone's hidden size
    pma_score_scale: Literal["full_width", "per_head"] = "full_width"  # released: 1/sqrt(d)
    append_eos: bool | None = None  # None: only for last_token pooling (EOS added after truncation)
    max_length: int = 1024  # tokens, instruction and EOS included (paper: 1024 training, 2048 eval)
    document_prefix: str = "Retrieved Answer:"  # prepended to documents with no separator (released)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bf16 on CUDA, fp32 on CPU
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2"] = "auto"
    device: str = "auto"  # auto: cuda when available, else cpu
    use_lora: bool = False
    lora_r: int = 64
    lora_alpha: int = 32
    lora_dropout: float = 0.0  # not stated in the paper
    lora_targets: list[str] = field(default_factory=lambda: list(LORA_TARGETS))
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        check_types(self)
        require(self.pma_heads > 0, "pma_heads", f"must be positive, got {self.pma_heads}")
        require(self.embedding_dim is None or self.embedding_dim > 0, "embedding_dim", "must be positive")
        if self.embedding_dim is not None:
            require(
                self.embedding_dim % self.pma_heads == 0,
                "embedding_dim",
                f"({self.embedding_dim}) must be divisible by pma_heads ({self.pma_heads})",
            )
            require(self.pooling == "pma", "embedding_dim", "can only be set with pooling='pma'")
        require(self.max_length >= 2, "max_length", f"must be at least 2 tokens, got {self.max_length}")
        require(self.lora_r > 0, "lora_r", f"must be positive, got {self.lora_r}")
        require(0.0 <= self.lora_dropout < 1.0, "lora_dropout", f"must be in [0, 1), got {self.lora_dropout}")
        require(bool(self.lora_targets), "lora_targets", "must name at least one module")
        require(bool(self.backbone), "backbone", "must not be empty")

    @property
    def eos_appended(self) -> bool:
        return self.pooling == "last_token" if self.append_eos is None else self.append_eos

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
