"""Shared fixtures.

Importing phasefield leaves ``jax_enable_x64`` alone (tests/test_isolation.py); the theory
entry points compute in float64 by themselves. Tests that build their own float64 inputs or
transform theory functions with their own ``jit``/``vmap``/``grad`` use :func:`float64`
(``pytestmark = pytest.mark.usefixtures("float64")``), JAX's scoped x64 switch.

The test process owns its configuration like the ``phasefield`` command: every CPU core is a
JAX device (as before issue 12), and **one persistent compilation cache serves the whole
run** (issue 34), both set here before JAX initialises: ``PHASEFIELD_CACHE`` (the CLI's
cache; default ``~/.cache/phasefield/jax``; ``off`` disables it) is switched on from the
start and exported, so the two xdist workers and every subprocess the tests start (CLI runs,
the notebook, the two-process sweep, the wheel) compile each program once. The cache has a
size limit, which makes JAX lock it: no process reads an entry another is still writing.
The :func:`no_compilation_cache` fixture keeps it away from tests whose executables crashed
XLA:CPU when serialized into it or read back (the DeepScaleLM moments: segmentation fault /
abort in ``put_executable_and_time`` / ``get_executable_and_time``, seen twice on
2026-11-25, before the cache was locked).
"""
import os

import jax
import pytest

import phasefield

phasefield.use_all_cpu_cores()

_CACHE = os.environ.get("PHASEFIELD_CACHE",
                        os.path.join(os.path.expanduser("~"), ".cache", "phasefield", "jax"))
if _CACHE.strip().lower() not in ("", "off", "0", "none"):
    os.makedirs(_CACHE, exist_ok=True)
    os.environ["PHASEFIELD_CACHE"] = _CACHE   # the subprocesses' CLI uses the same folder
    jax.config.update("jax_compilation_cache_dir", _CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    jax.config.update("jax_compilation_cache_max_size", 8 << 30)   # locked reads and writes


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
