"""`tformer pretrain`: the composed config -> the run engine's masked-LM job (runs/pretraining.py)."""
from __future__ import annotations

from hydra.core.hydra_config import HydraConfig

from ..store.layout import RunDir
from ..runs.pretraining import pretrain
from ..typed_config import plain


def run(cfg) -> float:
    """The Hydra entry point; returns the best validation MLM loss."""
    hydra = HydraConfig.get()
    return pretrain(plain(cfg), RunDir(hydra.runtime.output_dir), list(hydra.overrides.task),
                    model_name=hydra.runtime.choices.get("model"))
