# The two set-up commands of the README: `make demo` and `make test`.
# Each bootstraps its own virtual environment in .venv on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

# Byte-code: the install compiles every installed module, and phasefield's own, into their
# standard __pycache__ folders, where every process finds them -- also a user's shell that
# runs .venv/bin/phasefield with PYTHONDONTWRITEBYTECODE=1 (common in containers), which would
# otherwise compile JAX's modules from source at every start (`phasefield predict` 4.1 s
# instead of 1.3 s). pip installs without compiling, then compileall compiles on every core;
# it skips what is already compiled and also completes a venv pip filled without byte-code.
# This recipe from an empty .venv, measured back to back on 2 busy cores: with pip's own
# compile 69 s, as written 57 s; compiling only the run-time dependencies (7,200 of 10,800
# modules) costs about the same CPU. The recipes do not pass on a PYTHONDONTWRITEBYTECODE, so
# what the install did not compile (the tests, edited sources) is written once, at first import.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e ".[test]"
	$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" phasefield
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/phasefield demo --out out/demo

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal --durations=25

bench: $(STAMP)
	$(PY) scripts/bench_theory.py

clean:
	rm -rf $(VENV) out
