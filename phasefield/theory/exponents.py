"""The angle exponent lambda_a (THEORY.md §6) and the gradient exponent lambda_g (§7).

Backward map (values path; the gradient Gram ``G = a I + b 11^T`` at a block's output is
mapped to the Gram at its input). MLP branch at its input (q_z, rho_z)::

    diag -> c_d diag,  off -> c_o off,   c_d = beta_M^2 + alpha_M^2 D(1) / q_z,
                                          c_o = beta_M^2 + alpha_M^2 D(rho_z) / q_z

then the attention branch at the block input (q, rho) (:func:`attention.backward`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ._api import public
from . import attention, block, fixed_points, mlp


def _kern(hp, kern):
    return mlp.kernel(hp) if kern is None else kern


# ---- lambda_a ---------------------------------------------------------------------------

@public("method")
def angle_exponent(hp, kern=None, method: str = "closed"):
    """lambda_a: log of the transverse eigenvalue of the block map at the collapsed point.

    ``method='closed'``: e^{lambda_a} = beta_A^2 (beta_M^2 + alpha_M^2 D(1) / q_z*).
    ``method='autodiff'``: the (u, u) entry of ``jax.jacfwd`` of the block map written in
    coordinates (q, u = q - p), at (q*, 0) — the triangular Jacobian's transverse eigenvalue.
    """
    kern = _kern(hp, kern)
    q_star, qz_star = fixed_points.collapsed_fixed_point(hp, kern)
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


# ---- backward map -------------------------------------------------------------------------

def backward_block(hp, kern, q, rho, q_z, rho_z, a, b, softmax_correction: bool = False):
    """Gradient Gram (a, b) at a block's output -> (a, b) at its input.

    ``softmax_correction`` adds the query/key (softmax-derivative) path of the attention
    branch that the paper drops (:mod:`phasefield.theory.correction`; zero at collapse)."""
    bm2, am2 = jnp.square(hp.beta_m), jnp.square(hp.alpha_m)
    c_d = bm2 + am2 * kern.d_one / q_z
    # at rho_z = 1 use the 1-D value (identical to the table's end node; needs no table)
    d_rho = jnp.where(rho_z >= 1.0, kern.d_one, mlp.d_m(kern, jnp.minimum(rho_z, 1.0)))
    c_o = bm2 + am2 * d_rho / q_z
    diag, off = c_d * (a + b), c_o * b
    a, b = diag - off, off
    ba2, aa2 = jnp.square(hp.beta_a), jnp.square(hp.alpha_a)
    d_att, o_att = attention.backward(hp, q, rho, a, b)
    if softmax_correction:
        from .correction import softmax_term
        d_sm, o_sm = softmax_term(hp, q, rho, a, b)
        d_att, o_att = d_att + d_sm, o_att + o_sm
    diag = ba2 * (a + b) + aa2 * d_att
    off = ba2 * b + aa2 * o_att
    return diag - off, off


def gradient_matrix(hp, kern, q, rho, q_z, rho_z, softmax_correction: bool = False):
    """The 2x2 linear backward map on (a, b) of one block at a given forward state."""
    one, zero = jnp.ones_like(q), jnp.zeros_like(q)
    col_a = backward_block(hp, kern, q, rho, q_z, rho_z, one, zero, softmax_correction)
    col_b = backward_block(hp, kern, q, rho, q_z, rho_z, zero, one, softmax_correction)
    return jnp.stack([jnp.stack(col_a), jnp.stack(col_b)], axis=-1)


def _top_eigenvalue(m):
    tr = m[0, 0] + m[1, 1]
    det = m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0]
    return 0.5 * (tr + jnp.sqrt(jnp.maximum(tr * tr - 4.0 * det, 0.0)))


@public()
def mean_mode(hp, kern=None):
    """Eigenvalue of the mean-token mode of the backward map at the collapsed point (§7)."""
    kern = _kern(hp, kern)
    q_star, qz_star = fixed_points.collapsed_fixed_point(hp, kern)
    ba2, bm2 = jnp.square(hp.beta_a), jnp.square(hp.beta_m)
    aa2, am2 = jnp.square(hp.alpha_a), jnp.square(hp.alpha_m)
    return (ba2 + aa2 * jnp.square(hp.sigma_v) / q_star) * (bm2 + am2 * kern.d_one / qz_star)


@public()
def gradient_exponent_collapsed(hp, kern=None, depth=None, lambda_a=None):
    """lambda_g(L) with the input at the collapsed fixed point, in closed form:
    (1/L) log[(1 - 1/n) e^{L lambda_a} + mu^L / n]  (traceable in L and n)."""
    kern = _kern(hp, kern)
    L = jnp.asarray(hp.depth if depth is None else depth, jnp.result_type(float))
    n = jnp.asarray(hp.n_tokens, jnp.result_type(float))
    la = angle_exponent(hp, kern) if lambda_a is None else lambda_a
    mu = mean_mode(hp, kern)
    return jnp.logaddexp(jnp.log1p(-1.0 / n) + L * la, L * jnp.log(mu) - jnp.log(n)) / L


@public("num_layers", "softmax_correction")
def gradient_exponent(hp, q0=None, p0=None, num_layers: int | None = None, kern=None,
                      softmax_correction: bool = False):
    """Finite-depth lambda_g(L) = (1/L) log(a + b) from input geometry (q0, p0) (§7).

    Runs the forward trajectory for L blocks, starts the backward pass with G = I at the
    output and applies each block's backward map down to the input (with log rescaling).
    Default input: the collapsed fixed point. ``num_layers`` is static (default hp.depth).
    ``softmax_correction`` adds the softmax-derivative path (see :func:`backward_block`).
    """
    kern = _kern(hp, kern)
    if q0 is None:
        q0, _ = fixed_points.collapsed_fixed_point(hp, kern)
        p0 = q0 if p0 is None else p0
    elif p0 is None:
        raise ValueError("give both q0 and p0, or neither")
    if num_layers is None:
        num_layers = int(hp.depth)
    qs, ps, qz, pz = block.trajectory(hp, q0, p0, num_layers, kern, return_z=True)
    xs = (qs[:-1], ps[:-1] / qs[:-1], qz, pz / qz)

    def step(carry, x):
        a, b, log_scale = carry
        a, b = backward_block(hp, kern, *x, a, b, softmax_correction)
        s = a + b
        return (a / s, b / s, log_scale + jnp.log(s)), None

    dt = jnp.result_type(float)
    init = (jnp.ones((), dt), jnp.zeros((), dt), jnp.zeros((), dt))
    (_, _, log_total), _ = jax.lax.scan(step, init, xs, reverse=True)
    return log_total / num_layers


@public("softmax_correction")
def gradient_exponent_inf(hp, kern=None, state=None, softmax_correction: bool = False):
    """lambda_g^inf: log top eigenvalue of the backward map at the stable fixed point."""
    kern = _kern(hp, kern)
    if state is None:
        state = fixed_points.stable_fixed_point(hp, kern)
    return jnp.log(_top_eigenvalue(gradient_matrix(hp, kern, *state, softmax_correction)))


@public()
def exponents(hp, kern=None) -> dict:
    """Everything at one point: lambda_a, lambda_g (depth hp.depth, collapsed input),
    lambda_g_inf, q_star, q_z_star, rho_star (1 in the ordered phase)."""
    kern = _kern(hp, kern)
    la = angle_exponent(hp, kern)
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
