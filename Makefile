# The course's single entry point. `make lab` opens the course, `make test` runs every test.
# Both create the virtual environment in $(VENV) if missing and install the project into it.
# In an existing environment (e.g. the Neuron venv on Trainium): make lab VENV=$$VIRTUAL_ENV
# There nothing is upgraded and no file is written into the environment: only what is missing
# is installed, and make says what it installs (or that everything is present).

PYTHON ?= python3
VENV ?= .venv
# A CPU build on this kind of machine; never a bare `torch`, which pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
PIP ?= $(BIN)/python -m pip
# Extra arguments for `jupyter lab`, e.g. on a remote trn instance: LAB_ARGS="--no-browser --port 8888"
LAB_ARGS ?=
# JupyterLab refuses to run as root unless told; containers and cloud images often are root.
# Kept apart from LAB_ARGS, so that setting LAB_ARGS never drops it.
ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root)
# The folder JupyterLab opens.
NOTEBOOKS ?= notebooks/
# The course's JupyterLab defaults (jupyter/labconfig/: no Jupyter news pop-up): found through
# JUPYTER_CONFIG_PATH, so nothing is written into the environment or into ~/.jupyter.
LAB_ENV := JUPYTER_CONFIG_PATH="$(CURDIR)/jupyter$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}"
STAMP := $(VENV)/.trnlab-installed
# The exact versions the stored notebooks and the suite were run with; pyproject.toml keeps a learner's ranges.
CONSTRAINTS := trnlab/constraints.txt
UV_INSTALL := $(BIN)/python -m uv pip install -q --python $(BIN)/python --compile-bytecode
# TORCH_SPEC's words, each quoted for the shell: a range such as torch>=2.13,<2.15 stays one argument.
TORCH_ARGS = $(foreach word,$(TORCH_SPEC),'$(word)')
# An environment this Makefile did not create: it has a python but no stamp of ours.
EXISTING_ENV := $(if $(wildcard $(BIN)/python),$(if $(wildcard $(STAMP)),,yes))
# What installs into $(VENV) once it is set up: pip in an existing environment; uv where this Makefile
# brought it (not where it fell back to pip).
INSTALL = $(if $(EXISTING_ENV),$(PIP) install -q,$(if $(wildcard $(BIN)/uv),$(UV_INSTALL),$(PIP) install -q))

.PHONY: setup browser-deps lab test notebooks model clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch with pip (it finds a local CPU build where the machine has one), then everything else with uv,
# which downloads in parallel. uv does not read pip's configuration (a mirror, constraints): where it
# cannot reach the index, pip installs instead, and uv is removed so that browser-deps uses pip too.
# Then the environment is byte-compiled on all cores (torch came uncompiled), so that no process
# compiles torch's imports again (skipping the one torch file that is Python 3.12 syntax).
# About 45 s on 2 cores with cold caches (with browser-deps), against 90 s with pip alone.
$(STAMP): pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q --no-compile $(TORCH_ARGS)
	$(BIN)/python -m pip install -q uv && $(UV_INSTALL) -e . -c $(CONSTRAINTS) || \
	  { echo "make: uv could not install the course (above): installing with pip instead"; \
	    $(BIN)/python -m pip uninstall -q -y uv; $(BIN)/python -m pip install -q -e . -c $(CONSTRAINTS); }
	$(BIN)/python -m compileall -q -j0 -x '/torch/testing/_internal/py312_intrinsics\.py$$' $(VENV)/lib || \
	  echo "make: some modules could not be byte-compiled (above): they still import, compiled on each import"
	touch $@

# Prints what an existing environment lacks, one line each: `torch`, `trnlab <why>`, or
# `mismatch <requirement> <installed version>` for an installed package pip would have to replace.
define CHECK_ENV
import importlib.metadata as md, importlib.util as iu, os, sys
root = os.path.realpath(sys.argv[1])
if iu.find_spec("torch") is None:
    print("torch")
try:
    dist = md.distribution("trnlab")
except md.PackageNotFoundError:
    sys.exit(print("trnlab is not installed"))
spec = iu.find_spec("trnlab")
origin = os.path.realpath(spec.origin) if spec and spec.origin else ""
if not origin.startswith(root + os.sep):
    sys.exit(print(f"trnlab is installed from {os.path.dirname(os.path.dirname(origin))}, not from this checkout"))
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
for req in map(Requirement, dist.requires or []):
    if req.marker and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        if req.name != "torch":
            print(f"trnlab needs {req}, which is missing")
        continue
    if not req.specifier.contains(version, prereleases=True):
        print(f"mismatch {req} {version}")
endef
export CHECK_ENV

ifeq ($(EXISTING_ENV),yes)
# Someone else's environment: install only what is missing, never upgrade pip, write no stamp.
setup:
	@todo="$$($(BIN)/python -I -c "$$CHECK_ENV" "$(CURDIR)")" || exit 1; \
	if [ -z "$$todo" ]; then \
	  echo "make setup: $(VENV) already has torch, trnlab (this checkout) and its dependencies: installing nothing"; exit 0; \
	fi; \
	if echo "$$todo" | grep -q '^mismatch '; then \
	  echo "$$todo" | sed -n 's/^mismatch \(.*\) \(.*\)$$/make setup: $(VENV) has \2, but trnlab needs \1; pip would replace it./p'; \
	  echo "make setup: installing nothing; install a matching version yourself (on Trainium: the Neuron build of torch)."; \
	  exit 1; \
	fi; \
	if $(if $(filter file,$(origin PIP)),! $(BIN)/python -c "import pip" 2>/dev/null,false); then \
	  echo "$$todo" | sed 's/^torch$$/torch is not installed/; s/^/make setup: /'; \
	  echo "make setup: $(VENV) has no pip to install them with (uv makes environments without it): add it with"; \
	  echo "  $(BIN)/python -m ensurepip"; echo "then run make again, or install them yourself."; exit 1; \
	fi; \
	if echo "$$todo" | grep -qx torch; then \
	  echo "make setup: torch is not installed in $(VENV): running pip install $(TORCH_SPEC)"; \
	  $(PIP) install -q $(TORCH_ARGS) || exit 1; \
	fi; \
	if echo "$$todo" | grep -qv '^torch$$'; then \
	  echo "$$todo" | grep -v '^torch$$' | sed 's/^/make setup: /'; \
	  echo "make setup: running pip install -e . in $(VENV)"; \
	  $(PIP) install -q -e . || exit 1; \
	fi
else
setup: $(STAMP)
endif

lab: setup
	$(LAB_ENV) $(BIN)/jupyter lab $(ROOT_ARGS) $(LAB_ARGS) $(NOTEBOOKS)

# tests/browser drives JupyterLab in Chromium (Debian's chromium: apt-get install chromium) with
# Playwright, installed here when missing (it is the project's `browser` extra); ninja too, which the
# stand-in neuron device builds with (g++ comes from the system: apt-get install g++).
browser-deps: setup
	@$(BIN)/python -c "import playwright" 2>/dev/null || { echo "make: installing playwright into $(VENV) for tests/browser"; $(INSTALL) "playwright>=1.40"; }
	@command -v ninja >/dev/null || [ -x $(BIN)/ninja ] || { echo "make: installing ninja into $(VENV) for the stand-in neuron device"; $(INSTALL) ninja; }

# One pytest session: unit tests, browser tests, and every notebook twice. First as stored, the run a reader
# sees (--notebook-env): on the stand-in neuron device (TRNLAB_NEURON_STANDIN=1; built with g++ on first use), in
# bfloat16, with the bundled model, every checked cell compared. Then as a laptop runs it, with the course's
# notebook rules (--trnlab-rules): on CPU in float32, with another small Qwen3 (OTHER_MODEL, built here in
# seconds; TRNLAB_MODEL, which tests/conftest.py unsets for the unit tests): the checked cells tagged
# bundled-model, device-dependent or dtype-dependent then run unchecked, every other one must still hold.
# Spread over TEST_WORKERS processes (pytest-xdist; one file or notebook run per worker at a time). On Trainium
# the notebooks run one at a time: a kernel holds every NeuronCore it sees, so two would block each other.
# The stand-in is built (once, about 40 s) in the background as the session starts, not when its first test needs it.
# tests/cost.py ends the session with one line: the seconds (and CPU-seconds) in launches, notebooks, the browser, the rest.
# OMP_NUM_THREADS=1: with two test processes (and torchrun's ranks) on two cores, torch's second
# CPU thread only waits for a busy core. A third worker on two cores made the session slower (measured
# 2026-12-07, fresh clones of 5aa84cd: 798 s of pytest against 660 s with two): the ranks already fill the cores.
TEST_WORKERS ?= 2
OTHER_MODEL := $(CURDIR)/build/other-qwen3
BUNDLED_MODEL := $(CURDIR)/trnlab/assets/tiny-qwen3
test: setup browser-deps
	@workers=$(TEST_WORKERS); \
	if [ "$$($(BIN)/python -c 'import trnlab; print(trnlab.detect_backend())' 2>/dev/null)" = neuron ]; then \
	  workers=0; echo "make test: Neuron device found: one test process, so notebooks never share NeuronCores"; \
	fi; \
	{ $(BIN)/python -c "import torch, trnlab.standin as s; s.enable()" >/dev/null 2>&1 & }; \
	set -x; $(BIN)/python tools/build_model.py --other --overwrite --output "$(OTHER_MODEL)" && \
	TRNLAB_MODEL="$(OTHER_MODEL)" OMP_NUM_THREADS=1 $(BIN)/python -m pytest -p trnlab.pytest_plugin -p tests.cost tests notebooks \
	  --nbval-lax --trnlab-rules -p no:cacheprovider \
	  --notebook-env "TRNLAB_NEURON_STANDIN=1 TRNLAB_DTYPE=bfloat16 TRNLAB_MODEL=$(BUNDLED_MODEL)" \
	  -n $$workers --dist loadfile --durations=15

# Re-execute every notebook in place, so the committed outputs are true: as a reader should see them, on the
# stand-in neuron device in bfloat16 with the bundled model (on a trn2: make notebooks STORED_RUN=, the real device);
# copy each one's measured run time and graph count into its introduction (tools/sync_intros.py); then normalize
# them (kernelspec, widget state, machine paths) so that opening them in JupyterLab changes nothing.
STORED_RUN ?= TRNLAB_NEURON_STANDIN=1 TRNLAB_DTYPE=bfloat16
notebooks: setup
	env -u TRNLAB_MODEL $(STORED_RUN) $(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	  --ExecutePreprocessor.timeout=900 notebooks/[0-9]*.ipynb
	$(BIN)/python tools/sync_intros.py notebooks/[0-9]*.ipynb
	$(BIN)/python tools/normalize_notebooks.py notebooks/[0-9]*.ipynb

# Rebuild the bundled tiny Qwen3 model (measured: 18 CPU-minutes on 2 cores; 49 min wall while other jobs shared them).
model: setup
	$(BIN)/python tools/build_model.py

clean:
	rm -rf $(VENV)
