"""Shared fixtures.

Importing phasefield leaves ``jax_enable_x64`` alone (tests/test_isolation.py); the theory
entry points compute in float64 by themselves. Tests that build their own float64 inputs or
transform theory functions with their own ``jit``/``vmap``/``grad`` use :func:`float64`
(``pytestmark = pytest.mark.usefixtures("float64")``), JAX's scoped x64 switch.

The test process owns its configuration like the ``phasefield`` command: every CPU core is a
JAX device (as before issue 12), set here before JAX initialises.
"""
import jax
import pytest

import phasefield

phasefield.use_all_cpu_cores()


@pytest.fixture
def float64():
    with jax.enable_x64(True):
        yield
