"""Public theory functions are jit-compiled once per static configuration.

:func:`public` wraps a pure function ``f(hp, ..., kern=None, ...)``: a missing MLP kernel
is built *outside* the trace (so its table sizes follow the concrete sigma_w), a missing
``num_layers`` is read from the concrete ``hp.depth``, and the rest runs under ``jax.jit``.
Inside a user's own ``jit``/``vmap`` (traced hp) the same code simply inlines.
"""
from __future__ import annotations

import functools
import inspect

import jax


def public(*static_argnames: str):
    def deco(fn):
        sig = inspect.signature(fn)
        jitted = jax.jit(fn, static_argnames=static_argnames)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            hp = a["hp"]
            if "kern" in a and a["kern"] is None:
                from . import mlp
                a["kern"] = mlp.kernel(hp)
            if "num_layers" in a and a["num_layers"] is None:
                a["num_layers"] = int(hp.depth)
            return jitted(**a)

        wrapper.raw = fn
        return wrapper

    return deco
