"""Everything that follows from a block's maps, for any block (a layer, usually a
:class:`.base.Serial`): trajectories, the gradient exponent, fixed points, the angle
exponent, multistability, and the finite-depth rates of blocks without a fixed point.

The functions below are pure in ``(block, ctx)`` (pytrees: vmap/jit/grad apply to every
leaf); ``block`` must be prepared (:meth:`prepare`, done by the public entry points in
:mod:`phasefield.layers`). Definitions (docs/theory.md §6, §7):

* **Norm fixed point at a cosine.** ``q*(rho)`` solves ``q = F(q, rho q).q``, by Newton's
  method from q = 1 (exact in one step when the norm map is affine in q, as for every
  block whose branches read normalized tokens); no finite solution (slope >= 1: the norm
  grows with depth, e.g. identity residuals) gives ``inf``.
* **Collapsed point** ``rho = 1`` (invariant), ``q* = q*(1)``.
* **Angle exponent** ``lambda_a = log m(q*)`` with ``m(q) = d(q' - p') / d(q - p)`` at
  ``(q, q)``: the transverse multiplier of nearby tokens, by forward-mode autodiff.
* **Cosine fixed points**: roots of ``g(rho) = F(q*(rho), rho q*(rho)).rho - rho`` on a mesh
  of rho (sign changes, then bisection and a Newton polish: :func:`refine_brackets`); a
  crossing from + to - attracts.
* **Gradient exponent** ``lambda_g(L) = (1/L) log(a + b)`` after the backward maps of L
  blocks from ``G = I`` at the output, along the forward trajectory from the input;
  ``lambda_g_inf`` is the log top eigenvalue of the 2x2 backward map at the attractor.
* **Finite depth** (no finite fixed point): the angle rate of nearby tokens
  ``(1/L) log[(1 - rho_L) / (1 - rho_0)]`` in the limit ``rho_0 -> 1``, which is
  ``(1/L) [sum_l log m(q_l) - log(q_L / q_0)]`` along the collapsed trajectory from ``q0``
  (``1 - rho = (q - p) / q``: the spread q - p grows by m per layer, the norm by q_{l+1}/q_l),
  and ``lambda_g(L)`` from the input geometry. These are rates at depth L, not exponents:
  they change with L. Where the block has a finite fixed point and ``q0 = q*`` the angle
  rate is lambda_a and ``lambda_g_collapse`` is lambda_g(L).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..theory.attention import exact_table
from .state import Grad, Kernel

NEWTON_STEPS = 2
MESH = 49  # cosine mesh of the root search
BISECTION_STEPS = 10  # per root bracket (a mesh cell: width <= 0.05 -> 5e-5), then Newton
ROOT_NEWTON_STEPS = 3  # quadratic from 5e-5: machine precision
MAX_ROOTS = 4
RHO0 = 0.5  # the input cosine whose attractor is reported as rho_star


@jax.jit
def _forward(block, k, ctx):
    """``block.forward(k, ctx)`` as a nested program: traced once per block structure and
    shapes however often the functions here call it (jit's trace cache), inlined when the
    outer program compiles."""
    return block.forward(k, ctx)


@jax.jit
def _backward(block, k, g, ctx):
    """``block.backward(k, g, ctx)``, traced once (as :func:`_forward`)."""
    return block.backward(k, g, ctx)


def trajectory(block, ctx, k0: Kernel, depth: int):
    """(q, p) arrays of length depth + 1 (index 0: the input)."""

    def step(k, _):
        k1 = _forward(block, k, ctx)
        return k1, (k1.q, k1.p)

    _, (qs, ps) = jax.lax.scan(step, k0, None, length=depth)
    return jnp.concatenate([k0.q[None], qs]), jnp.concatenate([k0.p[None], ps])


def gradient_exponent(block, ctx, k0: Kernel, depth: int):
    """lambda_g(L) from input geometry ``k0`` (log-rescaled backward scan)."""
    return backward_rate(block, ctx, *trajectory(block, ctx, k0, depth), depth)


def backward_rate(block, ctx, qs, ps, depth: int):
    """lambda_g(L) along the forward trajectory ``(qs, ps)`` [L + 1] of :func:`trajectory`
    (its first L geometries are the backward maps' inputs): :func:`gradient_exponent` for a
    caller that has the trajectory already (one forward scan in the compiled program, not two)."""

    def step(carry, x):
        a, b, log_scale = carry
        g = _backward(block, Kernel(*x), Grad(a, b), ctx)
        s = g.a + g.b
        return (g.a / s, g.b / s, log_scale + jnp.log(s)), None

    one = jnp.ones_like(qs[0])
    (_, _, log_total), _ = jax.lax.scan(step, (one, 0.0 * one, 0.0 * one), (qs[:-1], ps[:-1]), reverse=True)
    return log_total / depth


def norm_fixed_point(block, ctx, rho):
    """q*(rho) (module docstring); ``inf`` where the norm map has slope >= 1."""
    f = lambda q: _forward(block, Kernel(q, rho * q), ctx).q - q

    def newton(q, _):
        done = jnp.isinf(q)
        val, slope = jax.jvp(f, (jnp.where(done, 1.0, q),), (jnp.ones_like(q),))
        grows = done | (slope >= 0.0)  # d q'/dq >= 1: no finite fixed point
        q_new = q - val / jnp.where(grows, -1.0, slope)
        return jnp.where(grows, jnp.inf, q_new), None

    q, _ = jax.lax.scan(newton, jnp.ones_like(jnp.asarray(rho, jnp.result_type(float))), None, length=NEWTON_STEPS)
    return q


def transverse_multiplier(block, ctx, q):
    """m(q) = d(q' - p') / d(q - p) at the collapsed geometry (q, q)."""

    def gap(u):
        k1 = _forward(block, Kernel(q, q - u), ctx)
        return k1.q - k1.p

    return jax.jvp(gap, (jnp.zeros_like(q),), (jnp.ones_like(q),))[1]


def collapsed_point(block, ctx, q_star=None):
    """``(q_star, finite, q, log m(q))`` at the collapsed geometry: the norm's fixed point
    q*(1), whether it is finite, the q used (q*, or 1 where q* is infinite) and the log of
    the transverse multiplier there (lambda_a where ``finite``). ``q_star``: q*(1), where the
    caller has it (computed otherwise)."""
    if q_star is None:
        q_star = norm_fixed_point(block, ctx, 1.0)
    fin = jnp.isfinite(q_star)
    qs = jnp.where(fin, q_star, 1.0)
    return q_star, fin, qs, jnp.log(transverse_multiplier(block, ctx, qs))


def angle_exponent(block, ctx):
    """lambda_a at the collapsed fixed point (NaN where there is no finite one)."""
    _, fin, _, log_m = collapsed_point(block, ctx)
    return jnp.where(fin, log_m, jnp.nan)


def collapsed_angle_rate(block, ctx, q_collapsed, depth: int):
    """``(angle_rate, multipliers)``: the finite-depth angle rate along the collapsed
    trajectory ``q_collapsed`` [L + 1] (nearby tokens), (sum_l log m(q_l) - log(q_L / q_0)) / L,
    and the per-layer multipliers m(q_l)."""
    m = jax.lax.map(lambda q: transverse_multiplier(block, ctx, q), q_collapsed[:-1])
    return (jnp.sum(jnp.log(m)) - jnp.log(q_collapsed[-1] / q_collapsed[0])) / depth, m


def _residual(block, ctx, rho):
    q = norm_fixed_point(block, ctx, rho)
    return _forward(block, Kernel(q, rho * q), ctx).rho - rho


def stable_points(block, ctx, la=None):
    """dict(rho [MAX_ROOTS], stable [MAX_ROOTS], collapsed_stable, n_stable, rho_star), as
    :func:`phasefield.layers.paper.stable_points` (roots NaN-padded, smallest first).
    ``la``: the block's :func:`angle_exponent`, where the caller has it (computed otherwise)."""
    dt = jnp.result_type(float)
    mesh = exact_table.mesh(ctx.n_tokens, MESH)
    g_fn = lambda rs: jax.lax.map(lambda r: _residual(block, ctx, r), rs)
    g = g_fn(jnp.concatenate([mesh, jnp.asarray([RHO0], dt)]))  # the mesh and RHO0: one map
    g, g0 = g[:-1], g[-1]
    if la is None:
        la = angle_exponent(block, ctx)
    tiny = jnp.asarray(1e-300, dt)
    g = g.at[0].set(jnp.where(g[0] > 0, g[0], tiny))
    g = g.at[-1].set(jnp.where(la > 0, -tiny, tiny))  # sign just below rho = 1
    down = (g[:-1] > 0) & (g[1:] <= 0)
    change = down | ((g[:-1] <= 0) & (g[1:] > 0))
    (idx,) = jnp.nonzero(change, size=MAX_ROOTS, fill_value=0)
    valid = jnp.arange(MAX_ROOTS) < jnp.sum(change)
    roots = refine_brackets(g_fn, mesh[idx], mesh[idx + 1], g[idx])
    roots = jnp.where(valid, roots, jnp.nan)
    return attractors_of(roots, valid & down[idx], la < 0, g0, RHO0)


def bisection(fv, lo, hi, pos_lo, steps):
    """``steps`` bisections of the brackets [lo, hi] of the vectorized ``fv`` (sign at lo:
    ``pos_lo``)."""

    def bisect(_, bracket):
        a, b = bracket
        mid = 0.5 * (a + b)
        same = (fv(mid) > 0) == pos_lo
        return jnp.where(same, mid, a), jnp.where(same, b, mid)

    return jax.lax.fori_loop(0, steps, bisect, (lo, hi))


def refine_brackets(fv, lo, hi, f_lo):
    """Roots of the vectorized ``fv`` in the brackets [lo, hi] (arrays; ``f_lo`` = fv(lo),
    of the opposite sign to fv(hi)): :data:`BISECTION_STEPS` bisections, then
    :data:`ROOT_NEWTON_STEPS` Newton steps (slope by forward-mode autodiff), each kept inside
    its bisected bracket. Every block's cosine roots (the paper block's too,
    :mod:`.paper.fixed_points`)."""
    lo, hi = bisection(fv, lo, hi, f_lo > 0, BISECTION_STEPS)

    def newton(_, r):
        val, slope = jax.jvp(fv, (r,), (jnp.ones_like(r),))
        step = jnp.where(slope != 0, val / jnp.where(slope != 0, slope, 1.0), 0.0)
        r_new = r - step
        return jnp.where((r_new >= lo) & (r_new <= hi), r_new, r)

    return jax.lax.fori_loop(0, ROOT_NEWTON_STEPS, newton, 0.5 * (lo + hi))


def attractors_of(roots, stable, collapsed_stable, g0, rho0) -> dict:
    """The attractors' summary from the roots of the reduced cosine flow g(rho) = rho' - rho:
    ``stable`` marks the stable roots, ``collapsed_stable`` whether rho = 1 attracts, and the
    attractor reached from ``rho0`` follows the sign of ``g0 = g(rho0)`` (the nearest stable
    root above it, or rho = 1, when g0 > 0; the nearest below when g0 < 0). One definition for
    every block (the paper block's :func:`phasefield.layers.paper.stable_points` too)."""
    above = jnp.where(stable & (roots >= rho0), roots, jnp.inf).min()
    below = jnp.where(stable & (roots <= rho0), roots, -jnp.inf).max()
    up = jnp.where(jnp.isfinite(above), above, 1.0)
    dn = jnp.where(jnp.isfinite(below), below, jnp.nan)
    rho_star = jnp.where(g0 > 0, up, jnp.where(g0 < 0, dn, rho0))
    return dict(
        rho=roots,
        stable=stable,
        collapsed_stable=collapsed_stable,
        n_stable=jnp.sum(stable) + collapsed_stable.astype(jnp.int32),
        rho_star=rho_star,
    )


def gradient_matrix(block, ctx, k: Kernel):
    """The 2x2 backward map on (a, b) at input geometry ``k`` (columns: a, b)."""
    one, zero = jnp.ones_like(k.q), jnp.zeros_like(k.q)
    g = jax.vmap(lambda u: _backward(block, k, u, ctx))(Grad(jnp.stack([one, zero]), jnp.stack([zero, one])))
    return jnp.array([[g.a[0], g.a[1]], [g.b[0], g.b[1]]])


def top_eigenvalue(m):
    """The larger eigenvalue of a 2x2 matrix ``m`` (the backward map on (a, b); where the
    discriminant is negative, the real part of the pair). tr^2 - 4 det is written as
    (a - d)^2 + 4 b c: no cancellation when the two eigenvalues are close (small alpha: both
    1 + O(alpha^2), where the other form loses sqrt(eps)). Every block's lambda_g_inf (the
    paper block's too, :mod:`.paper.lyapunov`)."""
    tr = m[0, 0] + m[1, 1]
    disc = jnp.square(m[0, 0] - m[1, 1]) + 4.0 * m[0, 1] * m[1, 0]
    return 0.5 * (tr + jnp.sqrt(jnp.maximum(disc, 0.0)))


def fixed_point_exponents(block, ctx, depth: int, q_star=None) -> dict:
    """Everything at one point, the keys of :func:`phasefield.layers.paper.exponents` (same
    states): lambda_a (collapsed point), lambda_g_collapse (depth L from the collapsed fixed point),
    lambda_g_inf (at rho_star), q_star, rho_star, n_stable, rho_star_min, rho_star_max.
    Blocks without a finite fixed point give NaN for the fixed-point quantities: use
    :func:`finite_depth`. ``q_star``: the norm's fixed point q*(1), where the caller has it."""
    q_star, fin, qs, log_m = collapsed_point(block, ctx, q_star)
    la = jnp.where(fin, log_m, jnp.nan)
    fp = stable_points(block, ctx, la)
    rho = fp["rho_star"]
    coll = rho >= 1.0
    q_att = jnp.where(coll, qs, norm_fixed_point(block, ctx, jnp.where(coll, 0.5, rho)))
    lg_inf = jnp.log(top_eigenvalue(gradient_matrix(block, ctx, Kernel(q_att, rho * q_att))))
    stab = jnp.concatenate(
        [jnp.where(fp["stable"], fp["rho"], jnp.nan), jnp.where(fp["collapsed_stable"], 1.0, jnp.nan)[None]]
    )
    lo = jnp.where(jnp.isnan(stab), jnp.inf, stab).min()
    hi = jnp.where(jnp.isnan(stab), -jnp.inf, stab).max()
    nan = jnp.nan * q_star
    pick = lambda x: jnp.where(fin, x, nan)
    return dict(
        lambda_a=la,
        lambda_g_collapse=pick(gradient_exponent(block, ctx, Kernel(qs, qs), depth)),
        lambda_g_inf=pick(lg_inf),
        q_star=q_star,
        rho_star=pick(rho),
        n_stable=jnp.where(fin, fp["n_stable"], 0),
        rho_star_min=pick(jnp.where(jnp.isfinite(lo), lo, jnp.nan)),
        rho_star_max=pick(jnp.where(jnp.isfinite(hi), hi, jnp.nan)),
    )


def finite_depth(block, ctx, k0: Kernel, depth: int) -> dict:
    """Finite-depth rates from input geometry ``k0`` (module docstring): ``angle_rate``
    (nearby tokens, along the collapsed trajectory from ``q0``), ``lambda_g_input`` (from ``k0``),
    ``lambda_g_collapse`` (from ``(q0, q0)``), and the per-layer ``q``, ``rho`` of the
    trajectory from ``k0`` and ``q_collapsed`` of the collapsed one (length L + 1)."""
    # both trajectories, and both backward scans, as one vmapped scan each: one copy of the
    # block's maps in the compiled program instead of two
    both = Kernel(jnp.stack([k0.q, k0.q]), jnp.stack([k0.p, k0.q]))
    q2, p2 = jax.vmap(lambda k: trajectory(block, ctx, k, depth))(both)
    lg = jax.vmap(lambda q, p: backward_rate(block, ctx, q, p, depth))(q2, p2)
    (qs, qc), ps = q2, p2[0]
    rate, m = collapsed_angle_rate(block, ctx, qc, depth)
    return dict(
        angle_rate=rate,
        lambda_g_input=lg[0],
        lambda_g_collapse=lg[1],
        q=qs,
        rho=ps / qs,
        q_collapsed=qc,
        angle_multipliers=m,
        q_L=qs[-1],
        rho_L=ps[-1] / qs[-1],
    )


FIXED_POINT_KEYS = ("lambda_a", "lambda_g_inf", "q_star", "rho_star", "n_stable", "rho_star_min", "rho_star_max")


def rates(block, ctx, k0: Kernel, depth: int) -> dict:
    """:func:`finite_depth` from ``k0`` and, where the block has a finite collapsed fixed
    point, the fixed-point quantities of :func:`fixed_point_exponents` (:data:`FIXED_POINT_KEYS`); without
    one they are NaN (``q_star`` inf, ``n_stable`` 0) and the attractor search is skipped
    (``lax.cond``: one program for both cases)."""
    out = dict(finite_depth(block, ctx, k0, depth))
    q_star = norm_fixed_point(block, ctx, 1.0)  # computed once: the branch reads it
    fin = jnp.isfinite(q_star)

    # traced once: the shapes and the branch read one jaxpr (jit's trace cache), not two traces
    fixed = jax.jit(lambda b, c, q: _fixed_point_quantities(b, c, depth, q))
    shapes = jax.eval_shape(fixed, block, ctx, q_star)
    fill = dict(q_star=jnp.inf, n_stable=0)
    none = lambda *_: {k: jnp.full(v.shape, fill.get(k, jnp.nan), v.dtype) for k, v in shapes.items()}
    out.update(jax.lax.cond(fin, fixed, none, block, ctx, q_star), has_fixed_point=fin)
    return out


def _fixed_point_quantities(block, ctx, depth: int, q_star) -> dict:
    ex = fixed_point_exponents(block, ctx, depth, q_star)
    return {k: ex[k] for k in FIXED_POINT_KEYS}
