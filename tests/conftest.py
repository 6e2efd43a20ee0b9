"""Shared fixtures.

Importing phasefield leaves ``jax_enable_x64`` alone (tests/test_isolation.py); the theory
entry points compute in float64 by themselves. Tests that build their own float64 inputs or
transform theory functions with their own ``jit``/``vmap``/``grad`` use :func:`float64`
(``pytestmark = pytest.mark.usefixtures("float64")``), JAX's scoped x64 switch.

The test process owns its configuration like the ``phasefield`` command: every CPU core is a
JAX device (as before issue 12), set here before JAX initialises. The in-process CLI tests
turn on the command's persistent compilation cache for the rest of the session; the
:func:`no_compilation_cache` fixture keeps it away from tests whose executables crash XLA:CPU
when serialized into it or read back (the DeepScaleLM moments: segmentation fault / abort in
``put_executable_and_time`` / ``get_executable_and_time``, seen twice on 2026-11-25).
"""
import jax
import pytest

import phasefield

phasefield.use_all_cpu_cores()


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
