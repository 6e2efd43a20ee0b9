"""Fixed points of the block map and the angle exponent lambda_a (THEORY.md §6).

* Collapsed point (rho = 1, invariant): q* solves the linear equation
  q* = beta_M^2 (beta_A^2 q* + alpha_A^2 sigma_V^2) + alpha_M^2 q_M, and
  q_z* = beta_A^2 q* + alpha_A^2 sigma_V^2. It does not exist (NaN) when
  beta_A^2 beta_M^2 = 1, e.g. for the identity residual.
* Stable point: the collapsed point in the ordered phase (lambda_a <= 0); otherwise the
  simplex point rho* < 1, the root of g(rho) = p'(rho) - rho q*(rho) on
  [-1/(n-1), 1) where q*(rho) is the norm fixed point at cosine rho. Found by a fixed
  number of bisection steps and a Newton polish, so it is jit- and vmap-able.
* lambda_a, the log transverse eigenvalue at the collapsed point, in closed form (or by
  autodiff of the block map); it decides which of the two is stable.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from . import attention, block
from ._api import public

BISECTION_STEPS = 18
NEWTON_STEPS = 4


@public()
def collapsed_fixed_point(hp, kern=None):
    """(q*, q_z*) of the collapsed fixed point rho = 1."""
    ba2, bm2 = jnp.square(hp.beta_a), jnp.square(hp.beta_m)
    aa2, am2 = jnp.square(hp.alpha_a), jnp.square(hp.alpha_m)
    sv2 = jnp.square(hp.sigma_v)
    den = 1.0 - ba2 * bm2
    q_star = jnp.where(den > 0, (bm2 * aa2 * sv2 + am2 * kern.q_m) / jnp.where(den > 0, den, 1.0), jnp.nan)
    return q_star, ba2 * q_star + aa2 * sv2


def _norm_at(hp, kern, rho):
    """Norm fixed point q*(rho) at fixed cosine rho, and the attention output (q_A, p_A)."""
    ba2, bm2 = jnp.square(hp.beta_a), jnp.square(hp.beta_m)
    aa2, am2 = jnp.square(hp.alpha_a), jnp.square(hp.alpha_m)
    q_a, p_a = attention.forward(hp, rho)
    q = (bm2 * aa2 * q_a + am2 * kern.q_m) / (1.0 - ba2 * bm2)
    return q, q_a, p_a


def _residual(hp, kern, rho):
    """g(rho) / q*(rho): relative mismatch of p at the norm fixed point of cosine rho."""
    ba2, bm2 = jnp.square(hp.beta_a), jnp.square(hp.beta_m)
    aa2, am2 = jnp.square(hp.alpha_a), jnp.square(hp.alpha_m)
    q, q_a, p_a = _norm_at(hp, kern, rho)
    q_z = ba2 * q + aa2 * q_a
    p_z = ba2 * rho * q + aa2 * p_a
    _, p1 = block.mlp_step(hp, q_z, p_z, kern)
    return p1 / q - rho


@public("method")
def angle_exponent(hp, kern=None, method: str = "closed"):
    """lambda_a: log of the transverse eigenvalue of the block map at the collapsed point.

    ``method='closed'``: e^{lambda_a} = beta_A^2 (beta_M^2 + alpha_M^2 D(1) / q_z*).
    ``method='autodiff'``: the (u, u) entry of ``jax.jacfwd`` of the block map written in
    coordinates (q, u = q - p), at (q*, 0) — the triangular Jacobian's transverse eigenvalue.
    """
    q_star, qz_star = collapsed_fixed_point(hp, kern)
    if method == "closed":
        ba2, bm2, am2 = jnp.square(hp.beta_a), jnp.square(hp.beta_m), jnp.square(hp.alpha_m)
        return jnp.log(ba2 * (bm2 + am2 * kern.d_one / qz_star))
    if method == "autodiff":
        def f(x):
            q, u = x[0], x[1]
            q1, p1 = block.block_map(hp, q, q - u, kern)
            return jnp.stack([q1, q1 - p1])

        jac = jax.jacfwd(f)(jnp.stack([q_star, jnp.zeros_like(q_star)]))
        return jnp.log(jac[1, 1])
    raise ValueError(f"unknown method {method!r} (closed or autodiff)")


@public()
def simplex_fixed_point(hp, kern=None):
    """rho* < 1 of the chaotic phase (meaningful only when lambda_a > 0)."""
    dt = jnp.result_type(float)
    n = jnp.asarray(hp.n_tokens, dt)
    lo = -1.0 / (n - 1.0)
    hi = jnp.ones_like(lo)
    f = lambda r: _residual(hp, kern, r)

    def bisect(_, bracket):
        lo_, hi_ = bracket
        mid = 0.5 * (lo_ + hi_)
        pos = f(mid) > 0
        return jnp.where(pos, mid, lo_), jnp.where(pos, hi_, mid)

    lo, hi = jax.lax.fori_loop(0, BISECTION_STEPS, bisect, (lo, hi))

    def newton(_, r):
        val, slope = jax.jvp(f, (r,), (jnp.ones_like(r),))
        step = jnp.where(slope != 0, val / jnp.where(slope != 0, slope, 1.0), 0.0)
        r_new = r - step
        return jnp.where((r_new > lo - 1e-9) & (r_new < hi + 1e-9), r_new, r)

    return jax.lax.fori_loop(0, NEWTON_STEPS, newton, 0.5 * (lo + hi))


@public()
def stable_fixed_point(hp, kern=None, lambda_a=None):
    """(q, rho, q_z, rho_z) at the stable fixed point (rho = 1 in the ordered phase)."""
    if lambda_a is None:
        lambda_a = angle_exponent(hp, kern)
    q_c, qz_c = collapsed_fixed_point(hp, kern)
    rho_s = simplex_fixed_point(hp, kern)
    chaotic = lambda_a > 0
    rho = jnp.where(chaotic, rho_s, 1.0)
    rho = jnp.where(jnp.isnan(lambda_a), jnp.nan, rho)
    q, q_a, p_a = _norm_at(hp, kern, rho)
    ba2, aa2 = jnp.square(hp.beta_a), jnp.square(hp.alpha_a)
    q_z = ba2 * q + aa2 * q_a
    rho_z = (ba2 * rho * q + aa2 * p_a) / q_z
    q = jnp.where(chaotic, q, q_c)
    q_z = jnp.where(chaotic, q_z, qz_c)
    rho_z = jnp.where(chaotic, rho_z, 1.0)
    return q, rho, q_z, rho_z
