"""The block map of docs/theory.md §5, forward (q, p) -> (q', p') and backward (the gradient
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

from ...theory._api import public
from ..state import Context, Grad, Kernel
from .preset import paper

# The paper's block is one composition of phasefield.layers (preset.paper): its two
# residual sublayers, with the tables this module's callers already hold riding along.


def _sublayers(hp, kern=None, att=None):
    attn, mlp = paper(hp).layers
    attn = attn.replace(
        branch=attn.branch.replace(layers=(attn.branch.layers[0], attn.branch.layers[1].replace(att=att)))
    )
    if kern is not None:
        mlp = mlp.replace(
            branch=mlp.branch.replace(layers=(mlp.branch.layers[0], mlp.branch.layers[1].replace(kern=kern)))
        )
    return attn, mlp


def _ctx(hp):
    return Context(hp.n_tokens)


# ---- forward ------------------------------------------------------------------------------


def attention_step(hp, q, p, att=None):
    """(q_z, p_z): the state between the two branches (``att``: the exact map's sizes,
    ``kern.att``)."""
    k = _sublayers(hp, att=att)[0].forward(Kernel(q, p), _ctx(hp))
    return k.q, k.p


def mlp_step(hp, q_z, p_z, kern):
    k = _sublayers(hp, kern, kern.att)[1].forward(Kernel(q_z, p_z), _ctx(hp))
    return k.q, k.p


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
    attn, mlp = _sublayers(hp, kern, kern.att)
    ctx = _ctx(hp)
    g = _residual_backward(mlp, q_z, rho_z, Grad(a, b), ctx)
    g = _residual_backward(attn, q, rho, g, ctx)
    return g.a, g.b


def _residual_backward(sub, q, rho, g, ctx):
    """A residual sublayer's backward map at (q, rho), with its limit q -> inf (the identity
    residual's fixed point): the normalized branch's share ~ 1/q vanishes, beta^2 G is left."""
    inf = jnp.isinf(q)
    q_s = jnp.where(inf, 1.0, q)
    out = sub.backward(Kernel(q_s, rho * q_s), g, ctx)
    b2, _ = sub.weights()
    return Grad(jnp.where(inf, b2 * g.a, out.a), jnp.where(inf, b2 * g.b, out.b))


def gradient_matrix(hp, kern, q, rho, q_z, rho_z):
    """The 2x2 linear backward map on (a, b) of one block at a given forward state."""
    one, zero = jnp.ones_like(q), jnp.zeros_like(q)
    # both columns in one call (a, b of shape [2]): the attention expectations at (q, rho)
    # are computed once, not once per column (the exact map's are costly)
    diag, off = backward_block(hp, kern, q, rho, q_z, rho_z, jnp.stack([one, zero]), jnp.stack([zero, one]))
    return jnp.moveaxis(jnp.stack([diag, off]), 1, -1)  # [diag/off, ..., column a/b]
