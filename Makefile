# rocm-yolo from a fresh clone: `make demo` trains the demo, `make test` runs the quick tier of the tests,
# `make test-all` all of them (CI), `make check` the linters and the layout and docs tests.
# Each sets up .venv on its first run (python3 -m venv; the system Python is never touched),
# installs torch once, chosen for this machine (rocm_yolo/gpu/wheels.py: AMD's wheels for the
# GPU's architecture, else the package index's default; TORCH_SPEC= and TORCH_INDEX= override
# it; a torch already in .venv is kept), then the project. Later runs skip the set-up.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
LOG := $(VENV)/make.log
TORCH_SPEC ?=
TORCH_INDEX ?=
SOURCES := $(shell find rocm_yolo patches -name '*.py' 2>/dev/null)
# $(call sq,TEXT): TEXT as one shell word, whatever quotes it holds
sq = '$(subst ','\'',$(1))'
CHOOSER = TORCH_SPEC=$(call sq,$(TORCH_SPEC)) TORCH_INDEX=$(call sq,$(TORCH_INDEX)) PYTHONPATH=. $(call sq,$(PYTHON)) -m rocm_yolo.gpu.wheels
# What pip gets for torch on this machine, shell-quoted (read at parse time, so `make -n` shows it).
TORCH_ARGS := $(shell $(CHOOSER) --pip-args 2>/dev/null)
TORCH_WHY := $(shell $(CHOOSER) --why 2>/dev/null)

# $(call step,WHAT,COMMAND): run COMMAND, its output kept in $(LOG); on failure one line: which step, and why
# (the step's first error line, else its last line).
step = echo "make: $(1)"; ( $(2) ) >$(VENV)/step.log 2>&1; rc=$$?; cat $(VENV)/step.log >>$(LOG); \
	[ $$rc = 0 ] || { echo "make: $(1) failed: $$(grep -m 1 -E '^(ERROR|[A-Za-z]*Error)' $(VENV)/step.log \
	|| grep -v '^\s*$$' $(VENV)/step.log | tail -n 1) (all of it: $(LOG))"; exit 1; }

.PHONY: help demo test test-all check torch floorplan
.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## /  make \1\t/'
	@$(have_choice)
	@echo "  (torch for this machine: pip install $(TORCH_ARGS); override with TORCH_SPEC=... TORCH_INDEX=...)"

demo: $(VENV)/.project ## set up (first time), then train the demo: rocm-yolo train demo --epochs 2 --device cpu
	$(VENV)/bin/rocm-yolo train demo --epochs 2 --device cpu

test: $(VENV)/.project-test ## set up with the test extras (first time), then the quick tier: python -m pytest -q -m quick
	$(PY) -m pytest -q -m quick

test-all: $(VENV)/.project-test ## every test, the end-to-end and multi-node ones too (CI): python -m pytest -q
	$(PY) -m pytest -q

check: $(VENV)/.project-test ## ruff, and the layout and docs tests
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -n 0 tests/unit/test_layout.py tests/unit/test_docs.py

torch: $(VENV)/.torch ## only set up .venv and torch

floorplan: ## print the import cycles among rocm_yolo's modules and folders (none: the plan is a DAG)
	@$(PYTHON) tests/floorplan.py

# the installed torch and torchvision as pip sees them (their metadata: torch.__version__ may add +cu130)
export HOLD_TORCH := from importlib import metadata as m; [print(f"{d}=={m.version(d)}") for d in ("torch", "torchvision") if any(True for _ in m.distributions(name=d))]

# the torch choice is needed: without it no step can be right (the chooser's own error says why)
have_choice = test -n "$(TORCH_ARGS)" || { why=$$($(CHOOSER) --pip-args 2>&1 | tail -n 1); case "$$why" in \
	TORCH_*) echo "make: choosing torch failed: $$why";; \
	*) echo "make: choosing torch failed: $$why (is Python 3.11+ installed as $(PYTHON)?)";; esac; exit 1; }

$(PY):
	@$(have_choice)
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "make: rocm-yolo needs Python 3.11 or newer (the versions tested), and $(PYTHON) is $$($(PYTHON) -c 'import platform; print(platform.python_version())'): give PYTHON=python3.11 or newer"; exit 1; }
	@echo "make: creating $(VENV) ($(PYTHON) -m venv)"
	@out=$$($(PYTHON) -m venv $(VENV) 2>&1) || { rm -rf $(VENV); echo "make: creating $(VENV) failed: $$(echo "$$out" | grep -v '^\s*$$' | tail -n 1) (on Debian and Ubuntu without venv: apt install python3-venv)"; exit 1; }

$(VENV)/.torch: | $(PY)
	@if $(PY) -c "import torch" >/dev/null 2>&1; then \
		echo "make: torch $$($(PY) -c 'import torch; print(torch.__version__)') is already in $(VENV): kept (rocm-yolo doctor says whether it fits this machine)"; \
	else \
		$(have_choice); \
		echo "make: torch for this machine: $(TORCH_WHY)"; \
		$(call step,installing torch: pip install $(TORCH_ARGS),$(PY) -m pip install --quiet $(TORCH_ARGS)); \
	fi
	@touch $@

# A regular install (a wheel, as users get it), again whenever the sources change; the torch in .venv at that
# moment is held (constraints.txt, written anew each time), so no dependency can swap it for another build. (For an editable install of
# your own: pip install -e ".[test]", see CONTRIBUTING.md.)
$(VENV)/.project: pyproject.toml $(SOURCES) $(VENV)/.torch
	@$(PY) -c "$$HOLD_TORCH" > $(VENV)/constraints.txt
	@rm -rf build  # setuptools' in-tree build keeps modules since removed: they must not reach the wheel
	@$(call step,installing rocm-yolo and its dependencies into $(VENV),$(PY) -m pip install --quiet -c $(VENV)/constraints.txt .)
	@touch $@

$(VENV)/.project-test: $(VENV)/.project
	@$(PY) -c "$$HOLD_TORCH" > $(VENV)/constraints.txt
	@$(call step,installing the test extras into $(VENV),$(PY) -m pip install --quiet -c $(VENV)/constraints.txt ".[test]")
	@touch $@
