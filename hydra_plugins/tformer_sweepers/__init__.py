"""Hydra loads sweepers only from the `hydra_plugins` namespace; tformer's live in tformer_cli
(sweeps/optuna_sweep.py)."""
