"""The C2LLM encoder (paper section 3): backbone, PMA head, baseline poolers, encode/save/load."""

from .backbone import REAL_GGUF_BACKBONE, TINY_BACKBONE
from .encoder import C2LLMEncoder
from .pma import PMAHead
from .poolers import LastTokenPooler, MeanPooler, build_pooler

__all__ = [
    "REAL_GGUF_BACKBONE",
    "TINY_BACKBONE",
    "C2LLMEncoder",
    "LastTokenPooler",
    "MeanPooler",
    "PMAHead",
    "build_pooler",
]
