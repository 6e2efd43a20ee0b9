"""The gradient exponent lambda_g (docs/theory.md §7) and everything at one point
(:func:`exponents`). lambda_a and the fixed points are in :mod:`.fixed_points`, the
backward map of one block in :mod:`.block`.

Identity residual (beta = 1): there is no finite collapsed fixed point (the norm grows by
``c = alpha_A^2 sigma_V^2 + alpha_M^2 q_M`` per block), so the finite-depth lambda_g(L)
starts from the collapsed input geometry with ``q_0 = 1`` (:data:`IDENTITY_Q0`, the
normalized embedding) instead. At rho = 1 its two backward modes are still decoupled, with
per-block factors ``t_l = 1 + alpha_M^2 D(1) / q_z,l`` and ``(1 + alpha_A^2 sigma_V^2 / q_l) t_l``
on the linear norm path ``q_l = q_0 + l c``; the products over l are ratios of Gamma
functions, so lambda_g(L) stays in closed form (traceable in L).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ...theory._api import public
from ..depth import top_eigenvalue
from . import block, fixed_points

IDENTITY_Q0 = 1.0


@public()
def mean_mode(hp, kern=None):
    """Eigenvalue of the mean-token mode of the backward map at the collapsed point (§7)."""
    q_star, qz_star = fixed_points.collapsed_fixed_point(hp, kern)
    ba2, bm2 = jnp.square(hp.beta_a), jnp.square(hp.beta_m)
    aa2, am2 = jnp.square(hp.alpha_a), jnp.square(hp.alpha_m)
    inv = fixed_points.inv
    return (ba2 + aa2 * jnp.square(hp.sigma_v) * inv(q_star)) * (bm2 + am2 * kern.d_one * inv(qz_star))


def _log_rising_ratio(x0, dx, L):
    """sum_{l=0}^{L-1} log(1 + dx / (l + x0)) = lgamma(L + x0 + dx) - lgamma(x0 + dx)
    - lgamma(L + x0) + lgamma(x0); for huge x0 (tiny branch weights) the first-order form
    dx (digamma(L + x0) - digamma(x0)) avoids the cancellation of the log-Gammas."""
    gl = jax.scipy.special.gammaln
    dg = jax.scipy.special.digamma
    big = x0 > 1e6
    xs = jnp.where(big, 1.0, x0)
    exact = gl(L + xs + dx) - gl(xs + dx) - gl(L + xs) + gl(xs)
    xb = jnp.where(big, x0, 1e6)
    return jnp.where(big, dx * (dg(L + xb) - dg(xb)), exact)


def _identity_lambda_g(hp, kern, L, n):
    """lambda_g(L) of the identity residual from (q_0, rho = 1), closed form (module doc)."""
    aa2, am2 = jnp.square(hp.alpha_a), jnp.square(hp.alpha_m)
    sv2 = jnp.square(hp.sigma_v)
    c = aa2 * sv2 + am2 * kern.q_m
    pos = c > 0
    cs = jnp.where(pos, c, 1.0)
    q0 = jnp.asarray(IDENTITY_Q0, L.dtype)
    x0 = (q0 + aa2 * sv2) / cs  # q_z,l / c = l + x0
    log_t = _log_rising_ratio(x0, am2 * kern.d_one / cs, L)
    log_mean = log_t + _log_rising_ratio(q0 / cs, aa2 * sv2 / cs, L)
    out = jnp.logaddexp(jnp.log1p(-1.0 / n) + log_t, log_mean - jnp.log(n)) / L
    return jnp.where(pos, out, 0.0)


@public()
def gradient_exponent_collapsed(hp, kern=None, depth=None, lambda_a=None):
    """lambda_g(L) with the input at the collapsed fixed point, in closed form:
    (1/L) log[(1 - 1/n) e^{L lambda_a} + mu^L / n]  (traceable in L and n)."""
    L = jnp.asarray(hp.depth if depth is None else depth, jnp.result_type(float))
    n = jnp.asarray(hp.n_tokens, jnp.result_type(float))
    if hp.residual == "identity":
        return _identity_lambda_g(hp, kern, L, n)
    la = fixed_points.angle_exponent(hp, kern) if lambda_a is None else lambda_a
    mu = mean_mode(hp, kern)
    out = jnp.logaddexp(jnp.log1p(-1.0 / n) + L * la, L * jnp.log(mu) - jnp.log(n)) / L
    # both modes exactly 1 (alpha = 0: the identity block): 0 exactly, not a rounding of
    # log((1 - 1/n) + 1/n) (whose sign would decide the phase label)
    return jnp.where((la == 0) & (mu == 1), jnp.zeros_like(out), out)


@public("num_layers")
def gradient_exponent(hp, q0=None, p0=None, num_layers: int | None = None, kern=None):
    """Finite-depth lambda_g(L) = (1/L) log(a + b) from input geometry (q0, p0) (§7).

    Runs the forward trajectory for L blocks, starts the backward pass with G = I at the
    output and applies each block's backward map down to the input (with log rescaling).
    Default input: the collapsed fixed point (identity residual: q0 = p0 = 1). ``num_layers`` is static (default hp.depth).
    ``hp.softmax_correction`` adds the softmax-derivative path (:mod:`.attention.softmax`).
    """
    if q0 is None and hp.residual == "identity":
        q0 = p0 = jnp.asarray(IDENTITY_Q0, jnp.result_type(float))
    elif q0 is None:
        q0, _ = fixed_points.collapsed_fixed_point(hp, kern)
        p0 = q0 if p0 is None else p0
    elif p0 is None:
        raise ValueError("give both q0 and p0, or neither")
    qs, ps, qz, pz = block.trajectory(hp, q0, p0, num_layers, kern, return_z=True)
    xs = (qs[:-1], ps[:-1] / qs[:-1], qz, pz / qz)

    def step(carry, x):
        a, b, log_scale = carry
        a, b = block.backward_block(hp, kern, *x, a, b)
        s = a + b
        return (a / s, b / s, log_scale + jnp.log(s)), None

    dt = jnp.result_type(float)
    init = (jnp.ones((), dt), jnp.zeros((), dt), jnp.zeros((), dt))
    (_, _, log_total), _ = jax.lax.scan(step, init, xs, reverse=True)
    return log_total / num_layers


@public()
def gradient_exponent_inf(hp, kern=None, state=None):
    """lambda_g^inf: log top eigenvalue of the backward map at the stable fixed point."""
    if state is None:
        state = fixed_points.stable_fixed_point(hp, kern)
    return jnp.log(top_eigenvalue(block.gradient_matrix(hp, kern, *state)))


@public()
def attractors(hp, kern=None):
    """Every stable cosine, [MAX_ROOTS + 1] ascending and NaN-padded (1 = the collapsed
    point rho = 1 when it attracts)."""
    fp = fixed_points.stable_points(hp, kern)
    rho_stable = jnp.concatenate(
        [jnp.where(fp["stable"], fp["rho"], jnp.nan), jnp.where(fp["collapsed_stable"], 1.0, jnp.nan)[None]]
    )
    return jnp.sort(rho_stable)  # NaN sorts last


@public()
def exponents(hp, kern=None) -> dict:
    """Everything at one point. Which state each number refers to:

    lambda_a      the collapsed point rho = 1 (its transverse exponent, both phases);
    lambda_g_collapse  depth hp.depth, input at the collapsed fixed point (identity residual:
                  q0 = 1, rho = 1);
    q_star, q_z_star   the collapsed fixed point (+inf for the identity residual);
    rho_star      the default attractor: the stable fixed point reached from rho_0 = 1/2
                  (1 = the collapsed point);
    lambda_g_inf  at that default attractor;
    n_stable      number of stable fixed points (rho = 1 included; >= 2: bistable);
    rho_star_min, rho_star_max   the smallest and largest stable cosines (1 if rho = 1 is
                  stable); all of them: :func:`attractors`.
    """
    return exponents_of(hp, kern)


def exponents_of(hp, kern, per_root: bool = False, search: bool = True):
    """:func:`exponents`; ``per_root``: the stable-point search refines only the brackets the
    point has (``fixed_points.stable_points_of``; the sweep's tiles); ``search=False``: no
    search, for points where ``fixed_points.no_roots`` holds (the sweep's tiles)."""
    la = fixed_points.angle_exponent(hp, kern)
    q_star, qz_star = fixed_points.collapsed_fixed_point(hp, kern)
    fp = (
        fixed_points.stable_points_of(hp, kern, hp.attention == "exact", per_root)
        if search
        else fixed_points.collapsed_only(hp, kern)
    )
    state = fixed_points.state_at(hp, kern, fp["rho_star"])
    rho_stable = jnp.concatenate(
        [jnp.where(fp["stable"], fp["rho"], jnp.nan), jnp.where(fp["collapsed_stable"], 1.0, jnp.nan)[None]]
    )
    # every output is a scalar (sweeps stack them); the list of stable cosines is
    # fixed_points.stable_points (or :func:`attractors`)
    lo = jnp.where(jnp.isnan(rho_stable), jnp.inf, rho_stable).min()
    hi = jnp.where(jnp.isnan(rho_stable), -jnp.inf, rho_stable).max()
    return dict(
        lambda_a=la,
        lambda_g_collapse=gradient_exponent_collapsed(hp, kern, lambda_a=la),
        lambda_g_inf=gradient_exponent_inf(hp, kern, state),
        q_star=q_star,
        q_z_star=qz_star,
        rho_star=fp["rho_star"],
        n_stable=fp["n_stable"],
        rho_star_min=jnp.where(jnp.isfinite(lo), lo, jnp.nan),
        rho_star_max=jnp.where(jnp.isfinite(hi), hi, jnp.nan),
    )
