"""Hydra loads sweepers only from the `hydra_plugins` namespace, in any installation (wheel, editable, --target):
resumable_optuna.py is the class Hydra instantiates, config.py registers `hydra/sweeper: tformer_optuna`; the
sweeper's logic lives in tformer_cli (sweeps/optuna_sweep.py, sweeps/optuna_space.py)."""
