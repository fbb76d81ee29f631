"""The run engine: one shell (session.py), one resume path (resume.py) and one loop (training/loop.py) for every
training task; a task is a job (classify.py, pretraining.py) and an objective (training/objectives.py)."""
