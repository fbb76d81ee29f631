"""tformer: train, evaluate and serve text classifiers built on a from-scratch Transformer encoder.

Python API (imported on first use, so `import tformer_cli` stays light):
    tformer_cli.train(overrides)      -> TrainResult     (tformer_cli/api.py)
    tformer_cli.distill(overrides)    -> TrainResult     (tformer_cli/api.py: a student of teacher=<run dir>)
    tformer_cli.Classifier.load(path) -> Classifier      (tformer_cli/classifier.py)
    tformer_cli.audit(overrides)      -> AuditResult     (tformer_cli/runs/audit.py)
    tformer_cli.suggest(run, texts, n=100) -> DataFrame  (tformer_cli/evaluation/suggestions.py)
"""
__version__ = "0.1.0"
__all__ = ["AuditResult", "Classifier", "TrainResult", "TformerError", "audit", "distill", "suggest", "train",
           "__version__"]


def __getattr__(name: str):
    if name == "Classifier":
        from .classifier import Classifier

        return Classifier
    if name in ("train", "distill", "TrainResult"):
        from . import api

        return getattr(api, name)
    if name in ("audit", "AuditResult"):
        from .runs import audit

        return getattr(audit, name)
    if name == "suggest":
        from .evaluation.suggestions import suggest

        return suggest
    if name == "TformerError":
        from .errors import TformerError

        return TformerError
    raise AttributeError(f"module 'tformer_cli' has no attribute {name!r}")
