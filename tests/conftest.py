"""Shared fixtures.

Importing phasefield leaves ``jax_enable_x64`` alone (tests/test_isolation.py); the theory
entry points compute in float64 by themselves. Tests that build their own float64 inputs or
transform theory functions with their own ``jit``/``vmap``/``grad`` use :func:`float64`
(``pytestmark = pytest.mark.usefixtures("float64")``), JAX's scoped x64 switch.

The test process owns its configuration like the ``phasefield`` command: every CPU core is a
JAX device (as before issue 12), set here before JAX initialises. **The persistent compilation
cache is off for the suite** (and ``PHASEFIELD_CACHE=off`` is exported to every subprocess the
tests start), unless ``PHASEFIELD_TEST_CACHE=FOLDER`` asks for one (then the two xdist workers
and the subprocesses share it, compiling each program once). Serializing some XLA:CPU
executables into the cache crashed the process (segmentation fault / abort in
``put_executable_and_time`` / ``get_executable_and_time``: the DeepScaleLM moments twice on
2026-11-25, a ``lax.map`` of ``simulate.measure.gradient_draws`` in a fresh-clone run on
2026-11-26, with the cache locked), so a run that CI depends on does not use it. The
:func:`no_compilation_cache` fixture keeps it away from those tests when it is on.

``PHASEFIELD_COMPILE_PROFILE=FOLDER`` (opt-in) loads ``tests/compile_profile.py``: each
worker writes the seconds JAX spent tracing, lowering and compiling, per test and per
jitted function, to ``FOLDER``; ``python tests/compile_profile.py FOLDER`` ranks them.
"""
import os

import jax
import pytest

import phasefield
from phasefield._runtime import use_compilation_cache

phasefield.use_all_cpu_cores()

# opt-in only (see above): the CLI's set-up (phasefield._runtime) on PHASEFIELD_TEST_CACHE
os.environ["PHASEFIELD_CACHE"] = os.environ.get("PHASEFIELD_TEST_CACHE", "off")
_CACHE = use_compilation_cache(min_compile_secs=0.2)
if _CACHE is not None:
    os.environ["PHASEFIELD_CACHE"] = _CACHE   # the subprocesses' CLI uses the same folder

if os.environ.get("PHASEFIELD_COMPILE_PROFILE"):   # opt-in: compile seconds per test and program
    from compile_profile import pytest_runtest_protocol, pytest_sessionfinish  # noqa: F401


@pytest.fixture(autouse=True, scope="module")
def _release_executables():
    """Drop JAX's compiled programs after each test module. Every XLA:CPU executable holds
    memory mappings; a worker that kept the whole suite's (2026-11-26: ~42,000 maps after
    16 minutes) reaches the kernel's limit (``vm.max_map_count`` = 65,530), and the next
    compilation or cache write segfaults (two fresh-clone runs on 2026-11-26)."""
    yield
    jax.clear_caches()


@pytest.fixture
def no_compilation_cache():
    """The persistent compilation cache off for one test (restored after)."""
    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)


@pytest.fixture
def float64():
    with jax.enable_x64(True):
        yield


@pytest.fixture
def small_ensembles(monkeypatch):
    """Forests of 50 trees and boosting of 100 trees at 3x the rate (the same total
    shrinkage) instead of the shipped 200 and 300 (``phasefield.vit.models``), for tests
    whose claims are about the exponent and linear models, the trees being only candidates
    (equality with scikit-learn at the shipped sizes: tests/test_trainability.py). A third
    less CPU for the analysis tests (2026-11-26)."""
    from phasefield.vit import models

    monkeypatch.setitem(models.FOREST_PARAMS, "n_estimators", 50)
    monkeypatch.setitem(models.TREE_PARAMS, "n_estimators", 100)
    monkeypatch.setitem(models.TREE_PARAMS, "learning_rate", 3 * models.TREE_PARAMS["learning_rate"])
