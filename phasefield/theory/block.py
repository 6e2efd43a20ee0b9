"""The block map of THEORY.md §5, forward (q, p) -> (q', p') and backward (the gradient
Gram at a block's output -> at its input, §7), and the forward iteration over depth.

Forward::

    Z  = beta_A X + alpha_A Attn(LN X):   q_z = beta_A^2 q + alpha_A^2 q_A(rho),  p_z likewise
    X' = beta_M Z + alpha_M MLP(LN Z):    q'  = beta_M^2 q_z + alpha_M^2 q_M,
                                          p'  = beta_M^2 p_z + alpha_M^2 p_M(p_z / q_z)

Backward (gradient Gram ``G = a I + b 11^T``), MLP branch at its input (q_z, rho_z)::

    diag -> c_d diag,  off -> c_o off,   c_d = beta_M^2 + alpha_M^2 D(1) / q_z,
                                          c_o = beta_M^2 + alpha_M^2 D(rho_z) / q_z

then the attention branch at the block input (q, rho) (:func:`attention.backward`; with
``hp.softmax_correction`` it includes the softmax path).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from . import attention, mlp
from ._api import public


# ---- forward ------------------------------------------------------------------------------

def attention_step(hp, q, p, att=None):
    """(q_z, p_z): the state between the two branches (``att``: the exact map's sizes,
    ``kern.att``)."""
    q_a, p_a = attention.forward(hp, p / q, att)
    ba2, aa2 = jnp.square(hp.beta_a), jnp.square(hp.alpha_a)
    return ba2 * q + aa2 * q_a, ba2 * p + aa2 * p_a


def mlp_step(hp, q_z, p_z, kern):
    bm2, am2 = jnp.square(hp.beta_m), jnp.square(hp.alpha_m)
    return bm2 * q_z + am2 * kern.q_m, bm2 * p_z + am2 * mlp.p_m(kern, p_z / q_z)


@public()
def block_map(hp, q, p, kern=None):
    """One block of the mean-field map: (q, p) -> (q', p')."""
    q_z, p_z = attention_step(hp, q, p, kern.att)
    return mlp_step(hp, q_z, p_z, kern)


@public("num_layers", "return_z")
def trajectory(hp, q0, p0, num_layers: int | None = None, kern=None, return_z: bool = False):
    """Iterate the block map: arrays q, p of length num_layers + 1 (index 0 = input).

    ``num_layers`` is static; it defaults to ``hp.depth`` (which must then be concrete).
    With ``return_z`` also the between-branch states (q_z, p_z) of each block (length L).
    """
    dt = jnp.result_type(float)
    q0 = jnp.asarray(q0, dt)
    p0 = jnp.asarray(p0, dt)

    def step(carry, _):
        q, p = carry
        q_z, p_z = attention_step(hp, q, p, kern.att)
        q1, p1 = mlp_step(hp, q_z, p_z, kern)
        return (q1, p1), (q1, p1, q_z, p_z)

    _, (qs, ps, qz, pz) = jax.lax.scan(step, (q0, p0), None, length=num_layers)
    qs = jnp.concatenate([q0[None], qs])
    ps = jnp.concatenate([p0[None], ps])
    return (qs, ps, qz, pz) if return_z else (qs, ps)


# ---- backward -----------------------------------------------------------------------------

def backward_block(hp, kern, q, rho, q_z, rho_z, a, b):
    """Gradient Gram (a, b) at a block's output -> (a, b) at its input."""
    bm2, am2 = jnp.square(hp.beta_m), jnp.square(hp.alpha_m)
    c_d = bm2 + am2 * kern.d_one / q_z
    # at rho_z = 1 use the 1-D value (identical to the table's end node; needs no table)
    d_rho = jnp.where(rho_z >= 1.0, kern.d_one, mlp.d_m(kern, jnp.minimum(rho_z, 1.0)))
    c_o = bm2 + am2 * d_rho / q_z
    diag, off = c_d * (a + b), c_o * b
    a, b = diag - off, off
    ba2, aa2 = jnp.square(hp.beta_a), jnp.square(hp.alpha_a)
    d_att, o_att = attention.backward(hp, q, rho, a, b, kern.att)
    diag = ba2 * (a + b) + aa2 * d_att
    off = ba2 * b + aa2 * o_att
    return diag - off, off


def gradient_matrix(hp, kern, q, rho, q_z, rho_z):
    """The 2x2 linear backward map on (a, b) of one block at a given forward state."""
    one, zero = jnp.ones_like(q), jnp.zeros_like(q)
    # both columns in one call (a, b of shape [2]): the attention expectations at (q, rho)
    # are computed once, not once per column (the exact map's are costly, issue 13)
    diag, off = backward_block(hp, kern, q, rho, q_z, rho_z, jnp.stack([one, zero]), jnp.stack([zero, one]))
    return jnp.moveaxis(jnp.stack([diag, off]), 1, -1)     # [diag/off, ..., column a/b]
