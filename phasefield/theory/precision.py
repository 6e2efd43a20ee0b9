"""Float64 for the theory without touching the user's global JAX configuration.

Importing phasefield leaves ``jax_enable_x64`` alone. Every public theory entry point runs
inside JAX's scoped (thread-local) switch ``jax.enable_x64(True)``: :func:`float64`
decorates a function with it, and :func:`phasefield.theory._api.public` applies it to the
jit-compiled (q, p) API. Values come back as float64 arrays whatever the global setting.

Inside your *own* ``jit``/``vmap``/``grad`` of a theory function, enter the scope yourself,
``with jax.enable_x64(True): jax.vmap(paper.exponents)(hps)`` (:mod:`phasefield.layers.paper`), so the traced inputs are
float64 as well (the scope cannot change the dtype of tracers created outside it).
"""

from __future__ import annotations

import functools

import jax


def float64(fn):
    """Run ``fn`` under ``jax.enable_x64(True)``."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with jax.enable_x64(True):
            return fn(*args, **kwargs)

    return wrapper
