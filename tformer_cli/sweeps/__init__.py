"""-m sweeps: the summary of a sweep and its resume, how each job ended, resumable Optuna searches."""
