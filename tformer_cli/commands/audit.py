"""`tformer audit`: the composed config -> the audit engine (runs/audit.py): suspected label errors and copies."""
from __future__ import annotations

from hydra.core.hydra_config import HydraConfig

from ..runs.audit import run_audit
from ..store.layout import RunDir
from ..typed_config import plain


def run(cfg) -> int:
    """The Hydra entry point; returns the number of flagged rows."""
    hydra = HydraConfig.get()
    result = run_audit(plain(cfg), list(hydra.overrides.task), RunDir(hydra.runtime.output_dir))
    return len(result.issues)
