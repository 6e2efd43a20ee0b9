"""Grid sizes of the exact-softmax map and its values on the stable-point mesh.

:mod:`.exact` integrates on grids whose (static) sizes must resolve sigma_A and n. Inside
``jax.jit`` with a traced sigma_A or n it cannot read them, so it would fall back to the sizes for
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
import math
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .. import table_cache
from ..precision import float64
from . import exact

MESH = 33  # rho mesh of the stable-point search for the exact map
RHO0 = 0.5  # default input cosine of the stable-point search (its attractor: rho_star)


INTERP_TAIL = 1e-13  # Chebyshev tail of the mesh values below which their interpolant is
# the exact map to rounding (measured: max error ~ tail / 20, <= 2e-15)


@struct.dataclass
class ExactKernel:
    s: Any  # [2, MESH + 1] (S_1, S_rho) at mesh_points(n), or None
    n_a: int = struct.field(pytree_node=False, default=0)
    n_z: int = struct.field(pytree_node=False, default=0)
    interp: bool = struct.field(pytree_node=False, default=False)  # s's interpolant is exact
    # the softmax-derivative term's (T_1, T_rho) at mesh_points(n), or None (block sweeps)
    t: Any = None
    interp_t: bool = struct.field(pytree_node=False, default=False)  # t's interpolant is exact
    # the tables serve unit input norm only (a block sweep's, attached when q0 = 1): NaN at
    # another norm; else (a point's) the map integrates at the point's own logit scale there
    unit_norm: bool = struct.field(pytree_node=False, default=False)
    # the values of every logit scale up to the point's (:class:`.scale_table.ScaleTable`),
    # or None: what a layer reading tokens of any norm uses at its scale sigma_A q
    scales: Any = None

    def s_at(self, n_tokens, rho):
        """(S_1, S_rho) at rho from the interpolant of ``s`` (use when ``interp``)."""
        return interpolate(n_tokens, self.s, rho)


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


def values(sigma_a, n_tokens, n_a: int, n_z: int, m: int = MESH):
    """(S_1, S_rho) [2, m + 1] of logit scale ``sigma_a`` at :func:`mesh_points` of ``n_tokens``."""
    # lax.map, not vmap: each rho takes only its own branch of the pair rule (exact._pair_tables)
    s1, sr = jax.lax.map(lambda r: exact.s_values(sigma_a, n_tokens, r, n_a, n_z), mesh_points(n_tokens, m))
    return jnp.stack([s1, sr])


@functools.cache
def values_fn(n_a: int, n_z: int):
    """Compiled :func:`values` of arrays (sigma_A, n), one pair after the other (lax.map, so
    each evaluation takes only its own branch of the pair rule)."""
    return jax.jit(lambda sigma_a, n: jax.lax.map(lambda x: values(*x, n_a, n_z), (sigma_a, n)))


def t_values(sigma_a, n_tokens, n_a: int, n_z: int, m: int = MESH):
    """(T_1, T_rho) [2, m + 1] of the softmax-derivative term at :func:`mesh_points`."""
    t1, tr = jax.lax.map(lambda r: exact.t_values(sigma_a, n_tokens, r, n_a, n_z), mesh_points(n_tokens, m))
    return jnp.stack([t1, tr])


@functools.cache
def tables_fn(n_a: int, n_z: int, m: int = MESH):
    """Compiled (S, T) values on an ``m``-point mesh of arrays (sigma_A, n), one pair after
    the other."""

    def one(x):
        return values(*x, n_a, n_z, m), t_values(*x, n_a, n_z, m)

    return jax.jit(lambda sigma_a, n: jax.lax.map(one, (sigma_a, n)))


def chebyshev_coefficients(v, axis: int = -1) -> np.ndarray:
    """Chebyshev coefficients (NumPy) of the values ``v`` at the Chebyshev–Lobatto nodes
    along ``axis`` (either order: a reversal flips the odd coefficients' signs only)."""
    v = np.moveaxis(np.asarray(v, np.float64), axis, -1)
    m = v.shape[-1]
    j = np.arange(m)
    w = np.where((j == 0) | (j == m - 1), 0.5, 1.0)
    return np.moveaxis((2.0 / (m - 1)) * (v * w) @ np.cos(np.pi * np.outer(j, j) / (m - 1)), -1, axis)


def chebyshev_tail(s) -> float:
    """Largest of the last 6 Chebyshev coefficients of the mesh values ``s`` [..., MESH + 1]
    (NumPy; the mesh is Chebyshev-Lobatto in rho): the interpolant's error is about a
    twentieth of it once it reaches rounding (S is analytic in rho)."""
    v = np.asarray(s, np.float64)[..., : np.shape(s)[-1] - 1]  # the mesh (the last value is at RHO0)
    return float(np.max(np.abs(chebyshev_coefficients(v)[..., -6:])))


def interpolant_exact(s) -> bool:
    """Whether the interpolant of the mesh values ``s`` [..., 2, MESH + 1] (one or several
    (sigma_A, n)) may stand for the exact map: Chebyshev tail <= INTERP_TAIL."""
    s = np.asarray(s, np.float64)
    return bool(np.all(np.isfinite(s))) and chebyshev_tail(s) <= INTERP_TAIL


@float64
def kernel(sigma_a, n_tokens) -> ExactKernel:
    """Sizes for the logit scale ``sigma_a`` and ``n_tokens`` (when concrete; else the
    defaults), no mesh values (:func:`point_kernel` has them, sized by the scale's cap)."""
    n_a, n_z = exact.sizes(sigma_a, n_tokens)
    return ExactKernel(None, n_a=n_a, n_z=n_z)


def concrete_logits(sigma_a, n_tokens):
    """(sigma_A, n) as floats when both are concrete scalars, else None."""
    if jnp.ndim(sigma_a) or jnp.ndim(n_tokens):
        return None
    sa, n = exact.concrete_max(sigma_a), exact.concrete_max(n_tokens)
    return None if sa is None or n is None else (sa, n)


def interpolate(n_tokens, s, rho):
    """(S_1, S_rho) at rho from the mesh values ``s`` [2, MESH + 1] on the mesh of ``n_tokens``
    (barycentric formula of the Chebyshev–Lobatto nodes; equal to ``s`` at the nodes)."""
    m = s.shape[-1] - 1  # the mesh size (static)
    nodes = mesh(n_tokens, m)
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

MESH_FULL = 97  # the mesh every scale's values are returned on (S and T are analytic
# in rho; 97 Chebyshev-Lobatto nodes reach rounding up to sigma_A ~ 4)
SIZE_FLOOR = 0.25  # exact.sizes' smallest logit scale: every scale below shares its grid


CAPS = (SIZE_FLOOR, 1.0, 2.0, 2.0**1.5, 4.0)  # then ratio sqrt(2) up: the grid's cost grows
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
        ladder.append(ladder[-1] * 2.0**0.5)
    ladder = np.asarray(ladder)
    caps = ladder[np.minimum(np.searchsorted(ladder, sa * (1.0 - 1e-12)), len(ladder) - 1)]
    return np.minimum(caps, sa.max()) if sa.size else caps


def first_mesh(cap: float) -> int:
    """The mesh tried first at logit scale ``cap`` (measured at n = 16: 33 nodes reach the
    tail INTERP_TAIL up to sigma_A ~ 1.5, 49 up to ~ 2.5, 65 up to ~ 3, 81 up to ~ 4); a
    scale whose tail is not reached is recomputed on :data:`MESH_FULL` nodes."""
    return 33 if cap <= 1.0 else 49 if cap <= 2.0 else 65 if cap <= 2.9 else 81 if cap <= 4.0 else MESH_FULL


LEVEL_RATIO = 1.5  # successive half-widths of the truncated shared-logit lattices
LEVEL_LEAST = 16  # the narrowest (sigma_c just above SIGMA_C_LATTICE needs <= 17)
Z_KEEP = exact.Z_MAX + 1.0  # a truncated lattice reaches 9 sigma_c: the nodes it drops weigh
# < exp(-40.5) ~ 3e-18 of the central one


def lattice_levels(n_a: int, n_z: int) -> tuple:
    """Static half-widths (ascending) of the shared-logit lattices :func:`st_point` picks
    from: factors LEVEL_RATIO from LEVEL_LEAST, the last the full lattice of
    :func:`exact.lattice_nodes` (which the wide rule of :func:`exact._pair_tables` always
    uses, sized for the largest shared-logit std sigma_c the grid resolves)."""
    n_c = exact.lattice_nodes(n_a, n_z)[0]
    out, x = [], float(LEVEL_LEAST)
    while x < n_c / 1.1:
        out.append(int(math.ceil(x)))
        x *= LEVEL_RATIO
    return tuple(out) + (n_c,)


Z_LEVEL_RATIO = 1.4  # successive sizes of the z-rules of the one-dimensional u tables


def z_levels(n_z: int) -> tuple:
    """Static sizes (ascending, odd, from exact's least 49 up to ``n_z``) of the z-rules
    :func:`_u_tables` picks from: each resolves own-logit stds sigma_d up to
    (size - 1) H_X / (2 Z_MAX 1.05), the rule :func:`exact.sizes` sizes n_z by."""
    out, x = [], 49.0
    while x < n_z / 1.1:
        k = int(math.ceil(x))
        out.append(k + (1 - k % 2))
        x *= Z_LEVEL_RATIO
    return tuple(out) + (n_z,)


class _Z(NamedTuple):
    z: Any
    wz: Any


def _u_tables(v, sd, ps, sizes):
    """:func:`exact.u_tables` (u_p(v) = E_d g_p(v + d), d ~ N(0, sd^2)) on the first z-rule
    of ``sizes`` that resolves sd (the spacing sd 2 Z_MAX / (size - 1) <= H_X / 1.05, as
    :func:`exact.sizes` asks of the largest logit scale; the last size when none does)."""
    dt = v.dtype

    def rule(m):
        return lambda: tuple(exact.u_tables(v, sd, _Z(*exact.z_nodes(m, dt)), ps))

    reach = (jnp.asarray(sizes[:-1], dt) - 1.0) * exact.H_X / (2 * exact.Z_MAX * 1.05)
    return list(jax.lax.switch(jnp.sum(reach < sd), [rule(m) for m in sizes]))


def _pair_st(gr, levels, zs=None):
    """(f, H_11, H_2x) on the a-grid of ``gr``: f = H_00, and H_2x = H_22 - 2 H_21 (the
    pair tables of :func:`exact._pair_tables`, the same rules and nodes; T_rho reads H_21 and
    H_22 only through it, and S_rho and T_rho read no other pair table), from three matrix
    products. The lattice rule sums the nodes out to Z_KEEP sigma_c (the first of
    ``levels`` reaching it; the full lattice, as :func:`exact._pair_tables`, when none does)."""
    dt = gr.a.dtype
    n_a = gr.a.shape[0]
    n_z = gr.z.shape[0]
    flip = gr.rho < 0
    ps = (0, 1, 2)
    zs = (n_z,) if zs is None else zs

    half_a = n_a // 2

    def contract(u, w):
        # H_00 and H_11 are symmetric (w and the lattice are even in k, the flip reverses
        # k): their blocks (top-top, top-bottom, bottom-bottom) of the a-grid's halves
        uf = {p: jnp.where(flip, u[p][:, ::-1], u[p]) for p in ps}

        def sym(p):
            lt, lb = (u[p] * w)[:half_a], (u[p] * w)[half_a:]
            rt, rb = uf[p][:half_a], uf[p][half_a:]
            return lt @ rt.T, lt @ rb.T, lb @ rb.T

        return sym(0), sym(1), (u[2] * w) @ (uf[2] - 2.0 * uf[1]).T

    def narrow():
        t, wt = exact.gh_nodes(exact.N_GH, dt)
        v = gr.a[:, None] + gr.sigma_c * t
        return contract(dict(zip(ps, _u_tables(v, gr.sigma_d, ps, zs))), wt)

    n_full, k_max = exact.lattice_nodes(n_a, n_z)
    top = k_max // n_full  # largest multiple of the fine step
    step = gr.h / exact.LATTICE_REFINE
    mult = jnp.floor(jnp.minimum(gr.sigma_c / exact.C_SPACING, exact.SPACING_MAX) / step)
    mult = jnp.clip(mult, 1, top).astype(jnp.int32)

    # the u tables on the fine lattice the widest level reaches (one z-rule switch), then
    # one branch per level: gather and contract (``levels`` below the full lattice reach
    # only part of it)
    fine = gr.a[0] + jnp.arange(-k_max, (n_a - 1) * exact.LATTICE_REFINE + k_max + 1, dtype=dt) * step

    def wide(n_c, tables):
        k = jnp.arange(-n_c, n_c + 1) * mult
        idx = (jnp.arange(n_a) * exact.LATTICE_REFINE)[:, None] + k[None, :] + k_max
        sc = jnp.where(gr.sigma_c > 0, gr.sigma_c, 1.0)
        wc = jnp.exp(-0.5 * jnp.square(k * step / sc))
        out = contract({p: tab[idx] for p, tab in zip(ps, tables)}, wc / jnp.sum(wc))
        covered = exact.Z_MAX * gr.sigma_c <= n_c * mult * step
        return jax.tree_util.tree_map(lambda v: jnp.where(covered, v, jnp.nan), out)

    def lattice():
        tables = _u_tables(fine, gr.sigma_d, ps, zs)
        reach = jnp.asarray(levels[:-1], dt) * mult * step
        level = jnp.sum(reach < Z_KEEP * gr.sigma_c)  # first level reaching Z_KEEP sigma_c
        return jax.lax.switch(level, [functools.partial(wide, n_c) for n_c in levels], tables)

    return jax.lax.cond(gr.sigma_c >= exact.SIGMA_C_LATTICE, lattice, narrow)


def _powers(f, n):
    """(f^(n-1), f^(n-2)) of the pair table f = H_00: integer powers (products) when n is a
    static integer, else exp((n - p) log f) as :func:`exact.pair_moments` (equal to rounding)."""
    if isinstance(n, int):
        p2 = jax.lax.integer_pow(f, n - 2) if n > 2 else jnp.ones_like(f)
        return p2 * f, p2
    f_log = exact.safe_log(f)
    n = jnp.asarray(n, f.dtype)
    return exact.log_power(f_log, n - 1.0), exact.log_power(f_log, n - 2.0)


A_LEVEL_RATIO = 1.2  # successive sizes of the pair moments' a-grids
H_PAIR = 0.25  # their spacing at most (pre-LN 128 scales against one full grid:
# 0.25 left 2e-14 relative in S, 0.3 left 1e-13 and cut the tables'
# CPU time ~20 %; the row moments stay on the full a-grid: at
# spacing 0.28 they left 1e-13 in S_1, 7e-11 in T_1)


def _first_reaching(values, reach, bound):
    """``values`` (ascending, with their ``reach`` ascending) up to the first whose reach is
    at least ``bound`` (all of them when none is)."""
    out = []
    for v, r in zip(values, reach):
        out.append(v)
        if r >= bound:
            break
    return tuple(out)


def grid_levels(n_a: int, n_z: int, n: float | None = None) -> tuple:
    """Static ((a-grid size, lattice levels, z-rule sizes), ...) the pair moments of
    :func:`st_point` pick from by tau = sigma_A sqrt(1 - rho): the smallest a-grid whose
    spacing is at most H_PAIR (:func:`exact.sizes` sizes ``n_a`` for spacing H_A at the
    largest tau; the grid is [-(log n + Z_MAX tau + A_LOW_PAD), Z_MAX tau + A_HIGH_PAD]),
    factors A_LEVEL_RATIO from that of tau = 0.25 up to ``n_a`` (always the last); each with the lattice and z-rule levels
    that the shared and own logit stds sigma_c, sigma_d <= tau of its taus can pick (``n``
    tokens, static, else any n >= 2)."""
    pad = math.log(max(float(n or 2.0), 2.0)) + exact.A_LOW_PAD + exact.A_HIGH_PAD
    sizes, x = [], max(96.0, math.ceil((pad + 2 * exact.Z_MAX * 0.25) / H_PAIR) + 1.0)  # tau <= 0.25
    while x < n_a / 1.1:
        sizes.append(int(math.ceil(x)))
        x *= A_LEVEL_RATIO
    sizes.append(n_a)
    step_max = exact.H_A / exact.LATTICE_REFINE
    lo = exact.SIGMA_C_LATTICE
    out = []
    for m in sizes:
        lv, zs = lattice_levels(m, n_z), z_levels(n_z)
        if m < n_a:
            tau = ((m - 1) * H_PAIR - pad) / (2 * exact.Z_MAX)  # the largest it serves
            need = Z_KEEP * max(lo / (lo / exact.C_SPACING - step_max), tau / (exact.SPACING_MAX - step_max))
            lv = _first_reaching(lv, lv, need)
            zs = _first_reaching(zs, [(z - 1) * exact.H_X / (2 * exact.Z_MAX * 1.05) for z in zs], tau)
        out.append((m, lv, zs))
    return tuple(out)


def _sums(sigma_a, n_tokens, rho, n_a, n_z, levels, zs, n_static):
    """The pair sums <H_11, W_n1>, <H_11^2, W_n2>, <H_2x, W_n1> that (S, T) read
    (:func:`_pair_st`; W_np = H_00^(n-p) w_a w_b) on an a-grid of n_a points, from the
    blocks of the symmetric H_00, H_11 and W_np (the off-diagonal block twice)."""
    gr = exact.Grid(sigma_a, n_tokens, rho, n_a, n_z)
    f, h11, h2x = _pair_st(gr, levels, zs)
    n = gr.n if n_static is None else n_static
    wt, wb = gr.wa[: n_a // 2], gr.wa[n_a // 2 :]
    ab = abab = 0.0
    w1 = []
    for fb, hb, w2, twice in zip(f, h11, (wt[:, None] * wt, wt[:, None] * wb, wb[:, None] * wb), (1.0, 2.0, 1.0)):
        p1, p2 = _powers(fb, n)
        w1.append(p1 * w2)
        ab = ab + twice * jnp.sum(hb * w1[-1])
        abab = abab + twice * jnp.sum(hb * hb * (p2 * w2))
    w_n1 = jnp.block([[w1[0], w1[1]], [w1[1].T, w1[2]]])
    return ab, abab, jnp.sum(h2x * w_n1)


def st_point(sigma_a, n_tokens, rho, n_a: int, n_z: int, levels=None, zs=None, n_static=None, grids=None):
    """((S_1, S_rho), (T_1, T_rho)) at token cosine rho (logit scale sigma_A, n tokens), as
    :func:`exact.st_values` (the pair moments from :func:`_pair_st`: three matrix products
    instead of six, a lattice as wide as sigma_c needs, a z-rule as long as sigma_d needs; with ``grids``
    (:func:`grid_levels`), on an a-grid as long as tau needs; with ``n_static``, an
    integer n, integer powers; the row moments as there): equal to the quadrature's
    accuracy (measured <= 2e-14 relative)."""
    levels = lattice_levels(n_a, n_z) if levels is None else levels
    rm = exact.row_moments(sigma_a, n_tokens, rho, n_a, n_z)
    if grids is None:
        ab, abab, x = _sums(sigma_a, n_tokens, rho, n_a, n_z, levels, (n_z,) if zs is None else zs, n_static)
    else:
        dt = jnp.result_type(float)
        tau = exact.safe_sqrt(jnp.square(sigma_a) * (1.0 - jnp.clip(jnp.asarray(rho, dt), -1.0, 1.0)))
        span = jnp.log(jnp.asarray(n_tokens, dt)) + 2 * exact.Z_MAX * tau + exact.A_LOW_PAD + exact.A_HIGH_PAD
        sizes = jnp.asarray([m for m, _, _ in grids[:-1]], dt)
        index = jnp.sum((sizes - 1.0) * H_PAIR < span)  # the first a-grid with spacing <= H_PAIR
        ab, abab, x = jax.lax.switch(
            index, [functools.partial(_sums, sigma_a, n_tokens, rho, m, n_z, lv, z, n_static) for m, lv, z in grids]
        )
    n = jnp.asarray(n_tokens, jnp.result_type(float))
    t1 = n * rm["a2"] - 2.0 * n * rm["a3"] + n * rm["a4"] + n * (n - 1.0) * rm["a2a2"]
    tr = n * ab + n * x + n * (n - 1.0) * abab
    return (n * rm["a2"], n * ab), (t1, tr)


@functools.cache
def st_mesh_fn(n_a: int, n_z: int, n: int | None = None, adaptive: bool = True):
    """Compiled (S, T) [2, MESH_FULL + 1] each of one (sigma_A, n) at the first ``count`` of
    the points ``rho`` [MESH_FULL + 1] (NaN after them): one program for every scale up to
    the one (n_a, n_z) are sized for and every mesh. ``adaptive``: :func:`st_point` with
    :func:`grid_levels` (the a-grid, lattice and z-rule of each point are picked by its
    tau, sigma_c, sigma_d: the cheapest run, for many scales, but ~50 branches that take
    ~8 s to compile at the point cap); else one a-grid, the full lattice and z-rule at every
    point (one branch: ~1 s to compile, ~10x the run time a point; for a single scale).
    With ``n`` (a static integer number of tokens; the program's n argument must equal
    it), integer powers."""
    if adaptive:
        kw, opts = dict(grids=grid_levels(n_a, n_z, n)), None
    else:
        kw, opts = dict(levels=lattice_levels(n_a, n_z)[-1:], zs=(n_z,)), one_scale_options()

    def one(sigma_a, n_tokens, rho, count):
        nan = jnp.full((), jnp.nan, rho.dtype)

        def point(x):
            i, r = x
            return jax.lax.cond(
                i < count,
                lambda: st_point(sigma_a, n_tokens, r, n_a, n_z, n_static=n, **kw),
                lambda: ((nan, nan), (nan, nan)),
            )

        (s1, sr), (t1, tr) = jax.lax.map(point, (jnp.arange(rho.shape[0]), rho))
        return jnp.stack([s1, sr]), jnp.stack([t1, tr])

    return jax.jit(one, compiler_options=opts)


def one_scale_options() -> dict | None:
    """XLA:CPU options of the one-scale table program (``st_mesh_fn(adaptive=False)``), which
    a process runs a few times (one point: once): LLVM -O1 with the classic emitters
    (:data:`phasefield._runtime.OPTIMIZED`), compiled in ~0.6 s instead of ~1.2 s for the
    same run time (values within 1e-14). None off CPU or where XLA does not know them."""
    from ..._runtime import OPTIMIZED, options_known

    ok = jax.default_backend() == "cpu" and options_known(OPTIMIZED)
    return dict(OPTIMIZED) if ok else None


@functools.cache
def _mesh_points(n: float, m: int) -> np.ndarray:
    """:func:`mesh_points` of (n, m) padded with RHO0 to MESH_FULL + 1 (:func:`st_mesh_fn`)."""
    with jax.enable_x64(True):
        pts = np.asarray(_mesh_fn()(jnp.asarray(n, jnp.float64), jnp.asarray(m, jnp.float64)))[:m]
    return np.concatenate([pts, np.full(MESH_FULL + 1 - m, RHO0)])


@functools.cache
def _mesh_fn():
    """:func:`mesh` of (n, m) with m traced (its first m of MESH_FULL entries): one program
    for every mesh size."""

    def fn(n, m):
        lo = -1.0 / (n - 1.0)
        t = (1.0 - jnp.cos(jnp.pi * jnp.arange(MESH_FULL, dtype=n.dtype) / (m - 1))) / 2.0
        return lo + (1.0 - lo) * t

    return jax.jit(fn)


@functools.lru_cache(maxsize=4096)
def _st_values(sigma_a: float, n: float, n_a: int, n_z: int, m: int, adaptive: bool = True):
    """(S, T) [2, m + 1] of one concrete (sigma_A, n) with sizes (n_a, n_z) and mesh m
    (:func:`st_mesh_fn`), computed once per process (3 kB each: a second sweep over the
    same scales reads them)."""
    fn = st_mesh_fn(n_a, n_z, int(n) if float(n).is_integer() else None, adaptive)
    s, t = fn(jnp.asarray(sigma_a), jnp.asarray(n), jnp.asarray(_mesh_points(float(n), m)), jnp.asarray(m + 1))
    s, t = np.asarray(s)[:, : m + 1], np.asarray(t)[:, : m + 1]
    s.flags.writeable = t.flags.writeable = False
    return s, t


def barycentric_matrix(src, dst) -> np.ndarray:
    """[len(dst), len(src)]: the weights that carry values at the Chebyshev–Lobatto nodes
    ``src`` (either order) to their polynomial interpolant at ``dst`` (the barycentric formula
    of the second kind; a point on a node takes that node's value)."""
    src, dst = np.asarray(src, np.float64), np.asarray(dst, np.float64)
    m = len(src)
    w = np.where(np.arange(m) % 2 == 0, 1.0, -1.0)
    w[0] *= 0.5
    w[-1] *= 0.5
    d = dst[:, None] - src[None, :]
    hit = d == 0
    c = w / np.where(hit, 1.0, d)
    c = c / c.sum(1, keepdims=True)
    rows = hit.any(1)
    c[rows] = hit[rows].astype(np.float64)  # on a node: its value
    return c


def resample(vals, n, m_to: int = MESH_FULL) -> np.ndarray:
    """Mesh values ``vals`` [..., m + 1] (an ``m``-point mesh and RHO0) as values on the
    ``m_to``-point mesh (and RHO0): their Chebyshev interpolant evaluated at its nodes (the
    same polynomial, to rounding, once its tail is below INTERP_TAIL)."""
    vals = np.asarray(vals, np.float64)
    m = vals.shape[-1] - 1
    if m == m_to:
        return vals
    src, dst = _mesh_points(float(n), m)[:m], _mesh_points(float(n), m_to)[:m_to]  # where the values are
    return np.concatenate([vals[..., :m] @ barycentric_matrix(src, dst).T, vals[..., m:]], -1)


SCALE_NODES = (29, 57)  # Chebyshev–Lobatto node counts in the logit scale (nested: the second
# holds the first), tried in turn on a range of scales
SCALE_TAIL = INTERP_TAIL  # tail of the coefficients in the scale (relative to the values' size,
# at least 1) below which the interpolant stands for the tables


def scale_nodes(lo: float, hi: float, m: int) -> np.ndarray:
    """``m`` Chebyshev–Lobatto nodes on [lo, hi], ascending (``m`` and ``2 m - 1`` nest
    bitwise: the angles pi j / (m - 1) differ by powers of two)."""
    return lo + (hi - lo) * (1.0 - np.cos(np.pi * np.arange(m) / (m - 1))) / 2.0


def scale_tail(vals) -> float:
    """The Chebyshev tail in the scale of tables ``vals`` [m, ...] (finite) at
    :func:`scale_nodes`: the largest of each entry's last 6 coefficients over max(1, its
    largest value)."""
    v = np.asarray(vals, np.float64)
    tail = np.max(np.abs(chebyshev_coefficients(v, axis=0)[-6:]), axis=0)
    return float(np.max(tail / np.maximum(1.0, np.max(np.abs(v), axis=0))))


@float64
def scale_tables(sigma_a, n: float, nodes=None):
    """(S, T) [k, 2, MESH_FULL + 1] of each logit scale of ``sigma_a`` [k] at ``n`` tokens,
    and whether every interpolant is exact (S's, T's): the block sweeps' per-scale tables.

    Every scale is integrated by one compiled program (:func:`st_mesh_fn`, sized for the
    largest scale: compiled once for any set of scales and meshes), each mesh point's pair
    moments on the a-grid, lattice and z-rule its tau, sigma_c and sigma_d need
    (:func:`grid_levels`; the sums to the quadrature's accuracy, ~1e-14 relative), first
    on the mesh :func:`first_mesh` of its :func:`bucket_caps` cap, the values then
    :func:`resample`\\ d onto the full mesh; scales whose Chebyshev tail on that mesh
    exceeds INTERP_TAIL are recomputed on the full mesh.

    More distinct scales than the last of ``nodes``: S and T are analytic (and even) in the
    logit scale, so a range of scales reads the interpolant of the tables at
    :func:`scale_nodes` of the range (``nodes``, default SCALE_NODES, in turn) once their
    :func:`scale_tail` is below SCALE_TAIL (then the interpolant is the tables to ~1e-14); a
    range where no node count reaches it is halved, and a range holding no more scales than
    nodes, or whose node tables are not finite, is integrated scale by scale. The cost then stops growing with the number of scales (pre-LN's logit
    scales 0.01..4 at n = 16: 57 of them for 128 or 256, within 3e-15 of each integrated)."""
    sa = np.asarray(sigma_a, np.float64).reshape(-1)
    if not sa.size:
        empty = np.empty((0, 2, MESH_FULL + 1))
        return empty, empty.copy(), False, False
    top = float(sa.max())
    n_a, n_z = exact.sizes(sigma_max=top, n_max=float(n))
    nodes = tuple(SCALE_NODES if nodes is None else nodes)
    s_out, t_out = _range_tables(sa, float(n), n_a, n_z, float(sa.min()), top, nodes, top)
    return s_out, t_out, interpolant_exact(s_out), interpolant_exact(t_out)


def _range_tables(sa, n, n_a, n_z, lo, hi, nodes, top):
    """(S, T) of the scales ``sa`` in [lo, hi] (:func:`scale_tables`; ``top`` the largest
    scale of all)."""
    if len(np.unique(sa)) <= nodes[-1] or hi <= lo:
        return _direct_tables(sa, n, n_a, n_z, top)
    fit = _fit_range(n, n_a, n_z, lo, hi, nodes, top)
    if fit is NOT_FINITE:
        return _direct_tables(sa, n, n_a, n_z, top)  # halving would not mend it
    if fit is not None:
        x, s, t = fit
        c = barycentric_matrix(x, sa)
        return np.tensordot(c, s, axes=1), np.tensordot(c, t, axes=1)
    mid = 0.5 * (lo + hi)
    low = sa <= mid
    s_out = np.empty((sa.size, 2, MESH_FULL + 1))
    t_out = np.empty_like(s_out)
    for sel, a, b in ((low, lo, mid), (~low, mid, hi)):
        if sel.any():
            s_out[sel], t_out[sel] = _range_tables(sa[sel], n, n_a, n_z, a, b, nodes, top)
    return s_out, t_out


NOT_FINITE = object()  # _fit_range: the node tables are not finite


def _fit_range(n, n_a, n_z, lo, hi, nodes, top, adaptive: bool = True):
    """``(scale nodes, S, T)`` at the first count of ``nodes`` whose interpolant in the logit
    scale on [lo, hi] reaches :data:`SCALE_TAIL`; None where none does (halve the range);
    :data:`NOT_FINITE` where the node tables are not finite (halving would not mend it)."""
    for m in nodes:
        x = scale_nodes(lo, hi, m)
        s, t = _direct_tables(x, n, n_a, n_z, top, adaptive)
        if not (np.all(np.isfinite(s)) and np.all(np.isfinite(t))):
            return NOT_FINITE
        if max(scale_tail(s), scale_tail(t)) <= SCALE_TAIL:
            return x, s, t
    return None


def _direct_tables(sa, n, n_a, n_z, top, adaptive: bool = True):
    """(S, T) [k, 2, MESH_FULL + 1] of each scale of ``sa`` integrated by the program of
    sizes (n_a, n_z) (:func:`scale_tables`; ``top`` the largest scale the caps reach;
    ``adaptive`` as :func:`st_mesh_fn`)."""
    caps = bucket_caps(np.append(sa, top))[:-1]
    s_out = np.empty((sa.size, 2, MESH_FULL + 1))
    t_out = np.empty_like(s_out)

    def run(sel, m):
        out = [_st_values(float(x), n, n_a, n_z, m, adaptive) for x in sa[sel]]
        return np.stack([s for s, _ in out]), np.stack([t for _, t in out])

    for cap in np.unique(caps):
        sel = np.flatnonzero(caps == cap)
        m = first_mesh(float(cap))
        s, t = run(sel, m)
        if m != MESH_FULL:
            bad = np.array([not (interpolant_exact(s[i]) and interpolant_exact(t[i])) for i in range(len(sel))])
            s, t = resample(s, n), resample(t, n)
            if bad.any():
                s[bad], t[bad] = run(sel[bad], MESH_FULL)
        s_out[sel], t_out[sel] = s, t
    return s_out, t_out


# ---- one point's tables (the layers' prepare) -------------------------------------------------

POINT_CAP = exact.DEFAULT_SIGMA_MAX  # every logit scale up to this one is integrated on the
# grid of this one (its levels adapt the work to the scale)


def point_cap(sigma_a: float) -> float:
    """The logit scale whose grid sizes serve ``sigma_a``: :data:`POINT_CAP`, or above it the
    first of :func:`bucket_caps`' ladder at or above ``sigma_a``. Every scale of one cap has
    the same static sizes, so a new scale compiles nothing."""
    if sigma_a <= POINT_CAP:
        return POINT_CAP
    cap = CAPS[-1]
    while cap < sigma_a * (1.0 - 1e-12):
        cap *= 2.0**0.5
    return cap


@float64
def point_kernel(sigma_a: float, n: float, values: bool = True) -> ExactKernel:
    """The exact map's kernel of one concrete logit scale ``sigma_a`` and ``n`` tokens: grid
    sizes for :func:`point_cap` (the scale's own where the cap's grid is over the cost bound)
    and, with ``values``, (S, T) on the :data:`MESH_FULL` mesh read from the interpolant in
    the scale on its range of [0, cap] (:func:`point_pieces`: built once per (n, cap, range)
    and kept on disk; integrated on the scale's own grid, which no other scale shares),
    whose interpolants in rho stand for the maps where their Chebyshev tails reach rounding
    (``interp``, ``interp_t``)."""
    sa, n = float(sigma_a), float(n)
    cap = point_cap(sa)
    own = False
    try:
        n_a, n_z = exact.sizes(sigma_max=cap, n_max=n)
    except ValueError:
        cap, own = sa, True
        n_a, n_z = exact.sizes(sigma_max=sa, n_max=n)
    if not values:
        return ExactKernel(None, n_a=n_a, n_z=n_z)
    if own:  # the scale's own grid (a cap for it alone): integrated, no interpolant to share
        s, t = (v[0] for v in _direct_tables(np.asarray([sa]), n, n_a, n_z, cap, adaptive=False))
    else:
        s, t = _point_values(sa, n, n_a, n_z, cap)
    return ExactKernel(
        jnp.asarray(s), n_a=n_a, n_z=n_z, interp=interpolant_exact(s), t=jnp.asarray(t), interp_t=interpolant_exact(t)
    )


POINT_EDGES = (1.0, 2.0, 3.0)  # a point's interpolant in the scale is built on one range of
# [0, cap] split here: a new token count builds only the ranges its scales fall in, and the
# lower ranges (small meshes, fewer nodes) cost least
POINT_NODES = (15, 29, 57)  # node counts tried on each range (nested, as SCALE_NODES)


def point_range(sa: float, cap: float) -> tuple[float, float]:
    """The range of [0, cap] (split at :data:`POINT_EDGES`) whose interpolant serves the scale
    ``sa``: the first that holds it."""
    edges = [0.0, *(e for e in POINT_EDGES if e < cap), cap]
    i = min(int(np.searchsorted(edges, sa, side="left")), len(edges) - 1)
    return edges[max(i - 1, 0)], edges[max(i, 1)]


@float64
def _point_values(sa: float, n: float, n_a: int, n_z: int, cap: float):
    """(S, T) [2, MESH_FULL + 1] of one scale, from the interpolant in the scale on its range
    (:func:`point_range`, :func:`point_pieces`; within ~1e-14 of the integrated tables, as a
    block sweep reads them), or integrated where no piece holds the scale. The same function
    of (sigma_A, n) in every process, whichever scales it asked for before."""
    for lo, hi, x, s_nodes, t_nodes in point_pieces(n, n_a, n_z, cap, *point_range(sa, cap)):
        if lo <= sa <= hi:
            c = barycentric_matrix(x, [sa])
            return np.tensordot(c, s_nodes, axes=1)[0], np.tensordot(c, t_nodes, axes=1)[0]
    s, t = _direct_tables(np.asarray([sa]), n, n_a, n_z, cap, adaptive=False)
    return s[0], t[0]


# the modules whose code computes the pieces: their hash is part of the disk cache's key (the
# one-scale program's compiler options are in the key itself)
TABLE_SOURCES = ("phasefield.theory.attention.exact", "phasefield.theory.attention.exact_table")


def _pieces_ok(got: dict) -> bool:
    """Whether stored pieces have the arrays and shapes :func:`point_pieces` writes."""
    k = len(got["lo"])
    if got["lo"].shape != (k,) or got["hi"].shape != (k,) or len(got) != 2 + 3 * k:
        return False
    for i in range(k):
        m = got[f"x{i}"].shape
        if len(m) != 1 or got[f"s{i}"].shape != got[f"t{i}"].shape or got[f"s{i}"].shape != (m[0], 2, MESH_FULL + 1):
            return False
    return True


# ---- the point tables shipped with the package -----------------------------------------------

SHIPPED = Path(__file__).resolve().with_name("tables")  # exact-point-n{n}.npz, one per common n
SHIPPED_FORMAT = 1  # bump when the pieces' code changes their values (tests/test_shipped_tables.py
# recomputes one range and fails on a difference; scripts/build_tables.py writes them again)


def shipped_key(n: float, n_a: int, n_z: int, cap: float) -> dict:
    """What a shipped file of ``n`` tokens holds: the pieces of every range of
    :func:`point_range` on [0, cap] at grid sizes (n_a, n_z), with this module's nodes, tail
    and mesh. A file whose key differs (other sizes or settings) is not read."""
    return dict(format=SHIPPED_FORMAT, **_pieces_key(n, n_a, n_z, cap), edges=list(POINT_EDGES))


def _pieces_key(n, n_a, n_z, cap) -> dict:
    """What the pieces of ``n`` tokens at grid sizes (n_a, n_z) and cap depend on, besides
    their range (:func:`point_pieces`, :func:`shipped_key`)."""
    return dict(
        n=float(n),
        n_a=int(n_a),
        n_z=int(n_z),
        cap=float(cap),
        scale_nodes=list(POINT_NODES),
        scale_tail=SCALE_TAIL,
        mesh=MESH_FULL,
    )


def shipped_path(n: float) -> Path:
    return SHIPPED / f"exact-point-n{float(n):g}.npz"


def point_ranges(cap: float) -> list[tuple[float, float]]:
    """The ranges [lo, hi] of [0, cap] that :func:`point_range` picks from."""
    edges = [0.0, *(e for e in POINT_EDGES if e < cap), cap]
    return list(zip(edges[:-1], edges[1:]))


@functools.cache
def _shipped(n: float, n_a: int, n_z: int, cap: float) -> dict | None:
    path = shipped_path(n)
    return table_cache.load(path, shipped_key(n, n_a, n_z, cap)) if path.is_file() else None


def shipped_pieces(n: float, n_a: int, n_z: int, cap: float, lo: float, hi: float) -> dict | None:
    """The stored pieces of the range [lo, hi] (:func:`point_pieces`' arrays) from the file
    shipped for ``n`` tokens, or None (no file for n, another key, another range)."""
    got = _shipped(float(n), int(n_a), int(n_z), float(cap))
    ranges = point_ranges(float(cap))
    if got is None or (float(lo), float(hi)) not in ranges:
        return None
    tag = f"r{ranges.index((float(lo), float(hi)))}_"
    out = {k[len(tag) :]: v for k, v in got.items() if k.startswith(tag)}
    return out if out and _pieces_ok(out) else None


@functools.lru_cache(maxsize=64)
def point_pieces(n: float, n_a: int, n_z: int, cap: float, lo: float, hi: float) -> tuple:
    """:func:`_scale_pieces` on [lo, hi] (:data:`POINT_NODES`) of the one-scale program (sizes
    (n_a, n_z), ``n`` tokens, scales up to ``cap``): read from the tables' folder
    (:mod:`phasefield.theory.table_cache`) when a process computed them before, else computed
    (15 to 57 scales integrated: seconds) and written there; for the token counts shipped
    with the package (:func:`shipped_pieces`, ``tables/``) read from its file. Once per
    process and key."""
    key = dict(_pieces_key(n, n_a, n_z, cap), lo=float(lo), hi=float(hi), options=one_scale_options())

    def compute():
        pieces = _scale_pieces(float(n), n_a, n_z, float(lo), float(hi), float(cap), adaptive=False, nodes=POINT_NODES)
        out = dict(lo=[p[0] for p in pieces], hi=[p[1] for p in pieces])
        for i, (_, _, x, s, t) in enumerate(pieces):
            out.update({f"x{i}": x, f"s{i}": s, f"t{i}": t})
        return out

    got = shipped_pieces(n, n_a, n_z, cap, lo, hi)
    if got is None:
        got = table_cache.cached("exact-point", key, TABLE_SOURCES, compute, _pieces_ok)
    pieces = []
    for i, (lo, hi) in enumerate(zip(got["lo"], got["hi"])):
        x, s, t = got[f"x{i}"], got[f"s{i}"], got[f"t{i}"]
        for v in (x, s, t):
            v.flags.writeable = False
        pieces.append((float(lo), float(hi), x, s, t))
    return tuple(pieces)


@functools.lru_cache(maxsize=16)
@float64
def _scale_pieces(n, n_a, n_z, lo, hi, top, depth: int = 0, adaptive: bool = True, nodes=SCALE_NODES) -> tuple:
    """Pieces ``(lo, hi, nodes, S, T)`` covering [lo, hi] whose Chebyshev interpolants in the
    logit scale reach :data:`SCALE_TAIL` (:func:`scale_tables`' rule: ``nodes`` in turn,
    the range halved where none does); empty where the node tables are not finite or
    halving runs out (those scales are integrated one by one). ``adaptive`` as
    :func:`st_mesh_fn`."""
    fit = _fit_range(n, n_a, n_z, lo, hi, nodes, top, adaptive)
    if fit is NOT_FINITE:
        return ()
    if fit is not None:
        return ((lo, hi, *fit),)
    if depth >= 4:
        return ()
    mid = 0.5 * (lo + hi)
    return _scale_pieces(n, n_a, n_z, lo, mid, top, depth + 1, adaptive, nodes) + _scale_pieces(
        n, n_a, n_z, mid, hi, top, depth + 1, adaptive, nodes
    )
