"""The block map (q, p) -> (q', p') of THEORY.md §5 and its depth iteration.

    Z  = beta_A X + alpha_A Attn(LN X):   q_z = beta_A^2 q + alpha_A^2 q_A(rho),  p_z likewise
    X' = beta_M Z + alpha_M MLP(LN Z):    q'  = beta_M^2 q_z + alpha_M^2 q_M,
                                          p'  = beta_M^2 p_z + alpha_M^2 p_M(p_z / q_z)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ._api import public
from . import attention, mlp


def _kern(hp, kern):
    return mlp.kernel(hp) if kern is None else kern


def attention_step(hp, q, p):
    """(q_z, p_z): the state between the two branches."""
    q_a, p_a = attention.forward(hp, p / q)
    ba2, aa2 = jnp.square(hp.beta_a), jnp.square(hp.alpha_a)
    return ba2 * q + aa2 * q_a, ba2 * p + aa2 * p_a


def mlp_step(hp, q_z, p_z, kern):
    bm2, am2 = jnp.square(hp.beta_m), jnp.square(hp.alpha_m)
    return bm2 * q_z + am2 * kern.q_m, bm2 * p_z + am2 * mlp.p_m(kern, p_z / q_z)


@public()
def block_map(hp, q, p, kern=None):
    """One block of the mean-field map: (q, p) -> (q', p')."""
    kern = _kern(hp, kern)
    q_z, p_z = attention_step(hp, q, p)
    return mlp_step(hp, q_z, p_z, kern)


@public("num_layers", "return_z")
def trajectory(hp, q0, p0, num_layers: int | None = None, kern=None, return_z: bool = False):
    """Iterate the block map: arrays q, p of length num_layers + 1 (index 0 = input).

    ``num_layers`` is static; it defaults to ``hp.depth`` (which must then be concrete).
    With ``return_z`` also the between-branch states (q_z, p_z) of each block (length L).
    """
    kern = _kern(hp, kern)
    if num_layers is None:
        num_layers = int(hp.depth)
    dt = jnp.result_type(float)
    q0 = jnp.asarray(q0, dt)
    p0 = jnp.asarray(p0, dt)

    def step(carry, _):
        q, p = carry
        q_z, p_z = attention_step(hp, q, p)
        q1, p1 = mlp_step(hp, q_z, p_z, kern)
        return (q1, p1), (q1, p1, q_z, p_z)

    _, (qs, ps, qz, pz) = jax.lax.scan(step, (q0, p0), None, length=num_layers)
    qs = jnp.concatenate([q0[None], qs])
    ps = jnp.concatenate([p0[None], ps])
    return (qs, ps, qz, pz) if return_z else (qs, ps)
