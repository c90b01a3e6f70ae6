# The course's single entry point. `make lab` opens the course, `make test` runs every test.
# Both create the virtual environment in $(VENV) if missing and install the project into it.
# In an existing environment (e.g. the Neuron venv on Trainium): make lab VENV=$$VIRTUAL_ENV

PYTHON ?= python3
VENV ?= .venv
# A CPU build on this kind of machine; never a bare `torch`, which pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
# JupyterLab refuses to run as root unless told; containers and cloud images often are root.
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)
STAMP := $(VENV)/.trnlab-installed

.PHONY: setup lab test notebooks model clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e .
	touch $@

setup: $(STAMP)

lab: setup
	$(BIN)/jupyter lab $(LAB_ARGS) notebooks/

test: setup
	$(BIN)/python -m pytest tests notebooks --nbval-lax --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider

# Re-execute every notebook in place, so the committed outputs are true.
notebooks: setup
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.timeout=900 notebooks/[0-9]*.ipynb

# Rebuild the bundled tiny Qwen3 model (a few minutes on 2 CPU cores).
model: setup
	$(BIN)/python -m trnlab.assets build

clean:
	rm -rf $(VENV)
