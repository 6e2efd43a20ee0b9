"""Grid sizes of the exact-softmax map and its values on the stable-point mesh (issue 13).

:mod:`.exact` integrates on grids whose (static) sizes must resolve sigma_A and n. Inside
``jax.jit`` with a traced ``hp`` it cannot read them, so it would fall back to the sizes for
sigma_A <= 4.5, n <= 4096 (up to 24x more integrand values than sigma_A = 1, n = 32 need).
:class:`ExactKernel` carries the sizes chosen from the *concrete* sigma_A and n, built
outside the trace like the MLP kernel (:func:`phasefield.theory._api.public`, the sweep);
they are static fields, so ``jit`` keys on them through the pytree structure.

It may also carry ``s``: (S_1, S_rho) at the stable-point mesh of
:mod:`phasefield.theory.fixed_points` (:data:`MESH` cosine-spaced nodes on
[-1/(n-1), 1], the Chebyshev–Lobatto points) and at :data:`RHO0`. Those depend on
(sigma_A, n) alone, so a sweep computes them once per (sigma_A, n) and every point reuses
them; :func:`interpolate` is their barycentric (Chebyshev) interpolant, which the root
search bisects on before a polish on the exact map.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from . import exact

MESH = 33          # rho mesh of the stable-point search for the exact map
RHO0 = 0.5         # default input cosine of the stable-point search (its attractor: rho_star)


@struct.dataclass
class ExactKernel:
    s: Any                    # [2, MESH + 1] (S_1, S_rho) at mesh_points(n), or None
    n_a: int = struct.field(pytree_node=False, default=0)
    n_z: int = struct.field(pytree_node=False, default=0)


def mesh(n, m: int = MESH):
    """The rho mesh on [-1/(n-1), 1], denser at both ends (cosine spacing), ascending."""
    dt = jnp.result_type(float)
    n = jnp.asarray(n, dt)
    lo = -1.0 / (n - 1.0)
    t = (1.0 - jnp.cos(jnp.pi * jnp.arange(m, dtype=dt) / (m - 1))) / 2.0
    return lo + (1.0 - lo) * t


def mesh_points(n):
    """The mesh followed by RHO0: where ``ExactKernel.s`` holds (S_1, S_rho)."""
    dt = jnp.result_type(float)
    return jnp.concatenate([mesh(n), jnp.asarray([RHO0], dt)])


def values(hp, n_a: int, n_z: int):
    """(S_1, S_rho) [2, MESH + 1] at :func:`mesh_points` of ``hp.n_tokens``."""
    s1, sr = jax.vmap(lambda r: exact.s_values(hp, r, n_a, n_z))(mesh_points(hp.n_tokens))
    return jnp.stack([s1, sr])


class _Logits(NamedTuple):      # the two fields of hp that (S_1, S_rho) read
    sigma_a: Any
    n_tokens: Any


@functools.lru_cache(maxsize=None)
def values_fn(n_a: int, n_z: int):
    """Compiled :func:`values` of arrays (sigma_A, n), vmapped over them."""
    return jax.jit(jax.vmap(lambda sigma_a, n: values(_Logits(sigma_a, n), n_a, n_z)))


def kernel(hp, with_values: bool = False) -> ExactKernel:
    """Sizes from ``hp`` (concrete sigma_A, n; else the defaults) and, with ``with_values``,
    the mesh values (one compiled program per sizes when hp is concrete)."""
    n_a, n_z = exact.sizes(hp)
    s = None
    if with_values:
        sa, n = exact._concrete(hp.sigma_a), exact._concrete(hp.n_tokens)
        if sa is not None and n is not None and jnp.ndim(hp.sigma_a) == jnp.ndim(hp.n_tokens) == 0:
            dt = jnp.result_type(float)
            s = values_fn(n_a, n_z)(jnp.asarray([sa], dt), jnp.asarray([n], dt))[0]
        else:
            s = values(hp, n_a, n_z)
    return ExactKernel(s, n_a=n_a, n_z=n_z)


def interpolate(hp, s, rho):
    """(S_1, S_rho) at rho from the mesh values ``s`` [2, MESH + 1] (barycentric formula of
    the Chebyshev–Lobatto nodes; equal to ``s`` at the nodes)."""
    nodes = mesh(hp.n_tokens)
    vals = s[:, :MESH]
    w = jnp.where(jnp.arange(MESH) % 2 == 0, 1.0, -1.0).at[0].mul(0.5).at[-1].mul(0.5)
    d = rho - nodes
    hit = d == 0
    c = w / jnp.where(hit, 1.0, d)
    inter = (vals @ c) / jnp.sum(c)
    on_node = jnp.any(hit)
    at_node = vals @ hit.astype(vals.dtype)
    return tuple(jnp.where(on_node, at_node, inter))
