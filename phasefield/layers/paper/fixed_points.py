"""Fixed points of the block map and the angle exponent lambda_a (docs/theory.md §6).

* Collapsed point (rho = 1, invariant): q* solves the linear equation
  q* = beta_M^2 (beta_A^2 q* + alpha_A^2 sigma_V^2) + alpha_M^2 q_M, and
  q_z* = beta_A^2 q* + alpha_A^2 sigma_V^2.
* Stable points: rho = 1 when lambda_a < 0, and every root of the reduced residual
  g(rho) (below) where g crosses from + to - (docs/theory.md §6 "Several attractors"). The
  roots are found on a fixed mesh of rho (sign changes of g, refined by bisection and a
  Newton polish), so everything stays jit- and vmap-able with static shapes.
* lambda_a, the log transverse eigenvalue at the collapsed point, in closed form (or by
  autodiff of the block map).

Edges of the parameter space
----------------------------
Everything is written with the *branch direction* ``w_A = alpha_A^2 / s``,
``w_M = alpha_M^2 / s`` (``s = alpha_A^2 + alpha_M^2``) and the restoring rate
``r = (1 - beta_A^2 beta_M^2) / s`` (unit-norm: ``1 - alpha_A^2 alpha_M^2 / s``; identity
residual: 0). With them::

    q*      = (beta_M^2 w_A sigma_V^2 + w_M q_M) / r
    g(rho)  = [beta_M^2 w_A (p_A - rho q_A) + w_M (p_M(rho_z) - rho q_M)]
              / [beta_M^2 w_A q_A + w_M q_M]          (q at its fixed point q*(rho))

which are finite at the two places where the old form 0/0 was NaN:

* ``alpha_A = alpha_M = 0`` (the block is the identity, every geometry is fixed): the
  values are the limits alpha -> 0+ along the tied direction alpha_A = alpha_M (the
  ``--alpha`` axis), w_A = w_M = 1/2, r = 1: ``q* = (sigma_V^2 + q_M) / 2``,
  ``lambda_a = lambda_g = lambda_g_inf = 0`` exactly, and the stable points are those of
  the alpha -> 0+ limit of g (rho_z -> rho). Along another direction of approach the
  limit of q* and of rho* differs; the tied one is the convention.
* ``residual='identity'`` (beta = 1, r = 0): the norm grows linearly with depth, so
  ``q* = q_z* = +inf`` (no finite fixed point); the per-block transverse multiplier
  ``1 + alpha_M^2 D(1)/q_z`` tends to 1, so ``lambda_a = 0`` (perturbations change as a
  power of depth, not exponentially) and ``lambda_g_inf = 0``. The cosine still
  converges (steps shrink like 1/depth) to the stable roots of g with rho_z = rho.
  Whether rho = 1 attracts is the sign of :func:`angle_growth`.
* ``alpha_A = 1`` (beta_A = 0): the attention branch replaces the residual and
  ``1 - rho`` shrinks quadratically per block at the collapsed point, so
  ``lambda_a = -inf`` is the true value (JSON output writes it as the string "-inf").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ...theory import attention, mlp
from ...theory._api import public
from ...theory.attention import exact, exact_table
from .. import depth
from ..depth import attractors_of, bisection, refine_brackets
from . import block

# per bracket (a mesh cell: width <= 0.03 -> 3e-5), then Newton, quadratic from 3e-5:
# machine precision (one refiner for every block: depth.refine_brackets)
BISECTION_STEPS, NEWTON_STEPS = depth.BISECTION_STEPS, depth.ROOT_NEWTON_STEPS
MESH = 49  # rho mesh for the root search (paper attention map)
MESH_EXACT = exact_table.MESH  # coarser mesh for the (costly) exact-softmax map
MAX_ROOTS = 4  # sign changes refined per point (the smallest rho first);
# a bistable point has 3 (stable, unstable, stable)
RHO0 = exact_table.RHO0  # default input cosine: the attractor reported as rho_star
TABLE_BISECTION_STEPS = 48  # exact map: bisection on the mesh interpolant (cheap) ...
POLISH_STEPS = 3  # ... then Newton steps on the exact map (value exact, slope of
# the interpolant: from its ~1e-7 root error, 1e-12 then 1e-17)


def weights(hp):
    """(beta_A^2, beta_M^2, alpha_A^2, alpha_M^2, w_A, w_M, r): see the module docstring."""
    ba2, bm2 = jnp.square(hp.beta_a), jnp.square(hp.beta_m)
    aa2, am2 = jnp.square(hp.alpha_a), jnp.square(hp.alpha_m)
    s = aa2 + am2
    zero = s <= 0
    s_safe = jnp.where(zero, 1.0, s)
    wa = jnp.where(zero, 0.5, aa2 / s_safe)
    wm = jnp.where(zero, 0.5, am2 / s_safe)
    if hp.residual == "identity":
        r = jnp.zeros_like(s)
    else:  # (1 - (1 - a)(1 - m)) / s without the cancellation at small alpha
        r = jnp.where(zero, 1.0, 1.0 - aa2 * am2 / s_safe)
    return ba2, bm2, aa2, am2, wa, wm, r


def inv(x):
    """1/x with 1/inf = 0 and a finite gradient at x = inf."""
    fin = jnp.isfinite(x)
    return jnp.where(fin, 1.0 / jnp.where(fin, x, 1.0), 0.0)


@public()
def collapsed_fixed_point(hp, kern=None):
    """(q*, q_z*) of the collapsed fixed point rho = 1 (+inf for the identity residual)."""
    ba2, bm2, aa2, am2, wa, wm, r = weights(hp)
    sv2 = jnp.square(hp.sigma_v)
    num = bm2 * wa * sv2 + wm * kern.q_m
    pos = r > 0
    q_star = jnp.where(pos, num / jnp.where(pos, r, 1.0), jnp.inf)
    return q_star, ba2 * q_star + aa2 * sv2


@public()
def angle_growth(hp, kern=None):
    """A number with the sign of lambda_a that stays informative where lambda_a is 0 by
    degeneracy; > 0: rho = 1 repels (chaotic), < 0: it attracts.

        angle_growth = beta_A^2 w_M (D(1) - q_M) - w_A sigma_V^2

    Unit-norm residual: ``q_z* (e^{lambda_a} - 1) / s`` (so at alpha = 0, where lambda_a = 0,
    its sign is that of d lambda_a / d alpha^2 along the direction (w_A, w_M)). Identity
    residual: ``c p / s`` with ``1 - rho ~ depth^p`` (``c`` the norm growth per block,
    :mod:`.lyapunov`), the power law that replaces the exponential."""
    ba2, bm2, aa2, am2, wa, wm, r = weights(hp)
    sv2 = jnp.square(hp.sigma_v)
    return ba2 * wm * (kern.d_one - kern.q_m) - wa * sv2


def _norm_at(hp, kern, rho, qp=None):
    """1/q*(rho) (norm fixed point at fixed cosine rho) and the attention output (q_A, p_A)
    (given as ``qp``, or computed)."""
    ba2, bm2, aa2, am2, wa, wm, r = weights(hp)
    q_a, p_a = attention.forward(hp.sigma_a, hp.n_tokens, hp.sigma_v, rho, hp.attention, kern.att) if qp is None else qp
    inv_q = r / (bm2 * wa * q_a + wm * kern.q_m)
    return inv_q, q_a, p_a


def _residual(hp, kern, rho, qp=None):
    """g(rho): the reduced cosine residual, >0 where the cosine grows (module docstring)."""
    ba2, bm2, aa2, am2, wa, wm, r = weights(hp)
    inv_q, q_a, p_a = _norm_at(hp, kern, rho, qp)
    rho_z = (ba2 * rho + aa2 * p_a * inv_q) / (ba2 + aa2 * q_a * inv_q)
    p_m = mlp.p_m(kern, rho_z)
    num = bm2 * wa * (p_a - rho * q_a) + wm * (p_m - rho * kern.q_m)
    return num / (bm2 * wa * q_a + wm * kern.q_m)


@public("method")
def angle_exponent(hp, kern=None, method: str = "closed"):
    """lambda_a: log of the transverse eigenvalue of the block map at the collapsed point.

    ``method='closed'``: e^{lambda_a} = beta_A^2 (beta_M^2 + alpha_M^2 D(1) / q_z*).
    ``method='autodiff'``: the (u, u) entry of ``jax.jacfwd`` of the block map written in
    coordinates (q, u = q - p), at (q*, 0) — the triangular Jacobian's transverse eigenvalue
    (the identity residual has no finite q*: both methods give its limit 0).
    """
    q_star, qz_star = collapsed_fixed_point(hp, kern)
    if method == "closed":
        # e^{lambda_a} - 1 = [beta_A^2 alpha_M^2 (D(1) - q_M) - alpha_A^2 sigma_V^2] / q_z*
        # (the fixed-point equation eliminates beta_A^2 beta_M^2 - 1): log1p keeps full
        # relative precision at small alpha, and alpha_A = 1 gives log1p(-1) = -inf exactly
        ba2, aa2, am2 = jnp.square(hp.beta_a), jnp.square(hp.alpha_a), jnp.square(hp.alpha_m)
        num = ba2 * am2 * (kern.d_one - kern.q_m) - aa2 * jnp.square(hp.sigma_v)
        return jnp.log1p(num * inv(qz_star))
    if method == "autodiff":

        def f(x):
            q, u = x[0], x[1]
            q1, p1 = block.block_map(hp, q, q - u, kern)
            return jnp.stack([q1, q1 - p1])

        if hp.residual == "identity":  # no finite q*: the multiplier -> 1 as q -> inf
            return jnp.zeros_like(q_star)
        jac = jax.jacfwd(f)(jnp.stack([q_star, jnp.zeros_like(q_star)]))
        return jnp.log(jac[1, 1])
    raise ValueError(f"unknown method {method!r} (closed or autodiff)")


def _mesh(hp):
    """The rho mesh on [-1/(n-1), 1], denser at both ends (cosine spacing), static size."""
    return exact_table.mesh(hp.n_tokens, MESH_EXACT if hp.attention == "exact" else MESH)


def _refine(f, lo, hi, f_lo, count=None):
    """Roots of f in the brackets [lo, hi] (arrays; f(lo), f(hi) of opposite signs):
    bisection, then a Newton polish kept inside each bracket.

    ``count`` (traced): only the first ``count`` brackets are refined, one after the other
    (the others keep their midpoints): a point pays for its own roots only, and under
    ``vmap`` a batch for the most roots any of its points has (the sweep tiles its points so
    that this maximum is local; a traced trip count has no reverse-mode derivative).
    ``count=None``: every bracket at once (the default of the public functions: ``grad``
    works). Each bracket takes the same operations either way.
    """
    if count is None:
        return refine_brackets(jax.vmap(f), lo, hi, f_lo)

    def one(i, roots):
        return roots.at[i].set(refine_brackets(f, lo[i], hi[i], f_lo[i]))

    return jax.lax.fori_loop(0, count, one, 0.5 * (lo + hi))


def _refine_table(f, f_table, lo, hi, f_lo, count):
    """:func:`_refine` for a costly ``f`` with a cheap close ``f_table`` (same signs at lo,
    hi): bisection on ``f_table``, then POLISH_STEPS Newton steps with the value of ``f``
    and the slope of ``f_table``, kept inside the mesh cell [lo, hi] (where ``f`` changes
    sign; not the bisected bracket, which holds the root of ``f_table`` only, up to 7e-12 from
    that of ``f`` at sigma_A = 3, n = 8). Only the first ``count`` brackets are polished (a
    traced trip count: a single point pays for its roots only)."""
    cell_lo, cell_hi = lo, hi
    lo, hi = bisection(jax.vmap(f_table), lo, hi, f_lo > 0, TABLE_BISECTION_STEPS)

    def polish(i, roots):
        def newton(_, r):
            slope = jax.jvp(f_table, (r,), (jnp.ones_like(r),))[1]
            step = jnp.where(slope != 0, f(r) / jnp.where(slope != 0, slope, 1.0), 0.0)
            r_new = r - step
            return jnp.where((r_new >= cell_lo[i]) & (r_new <= cell_hi[i]), r_new, r)

        return roots.at[i].set(jax.lax.fori_loop(0, POLISH_STEPS, newton, roots[i]))

    return jax.lax.fori_loop(0, count, polish, 0.5 * (lo + hi))


def _mesh_search(hp, kern, table: bool, per_root: bool = False):
    """(mesh, g on the mesh, g(RHO0), roots refiner): the exact map with ``table`` reads
    its mesh values from ``kern.att.s`` (computed here when absent) and refines on their
    interpolant (:func:`_refine_table`); otherwise the map is evaluated on the mesh and the
    roots refined on it (:func:`_refine`; ``per_root``: only the brackets the point has)."""
    f = lambda x: _residual(hp, kern, x)
    mesh = _mesh(hp)
    if not table:
        both = jax.vmap(f)(jnp.concatenate([mesh, jnp.asarray([RHO0], mesh.dtype)]))  # one batch
        return (
            mesh,
            both[:-1],
            both[-1],
            lambda lo, hi, f_lo, count: _refine(f, lo, hi, f_lo, count if per_root else None),
        )
    att = kern.att if kern.att is not None else exact_table.kernel(hp.sigma_a, hp.n_tokens)
    s = att.s if att.s is not None else exact_table.values(hp.sigma_a, hp.n_tokens, att.n_a, att.n_z)
    # the mesh the values are on (MESH_EXACT, or a point kernel's MESH_FULL), and RHO0
    pts = exact_table.mesh_points(hp.n_tokens, s.shape[-1] - 1)
    mesh = pts[:-1]
    both = jax.vmap(lambda x, v: _residual(hp, kern, x, exact.forward_from_s(hp.sigma_v, x, v[0], v[1])))(pts, s.T)

    def f_table(x):
        return _residual(hp, kern, x, exact.forward_from_s(hp.sigma_v, x, *exact_table.interpolate(hp.n_tokens, s, x)))

    return mesh, both[:-1], both[-1], lambda lo, hi, f_lo, count: _refine_table(f, f_table, lo, hi, f_lo, count)


NO_ROOT_MARGIN = 1e-9  # lower bound of g needed by :func:`no_roots` (the tables' error: ~1e-12)


def no_roots(hp, kern):
    """True where the stable-point search provably finds no root: rho = 1 attracts and g > 0
    at every interior mesh point and at RHO0 — so the search's answer is the collapsed point
    alone (rho_star = 1, n_stable = 1) — decided from q_M and D(1) alone (no tables).

    p_M(x) = sum_k b_k x^k with every b_k >= 0 (Mehler: one hidden layer; compositions keep
    the signs), so on [0, 1] p_M lies above its tangent at 1, q_M - D(1) (1 - x), and above
    b_0 + b_1 x = p_M(0) + D(0) x; on [-1, 0] p_M(x) >= x q_M (the chord bounds p_M(|x|)). With that lower bound for p_M the
    residual's numerator is a lower bound of g's; it must exceed NO_ROOT_MARGIN (far above
    the tables' error, so the tabulated g is positive too). Paper attention only (False for
    the exact map). Used by the sweep to skip the search for whole tiles."""
    if hp.attention != "paper":
        return jnp.zeros((), bool)
    ba2, bm2, aa2, am2, wa, wm, r = weights(hp)
    mesh = _mesh(hp)
    pts = jnp.concatenate([mesh[1:-1], jnp.asarray([RHO0], mesh.dtype)])
    zero = jnp.zeros((), mesh.dtype)
    b0, b1 = mlp.p_m(kern, zero), mlp.d_m(kern, zero)  # p_M(0), p_M'(0) (tables: ~1e-12)

    def lower(rho):
        inv_q, q_a, p_a = _norm_at(hp, kern, rho)
        rho_z = (ba2 * rho + aa2 * p_a * inv_q) / (ba2 + aa2 * q_a * inv_q)
        lb = jnp.where(
            rho_z >= 0, jnp.maximum(kern.q_m - kern.d_one * (1.0 - rho_z), b0 + b1 * rho_z), rho_z * kern.q_m
        )
        num = bm2 * wa * (p_a - rho * q_a) + wm * (lb - rho * kern.q_m)
        return num / (bm2 * wa * q_a + wm * kern.q_m)

    return (angle_growth(hp, kern) < 0) & jnp.all(jax.vmap(lower)(pts) > NO_ROOT_MARGIN)


def collapsed_only(hp, kern):
    """:func:`stable_points`' answer where :func:`no_roots` holds (no search)."""
    dt = jnp.result_type(float)
    stable, collapsed = jnp.zeros((MAX_ROOTS,), bool), jnp.ones((), bool)
    return dict(
        rho=jnp.full((MAX_ROOTS,), jnp.nan, dt),
        stable=stable,
        collapsed_stable=collapsed,
        n_stable=jnp.sum(stable) + collapsed.astype(jnp.int32),
        rho_star=jnp.ones((), dt),
    )


@public()
def stable_points(hp, kern=None):
    """Every fixed point of the cosine, on a fixed-size layout (jit/vmap-able).

    Returns a dict:
      ``rho``     [MAX_ROOTS] roots rho < 1 of g (NaN where unused), smallest first;
      ``stable``  [MAX_ROOTS] bool, g crosses + -> - (attracting in the reduced dynamics);
      ``collapsed_stable``  rho = 1 attracts (:func:`angle_growth` < 0, i.e. lambda_a < 0);
      ``n_stable`` number of stable fixed points (rho = 1 included);
      ``rho_star`` the attractor reached from rho_0 = 1/2 (:data:`RHO0`): the nearest stable
                   point in the direction the cosine moves from there (sign of g(1/2)).
    Resolution: two roots closer than about a mesh cell (cosine-spaced MESH points: cells
    ~1e-3 wide at the ends of the range, ~0.03 mid-range) are found only when g changes
    sign between mesh points, so a pair born at a fold can be missed just inside the
    bistable region; at most MAX_ROOTS sign changes are refined (smallest rho first).
    """
    return stable_points_of(hp, kern, hp.attention == "exact")


def stable_points_of(hp, kern, table: bool, per_root: bool = False):
    """:func:`stable_points`; ``table=False`` evaluates the exact map on the mesh and bisects
    on it (the direct search: the reference of tests/test_exact.py); ``per_root``
    (direct search only) refines only the brackets the point has, in a loop with a traced
    trip count (the sweep's tiles; no reverse-mode derivative), instead of all
    MAX_ROOTS at once (same numbers)."""
    dt = jnp.result_type(float)
    mesh, g, g0, refine = _mesh_search(hp, kern, table, per_root)
    rho0 = jnp.asarray(RHO0, dt)
    growth = angle_growth(hp, kern)
    tiny = jnp.asarray(1e-300, dt)
    # ends: g >= 0 at rho = -1/(n-1) (the map cannot leave the Gram's domain); just below
    # rho = 1 the sign of g is -sign(growth) (g(1) = 0: rho = 1 is always a fixed point)
    g = g.at[0].set(jnp.where(g[0] > 0, g[0], tiny))
    g = g.at[-1].set(jnp.where(growth > 0, -tiny, tiny))
    down = (g[:-1] > 0) & (g[1:] <= 0)
    up = (g[:-1] <= 0) & (g[1:] > 0)
    change = down | up
    (idx,) = jnp.nonzero(change, size=MAX_ROOTS, fill_value=0)
    valid = jnp.arange(MAX_ROOTS) < jnp.sum(change)
    roots = refine(mesh[idx], mesh[idx + 1], g[idx], jnp.minimum(jnp.sum(change), MAX_ROOTS))
    roots = jnp.where(valid, roots, jnp.nan)
    # the attractor reached from rho_0: reduced flow, sign of g(rho_0)
    return attractors_of(roots, valid & down[idx], growth < 0, g0, rho0)


@public()
def simplex_fixed_point(hp, kern=None):
    """The largest stable rho* < 1 (NaN where there is none)."""
    fp = stable_points(hp, kern)
    best = jnp.where(fp["stable"], fp["rho"], -jnp.inf).max()
    return jnp.where(jnp.isfinite(best), best, jnp.nan)


def state_at(hp, kern, rho):
    """(q, rho, q_z, rho_z) at the fixed point with cosine rho (rho = 1: the collapsed point)."""
    ba2, bm2, aa2, am2, wa, wm, r = weights(hp)
    q_c, qz_c = collapsed_fixed_point(hp, kern)
    coll = rho >= 1.0
    rho_s = jnp.where(coll, 0.5, rho)
    inv_q, q_a, p_a = _norm_at(hp, kern, rho_s)  # (the exact map: its sizes from kern.att)
    q = jnp.where(inv_q > 0, 1.0 / jnp.where(inv_q > 0, inv_q, 1.0), jnp.inf)
    q_z = ba2 * q + aa2 * q_a
    rho_z = (ba2 * rho_s + aa2 * p_a * inv_q) / (ba2 + aa2 * q_a * inv_q)
    return (jnp.where(coll, q_c, q), rho, jnp.where(coll, qz_c, q_z), jnp.where(coll, 1.0, rho_z))


@public()
def stable_fixed_point(hp, kern=None, lambda_a=None):
    """(q, rho, q_z, rho_z) at the default attractor (the one reached from rho_0 = 1/2;
    rho = 1 when that is the collapsed point). ``lambda_a`` is accepted for compatibility."""
    return state_at(hp, kern, stable_points(hp, kern)["rho_star"])
