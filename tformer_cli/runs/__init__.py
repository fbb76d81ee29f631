"""The run engine: one shell (session.py), one resume path (resume.py) and one loop (training/loop.py) for every
training task; a task is one file here: its job and its objective (classify.py with training/objectives.py's
Classification, pretraining.py, distill.py, audit.py)."""
