"""Grid sizes of the exact-softmax map and its values on the stable-point mesh (issue 13).

:mod:`.exact` integrates on grids whose (static) sizes must resolve sigma_A and n. Inside
``jax.jit`` with a traced ``hp`` it cannot read them, so it would fall back to the sizes for
sigma_A <= 4.5, n <= 4096 (up to 24x more integrand values than sigma_A = 1, n = 32 need).
:class:`ExactKernel` carries the sizes chosen from the *concrete* sigma_A and n, built
outside the trace like the MLP kernel (:func:`phasefield.theory._api.public`, the sweep);
they are static fields, so ``jit`` keys on them through the pytree structure.

It may also carry ``s``: (S_1, S_rho) at the stable-point mesh of
:mod:`phasefield.layers.paper.fixed_points` (:data:`MESH` cosine-spaced nodes on
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
import numpy as np
from flax import struct

from ..precision import float64
from . import exact

MESH = 33          # rho mesh of the stable-point search for the exact map
RHO0 = 0.5         # default input cosine of the stable-point search (its attractor: rho_star)


INTERP_TAIL = 1e-13  # Chebyshev tail of the mesh values below which their interpolant is
                     # the exact map to rounding (measured: max error ~ tail / 20, <= 2e-15)


@struct.dataclass
class ExactKernel:
    s: Any                    # [2, MESH + 1] (S_1, S_rho) at mesh_points(n), or None
    n_a: int = struct.field(pytree_node=False, default=0)
    n_z: int = struct.field(pytree_node=False, default=0)
    interp: bool = struct.field(pytree_node=False, default=False)   # s's interpolant is exact
    # the softmax-derivative term's (T_1, T_rho) at mesh_points(n), or None (block sweeps)
    t: Any = None
    interp_t: bool = struct.field(pytree_node=False, default=False)  # t's interpolant is exact

    def s_at(self, hp, rho):
        """(S_1, S_rho) at rho from the interpolant of ``s`` (use when ``interp``)."""
        return interpolate(hp, self.s, rho)


def mesh(n, m: int = MESH):
    """The rho mesh on [-1/(n-1), 1], denser at both ends (cosine spacing), ascending."""
    dt = jnp.result_type(float)
    n = jnp.asarray(n, dt)
    lo = -1.0 / (n - 1.0)
    t = (1.0 - jnp.cos(jnp.pi * jnp.arange(m, dtype=dt) / (m - 1))) / 2.0
    return lo + (1.0 - lo) * t


def mesh_points(n, m: int = MESH):
    """The mesh followed by RHO0: where ``ExactKernel.s`` holds (S_1, S_rho)."""
    dt = jnp.result_type(float)
    return jnp.concatenate([mesh(n, m), jnp.asarray([RHO0], dt)])


def values(hp, n_a: int, n_z: int, m: int = MESH):
    """(S_1, S_rho) [2, m + 1] at :func:`mesh_points` of ``hp.n_tokens``."""
    # lax.map, not vmap: each rho takes only its own branch of the pair rule (exact._pair_tables)
    s1, sr = jax.lax.map(lambda r: exact.s_values(hp, r, n_a, n_z), mesh_points(hp.n_tokens, m))
    return jnp.stack([s1, sr])


class _Logits(NamedTuple):      # the two fields of hp that (S_1, S_rho) read
    sigma_a: Any
    n_tokens: Any


@functools.lru_cache(maxsize=None)
def values_fn(n_a: int, n_z: int):
    """Compiled :func:`values` of arrays (sigma_A, n), one pair after the other (lax.map, so
    each evaluation takes only its own branch of the pair rule)."""
    return jax.jit(lambda sigma_a, n: jax.lax.map(lambda x: values(_Logits(*x), n_a, n_z), (sigma_a, n)))


def t_values(hp, n_a: int, n_z: int, m: int = MESH):
    """(T_1, T_rho) [2, m + 1] of the softmax-derivative term at :func:`mesh_points`."""
    t1, tr = jax.lax.map(lambda r: exact.t_values(hp, r, n_a, n_z), mesh_points(hp.n_tokens, m))
    return jnp.stack([t1, tr])


@functools.lru_cache(maxsize=None)
def tables_fn(n_a: int, n_z: int, m: int = MESH):
    """Compiled (S, T) values on an ``m``-point mesh of arrays (sigma_A, n), one pair after
    the other."""
    def one(x):
        hp = _Logits(*x)
        return values(hp, n_a, n_z, m), t_values(hp, n_a, n_z, m)
    return jax.jit(lambda sigma_a, n: jax.lax.map(one, (sigma_a, n)))


def chebyshev_tail(s) -> float:
    """Largest of the last 6 Chebyshev coefficients of the mesh values ``s`` [..., MESH + 1]
    (NumPy; the mesh is Chebyshev-Lobatto in rho): the interpolant's error is about a
    twentieth of it once it reaches rounding (S is analytic in rho)."""
    m = np.shape(s)[-1] - 1                      # the mesh (the last value is at RHO0)
    v = np.asarray(s, np.float64)[..., :m]
    j = np.arange(m)
    w = np.where((j == 0) | (j == m - 1), 0.5, 1.0)
    c = (2.0 / (m - 1)) * (v * w) @ np.cos(np.pi * np.outer(j, j) / (m - 1))
    return float(np.max(np.abs(c[..., -6:])))


def interpolant_exact(s) -> bool:
    """Whether the interpolant of the mesh values ``s`` [..., 2, MESH + 1] (one or several
    (sigma_A, n)) may stand for the exact map: Chebyshev tail <= INTERP_TAIL."""
    s = np.asarray(s, np.float64)
    return bool(np.all(np.isfinite(s))) and chebyshev_tail(s) <= INTERP_TAIL


@float64
def kernel(hp, with_values: bool = False) -> ExactKernel:
    """Sizes from ``hp`` (concrete sigma_A, n; else the defaults) and, with ``with_values``,
    the mesh values (one compiled program per sizes when hp is concrete)."""
    n_a, n_z = exact.sizes(hp)
    s, interp = None, False
    if with_values:
        logits = concrete_logits(hp)
        if logits is not None:
            s = jnp.asarray(_mesh_values(*logits, n_a, n_z))
            interp = interpolant_exact(s)
        else:
            s = values(hp, n_a, n_z)
    return ExactKernel(s, n_a=n_a, n_z=n_z, interp=interp)


def concrete_logits(hp):
    """(sigma_A, n) as floats when both are concrete scalars, else None."""
    if jnp.ndim(hp.sigma_a) or jnp.ndim(hp.n_tokens):
        return None
    sa, n = exact._concrete(hp.sigma_a), exact._concrete(hp.n_tokens)
    return None if sa is None or n is None else (sa, n)


@functools.lru_cache(maxsize=256)
def _mesh_values(sigma_a: float, n: float, n_a: int, n_z: int) -> np.ndarray:
    """Mesh values of one concrete (sigma_A, n), computed once per process."""
    with jax.enable_x64(True):
        return np.asarray(values_fn(n_a, n_z)(jnp.asarray([sigma_a]), jnp.asarray([n]))[0])


def interpolate(hp, s, rho):
    """(S_1, S_rho) at rho from the mesh values ``s`` [2, MESH + 1] (barycentric formula of
    the Chebyshev–Lobatto nodes; equal to ``s`` at the nodes)."""
    m = s.shape[-1] - 1                           # the mesh size (static)
    nodes = mesh(hp.n_tokens, m)
    vals = s[:, :m]
    w = jnp.where(jnp.arange(m) % 2 == 0, 1.0, -1.0).at[0].mul(0.5).at[-1].mul(0.5)
    d = rho - nodes
    hit = d == 0
    c = w / jnp.where(hit, 1.0, d)
    inter = (vals @ c) / jnp.sum(c)
    on_node = jnp.any(hit)
    at_node = vals @ hit.astype(vals.dtype)
    return tuple(jnp.where(on_node, at_node, inter))


# ---- tables of many logit scales (block sweeps) ----------------------------------------------

MESH_FULL = 97            # the mesh every scale's values are returned on (S and T are analytic
                          # in rho; 97 Chebyshev-Lobatto nodes reach rounding up to sigma_A ~ 4)
SIZE_FLOOR = 0.25         # exact.sizes' smallest logit scale: every scale below shares its grid


CAPS = (SIZE_FLOOR, 1.0, 2.0, 2.0 ** 1.5, 4.0)   # then ratio sqrt(2) up: the grid's cost grows
                                                # ~ sigma_A^2 and the mesh with it, so the
                                                # buckets narrow where the tables cost most


def bucket_caps(sigma_a) -> np.ndarray:
    """The logit scale each of ``sigma_a`` gets its grid sizes for: the smallest of
    :data:`CAPS` (continued by factors sqrt(2)) at or above it, capped at the largest of
    ``sigma_a`` (so the largest scale is sized as a single table of it would be). Few
    distinct caps: few compiled programs."""
    sa = np.asarray(sigma_a, np.float64)
    top = max(float(sa.max()), CAPS[-1]) if sa.size else CAPS[-1]
    ladder = list(CAPS)
    while ladder[-1] < top:
        ladder.append(ladder[-1] * 2.0 ** 0.5)
    ladder = np.asarray(ladder)
    caps = ladder[np.minimum(np.searchsorted(ladder, sa * (1.0 - 1e-12)), len(ladder) - 1)]
    return np.minimum(caps, sa.max()) if sa.size else caps


def first_mesh(cap: float) -> int:
    """The mesh tried first at logit scale ``cap`` (measured at n = 16: 33 nodes reach the
    tail INTERP_TAIL up to sigma_A ~ 1.5, 49 up to ~ 2.5, 65 up to ~ 3, 81 up to ~ 4); a
    scale whose tail is not reached is recomputed on :data:`MESH_FULL` nodes."""
    return 33 if cap <= 1.0 else 49 if cap <= 2.0 else 65 if cap <= 2.9 else 81 if cap <= 4.0 else MESH_FULL


@functools.lru_cache(maxsize=None)
def st_fn(n_a: int, n_z: int, m: int):
    """Compiled (S, T) [2, m + 1] each on the ``m``-point mesh (and RHO0) of one (sigma_A, n)
    (scalars: one program serves any number of scales), from one evaluation of the moments
    per rho (:func:`exact.st_values`)."""
    def one(sigma_a, n):
        hp = _Logits(sigma_a, n)
        (s1, sr), (t1, tr) = jax.lax.map(lambda r: exact.st_values(hp, r, n_a, n_z), mesh_points(n, m))
        return jnp.stack([s1, sr]), jnp.stack([t1, tr])
    return jax.jit(one)


@functools.lru_cache(maxsize=4096)
def _st_values(sigma_a: float, n: float, n_a: int, n_z: int, m: int):
    """(S, T) of one concrete (sigma_A, n) on grid (n_a, n_z) and mesh m, computed once per
    process (3 kB each: a second sweep over the same scales reads them)."""
    s, t = st_fn(n_a, n_z, m)(jnp.asarray(sigma_a), jnp.asarray(n))
    s, t = np.asarray(s), np.asarray(t)
    s.flags.writeable = t.flags.writeable = False
    return s, t


def resample(vals, n, m_to: int = MESH_FULL) -> np.ndarray:
    """Mesh values ``vals`` [..., m + 1] (an ``m``-point mesh and RHO0) as values on the
    ``m_to``-point mesh (and RHO0): their Chebyshev interpolant evaluated at its nodes (the
    same polynomial, to rounding, once its tail is below INTERP_TAIL)."""
    vals = np.asarray(vals, np.float64)
    m = vals.shape[-1] - 1
    if m == m_to:
        return vals
    with jax.enable_x64(True):
        src, dst = np.asarray(mesh(float(n), m)), np.asarray(mesh(float(n), m_to))
    w = np.where(np.arange(m) % 2 == 0, 1.0, -1.0)
    w[0] *= 0.5
    w[-1] *= 0.5
    d = dst[:, None] - src[None, :]
    hit = d == 0
    c = w / np.where(hit, 1.0, d)
    c = c / c.sum(1, keepdims=True)
    rows = hit.any(1)
    c[rows] = hit[rows].astype(np.float64)                 # on a node: its value
    return np.concatenate([vals[..., :m] @ c.T, vals[..., m:]], -1)


@float64
def scale_tables(sigma_a, n: float):
    """(S, T) [k, 2, MESH_FULL + 1] of each logit scale of ``sigma_a`` [k] at ``n`` tokens,
    and whether every interpolant is exact (S's, T's): the block sweeps' per-scale tables.

    Each scale is integrated on the grid sized for its :func:`bucket_caps` cap (not the
    largest scale's: the exact sums to the quadrature's rounding, ~1e-15) and on the mesh
    :func:`first_mesh` of the cap, the values then :func:`resample`\\ d onto the full mesh;
    scales whose Chebyshev tail on that mesh exceeds INTERP_TAIL are recomputed on the full
    mesh. One compiled program per (cap, mesh)."""
    sa = np.asarray(sigma_a, np.float64).reshape(-1)
    caps = bucket_caps(sa)
    s_out = np.empty((sa.size, 2, MESH_FULL + 1))
    t_out = np.empty_like(s_out)

    def run(sel, cap, m):
        n_a, n_z = exact.sizes(None, sigma_max=float(cap), n_max=float(n))
        out = [_st_values(float(x), float(n), n_a, n_z, m) for x in sa[sel]]
        return np.stack([s for s, _ in out]), np.stack([t for _, t in out])

    for cap in np.unique(caps):
        sel = np.flatnonzero(caps == cap)
        m = first_mesh(float(cap))
        s, t = run(sel, cap, m)
        if m != MESH_FULL:
            bad = np.array([not (interpolant_exact(s[i]) and interpolant_exact(t[i])) for i in range(len(sel))])
            s, t = resample(s, n), resample(t, n)
            if bad.any():
                s[bad], t[bad] = run(sel[bad], cap, MESH_FULL)
        s_out[sel], t_out[sel] = s, t
    return s_out, t_out, interpolant_exact(s_out) if sa.size else False, \
        interpolant_exact(t_out) if sa.size else False
