"""Public theory functions are jit-compiled once per static configuration, in float64.

:func:`public` wraps a pure function ``f(hp, ..., kern=None, ...)``: it enters the
float64 scope (:mod:`phasefield.theory.precision`), builds a missing MLP kernel of hp's
sigma_w, activation and mlp_layers *outside* the trace (so its table sizes follow the
concrete sigma_w), checks a given one against them (:func:`.mlp.bind`: a stale kernel
raises, or is NaN under a trace) and, for the exact attention
map, attaches the grid sizes of the concrete sigma_A's cap and n to it with its values on the
mesh, computed outside the trace (``kern.att``, :func:`.attention.exact_table.point_kernel`;
sizes and whether the mesh interpolant is exact are static: ``jit`` compiles once per cap,
not per sigma_A), reads a missing
``num_layers`` from the concrete ``hp.depth``, and runs the rest under ``jax.jit``.
Inside a user's own ``jit``/``vmap`` (traced hp) the same code simply inlines.
"""

from __future__ import annotations

import functools
import inspect

import jax

from . import mlp
from .attention import exact_table
from .precision import float64


def public(*static_argnames: str):
    def deco(fn):
        sig = inspect.signature(fn)
        jitted = jax.jit(fn, static_argnames=static_argnames)

        @functools.wraps(fn)
        @float64
        def wrapper(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            hp = a["hp"]
            if "kern" in a and a["kern"] is None:
                a["kern"] = mlp.kernel(hp.sigma_w, hp.activation, hp.mlp_layers)
            elif "kern" in a:  # a kernel of another sigma_w is refused, never used
                a["kern"] = mlp.bind(a["kern"], hp.sigma_w, hp.activation, hp.mlp_layers)
            if "kern" in a and hp.attention == "exact" and a["kern"].att is None:
                logits = exact_table.concrete_logits(hp.sigma_a, hp.n_tokens)
                # sized by the scale's cap, not its value (a new sigma_A compiles nothing);
                # traced: the default sizes, the mesh values in the trace
                att = (
                    exact_table.kernel(hp.sigma_a, hp.n_tokens) if logits is None else exact_table.point_kernel(*logits)
                )
                a["kern"] = a["kern"].replace(att=att)
            if "num_layers" in a and a["num_layers"] is None:
                a["num_layers"] = int(hp.depth)
            return jitted(**a)

        wrapper.raw = fn
        return wrapper

    return deco
