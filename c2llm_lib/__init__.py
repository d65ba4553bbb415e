"""c2llm_lib: a tested implementation of C2LLM (Contrastive Code LLMs, arXiv 2512.21332).

The encoder is `C2LLMEncoder`: a Qwen2.5-Coder backbone and a PMA head (paper section 3).
"""

from .checks import ConfigError
from .config import ModelConfig
from .model import C2LLMEncoder

__version__ = "0.1.0"
__all__ = ["C2LLMEncoder", "ConfigError", "ModelConfig", "__version__"]
