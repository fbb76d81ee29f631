"""`hydra.sweeper._target_: hydra_plugins.tformer_sweepers.resumable_optuna.ResumableOptunaSweeper`.

Hydra imports every public module of `hydra_plugins` at each start, so this one imports nothing heavy: Optuna and
the sweeper's logic (tformer_cli/sweeps/optuna_sweep.py) load only when a sweep uses it."""
from typing import Any

from hydra.plugins.sweeper import Sweeper


class ResumableOptunaSweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        from tformer_cli.sweeps.optuna_sweep import resumable_impl

        self.sweeper = resumable_impl(**settings)

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.sweeper.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> None:
        import sys

        from tformer_cli.errors import TformerError

        try:
            return self.sweeper.sweep(arguments)
        except TformerError as exc:  # one line, as everywhere in tformer (Hydra would print a traceback)
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
