"""The model families tformer reads from Hugging Face folders: each module registers itself in `FAMILIES` (by
config.json `model_type`); this package imports them all, so `FAMILIES` is complete once it is imported."""
from . import bert  # noqa: F401  (registers)
from . import deberta  # noqa: F401
from . import distilbert  # noqa: F401
from . import electra  # noqa: F401
from . import modernbert  # noqa: F401
from . import roberta  # noqa: F401
from .base import FAMILIES, Family, ModelConfig, Tensors

__all__ = ["FAMILIES", "Family", "ModelConfig", "Tensors"]
