# lfm2vl-lab: two commands for newcomers (`make bench`, `make test`), plus `make lab` (and
# `make lab-fresh`) and `make docs`.
#
# `make install` builds .venv once (a stamp file inside it marks it done). torch and torchvision
# are pinned to the pair that lies on local disk on the CPU machines (docs/install.md says
# why); everything else comes from pyproject.toml (the package with its `test` and `docs` extras).

PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.lfm2vl-lab-installed
NOTEBOOKS := $(wildcard notebooks/*.ipynb)

# Never reach a model hub: presets build random-weight models, checkpoints load from local folders.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
# The repo root on the path too, so notebook kernels (cwd notebooks/) import the package even in a
# venv that was made by hand without the editable install.
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
# The venv's own tools first on the path: ninja (which torch's C++ extension builds call by name).
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# Material for MkDocs prints a banner about MkDocs 2.0 and its own end of life on every build;
# README.md ("Docs site") says what that means for this site.
export NO_MKDOCS_2_WARNING := 1

.PHONY: install bench test lab lab-fresh docs handout

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV) && $(VENV)/bin/pip install torch==2.14.1 torchvision==0.29.1 && $(VENV)/bin/pip install -e '.[test,docs]'
	touch $(STAMP)

# A missing venv is built first; an existing one is used as it is (run `make install` to refresh).
$(VPY):
	$(MAKE) install

bench: | $(VPY)
	$(VPY) -m lfm2vl_lab bench

# ruff first (seconds; its settings are in pyproject.toml), then the CPU tests, then every notebook;
# -rs lists why each skipped test skipped (most need a CUDA GPU: docs/gpu.md), --durations=15 the
# slowest tests (where the run's minutes go). Each notebook runs once: where Chromium is installed,
# tests/test_jupyterlab.py runs it in JupyterLab and compares its NBVAL_CHECK_OUTPUT cells as nbval
# does, and tests/conftest.py leaves nbval's run of it out; without Chromium nbval runs it.
#
# Two pytest-xdist workers, each given whole files (a file's module fixtures, JupyterLab's server among
# them, start once; nbval runs a notebook's cells in one kernel), the longest files first, and each
# worker its share of the cores for torch's threads (both in tests/conftest.py).
# XDIST= runs everything in one process, as does a venv made before pytest-xdist joined the test extra
# (`make install` adds it).
XDIST ?= $(if $(shell $(VPY) -c 'import xdist' 2>/dev/null && echo y),-n 2 --dist loadfile --no-loadscope-reorder)
test: | $(VPY)
	$(VENV)/bin/ruff check .
ifneq ($(NOTEBOOKS),)
	$(VPY) -m pytest -q -rs --durations=15 $(XDIST) tests --nbval-lax --nbval-current-env notebooks/
else
	$(VPY) -m pytest -q -rs --durations=15 $(XDIST)
endif

# JupyterLab refuses to start as root ("Running as root is not recommended. Use --allow-root"), and
# containers usually run as root: pass --allow-root there, and only there.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

# LAB_ARGS: more JupyterLab options, e.g. LAB_ARGS="--ip 0.0.0.0 --no-browser" inside a container.
LAB_ARGS ?=

# The notebooks open as working copies in $(LAB_DIR) (git-ignored; scripts/lab_copies.py): running
# them changes the copies, never the committed H200 outputs in notebooks/. A missing copy is made, a
# copy the learner changed is kept. `make lab-fresh` (or LAB_FRESH=1) takes new copies of every
# notebook and moves the changed ones aside into $(LAB_DIR)/previous-<date-time>/.
LAB_DIR ?= lab-notebooks
LAB_FRESH ?=

lab: | $(VPY)
	$(VPY) scripts/lab_copies.py --dest $(LAB_DIR) $(if $(LAB_FRESH),--fresh)
	$(VENV)/bin/jupyter lab $(ALLOW_ROOT) $(LAB_ARGS) $(LAB_DIR)/

lab-fresh:
	@$(MAKE) --no-print-directory lab LAB_FRESH=1

# Learner copies of the notebooks without the `solution` cells, outputs cleared (docs/workshop.md).
handout: | $(VPY)
	$(VPY) scripts/handout.py --out handout

# The docs site into site/ (README "Docs site"; mkdocs.yml, docs/hooks.py). Strict: a broken link, a
# missing figure or anything fetched from the network fails it. It never executes a notebook.
docs: | $(VPY)
	@$(VPY) -c "import mkdocs_jupyter, mkdocstrings" 2>/dev/null || \
	  { echo "make docs: the docs extra is missing; run: $(VENV)/bin/pip install -e '.[docs]'" >&2; exit 2; }
	$(VPY) -m mkdocs build --strict
