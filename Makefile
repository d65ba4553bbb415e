# Two entry points: `make run` (the pipeline on params/default.yaml; PARAMS=params/x.yaml for another run,
# ARGS="--resume" to continue one) and `make test`. Each sets up what it needs (idempotently) first.
# `make preflight PARAMS=params/x.yaml` checks, in minutes, what that run needs (docs/preflight.md), running no
# notebook (`python -m tools.preflight`; ARGS="--memory-gb 70" and the like pass its options).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PARAMS ?= params/default.yaml

.PHONY: setup run preflight compare ablation test browser-test lint bench lab clean-venv gpu-check gpu-wheels \
	gpu-wheels-rehearsal

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# CPU machines get PyTorch's CPU build, GPU machines the default (CUDA) build.
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(PY) -m pip install -q "torch>=2.4"; \
	else \
		$(PY) -m pip install -q "torch==2.13.0"; \
	fi
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

run: setup
	$(PY) -m c2llm_lib.pipeline $(PARAMS) $(ARGS)

preflight: setup
	$(PY) -m tools.preflight $(PARAMS) $(ARGS)

# Notebook 06: the three recipes on the default's data and compute, each at the rates its own validation sweep chose
# (about 1 h 50 min alone on 2 CPU cores; full held-out corpora).
compare: setup
	$(PY) -m c2llm_lib.pipeline params/compare-recipes.yaml --only 01 06 $(ARGS)

# Notebook 06's pooling study: PMA, last-token and mean pooling at their own chosen rates (swept at a seed of its own),
# then 3 fresh seeds each, PMA projected to d = 128 against truncation (about 3 h alone on 2 CPU cores; ARGS="--resume"
# continues a run that died or was stopped, keeping every finished training and scoring).
ablation: setup
	$(PY) -m c2llm_lib.pipeline params/ablation-cpu.yaml --only 01 06 $(ARGS)

# The suite on TEST_WORKERS processes (pytest-xdist): a test file runs whole on one worker, the rehearsals one by one
# wherever a worker is free, each worker on its share of the cores (tests/conftest.py). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: setup lint
	$(PY) -m pytest -n $(TEST_WORKERS)

# Notebook 07 in JupyterLab, driven in Debian's headless chromium (part of `make test` too, skipped there without
# chromium); this target also writes the screenshot benchmarks/results/search-jupyterlab.png.
browser-test: setup
	@command -v chromium >/dev/null || { echo "browser-test needs Debian's chromium: apt-get install -y chromium"; exit 1; }
	C2LLM_SCREENSHOT_DIR=benchmarks/results $(PY) -m pytest tests/test_browser.py

lint: setup
	$(PY) -m ruff check c2llm_lib tests benchmarks tools
	$(PY) -m ruff format --check c2llm_lib tests benchmarks tools

# The CUDA path measured in at most 8 minutes (docs/gpu-check.md): `make gpu-check OUT=<folder>` on a GPU machine, which
# has no registry: it needs no setup, installs the carried wheels (WHEELS, filled here by `make gpu-wheels`) where there
# is a GPU, and writes gpu_check.json, gpu_check.md, profile.md and gpu_check.log into OUT. On a CPU: the tiny rehearsal.
OUT ?= outputs/gpu-check
WHEELS ?= .gpu-wheels
GPU_PYTHON := $(if $(wildcard $(PY)),$(PY),$(PYTHON))
gpu-check:
	$(GPU_PYTHON) tools/gpu_check.py --out $(OUT) $(if $(and $(wildcard $(WHEELS)/*.whl),$(shell command -v nvidia-smi)),--wheels $(WHEELS)) $(ARGS)

# The wheels gpu-check needs beyond the GPU machine's image, for its Python 3.12 (tools/gpu-wheels.txt), checked; and
# their rehearsal in a clean Python 3.12 environment of the image's packages (downloads gigabytes: not in make test).
PYTHON312 ?= python3.12
gpu-wheels: setup
	$(PY) tools/gpu_wheels.py download --dest $(WHEELS)

gpu-wheels-rehearsal: gpu-wheels
	$(PY) tools/gpu_wheels.py rehearse --dest $(WHEELS) --python $(PYTHON312) --record benchmarks/results/gpu-wheels.md

bench: setup
	$(PY) benchmarks/encode_bench.py

lab: setup
	$(PY) -m ipykernel install --user --name c2llm --display-name "Python (c2llm)"
	$(VENV)/bin/jupyter lab notebooks

clean-venv:
	rm -rf $(VENV)
