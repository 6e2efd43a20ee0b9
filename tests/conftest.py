"""Shared fixtures.

Importing phasefield leaves ``jax_enable_x64`` alone (tests/test_isolation.py); the theory
entry points compute in float64 by themselves. Tests that build their own float64 inputs or
transform theory functions with their own ``jit``/``vmap``/``grad`` use :func:`float64`
(``pytestmark = pytest.mark.usefixtures("float64")``), JAX's scoped x64 switch.

The test process owns its configuration like the ``phasefield`` command: every CPU core is a
JAX device (as before issue 12), set here before JAX initialises. The command's persistent
compilation cache stays off in the suite (``PHASEFIELD_CACHE=off``, inherited by the
subprocess tests): the in-process CLI tests would otherwise turn it on for every later test,
and serializing some executables of the DeepScaleLM moments into it crashed XLA:CPU
(segmentation fault / abort in ``put_executable_and_time`` / ``get_executable_and_time``,
2026-11-25, on a loaded machine where more compilations pass the cache's 0.5 s threshold).
"""
import os

import jax
import pytest

import phasefield

phasefield.use_all_cpu_cores()
os.environ["PHASEFIELD_CACHE"] = "off"


@pytest.fixture
def float64():
    with jax.enable_x64(True):
        yield
