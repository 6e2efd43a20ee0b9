# The two set-up commands of the README: `make demo` and `make test`.
# Each bootstraps its own virtual environment in .venv on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

# Byte-code is written at first import, into the venv ($(VENV)/pycache: the repository
# gets no __pycache__), not by pip for every installed module: pip's compile of ~10,800
# modules, most never imported, was 36 of the install's 57 s (2026-11-27); the suite's first
# imports compile the ~2,100 it uses (~8 s, once). A PYTHONDONTWRITEBYTECODE in the
# environment would make every process compile them again, so these recipes do not pass it on.
export PYTHONPYCACHEPREFIX := $(abspath $(VENV))/pycache
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/phasefield demo --out out/demo

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25

bench: $(STAMP)
	$(PY) scripts/bench_theory.py

clean:
	rm -rf $(VENV) out
