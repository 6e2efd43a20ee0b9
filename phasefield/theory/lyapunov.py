"""The gradient exponent lambda_g (THEORY.md §7) and everything at one point
(:func:`exponents`). lambda_a and the fixed points are in :mod:`.fixed_points`, the
backward map of one block in :mod:`.block`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from . import block, fixed_points
from ._api import public


def _top_eigenvalue(m):
    tr = m[0, 0] + m[1, 1]
    det = m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0]
    return 0.5 * (tr + jnp.sqrt(jnp.maximum(tr * tr - 4.0 * det, 0.0)))


@public()
def mean_mode(hp, kern=None):
    """Eigenvalue of the mean-token mode of the backward map at the collapsed point (§7)."""
    q_star, qz_star = fixed_points.collapsed_fixed_point(hp, kern)
    ba2, bm2 = jnp.square(hp.beta_a), jnp.square(hp.beta_m)
    aa2, am2 = jnp.square(hp.alpha_a), jnp.square(hp.alpha_m)
    return (ba2 + aa2 * jnp.square(hp.sigma_v) / q_star) * (bm2 + am2 * kern.d_one / qz_star)


@public()
def gradient_exponent_collapsed(hp, kern=None, depth=None, lambda_a=None):
    """lambda_g(L) with the input at the collapsed fixed point, in closed form:
    (1/L) log[(1 - 1/n) e^{L lambda_a} + mu^L / n]  (traceable in L and n)."""
    L = jnp.asarray(hp.depth if depth is None else depth, jnp.result_type(float))
    n = jnp.asarray(hp.n_tokens, jnp.result_type(float))
    la = fixed_points.angle_exponent(hp, kern) if lambda_a is None else lambda_a
    mu = mean_mode(hp, kern)
    return jnp.logaddexp(jnp.log1p(-1.0 / n) + L * la, L * jnp.log(mu) - jnp.log(n)) / L


@public("num_layers")
def gradient_exponent(hp, q0=None, p0=None, num_layers: int | None = None, kern=None):
    """Finite-depth lambda_g(L) = (1/L) log(a + b) from input geometry (q0, p0) (§7).

    Runs the forward trajectory for L blocks, starts the backward pass with G = I at the
    output and applies each block's backward map down to the input (with log rescaling).
    Default input: the collapsed fixed point. ``num_layers`` is static (default hp.depth).
    ``hp.softmax_correction`` adds the softmax-derivative path (:mod:`.attention.softmax`).
    """
    if q0 is None:
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
    return jnp.log(_top_eigenvalue(block.gradient_matrix(hp, kern, *state)))


@public()
def exponents(hp, kern=None) -> dict:
    """Everything at one point: lambda_a, lambda_g (depth hp.depth, collapsed input),
    lambda_g_inf, q_star, q_z_star, rho_star (1 in the ordered phase)."""
    la = fixed_points.angle_exponent(hp, kern)
    q_star, qz_star = fixed_points.collapsed_fixed_point(hp, kern)
    state = fixed_points.stable_fixed_point(hp, kern, lambda_a=la)
    return dict(
        lambda_a=la,
        lambda_g=gradient_exponent_collapsed(hp, kern, lambda_a=la),
        lambda_g_inf=gradient_exponent_inf(hp, kern, state),
        q_star=q_star,
        q_z_star=qz_star,
        rho_star=state[1],
    )
