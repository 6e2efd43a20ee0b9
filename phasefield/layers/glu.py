"""Gated MLPs (SwiGLU, GeGLU; LLaMA, PaLM) as a layer: ``W_2 (phi(W_g x) * (W_v x))``,
weights ``N(0, sigma^2 / fan_in)``, bias-free, hidden width ``mult * d``.

Mean field on a normalized input ``(1, rho)`` (fresh weights; gate and value independent).
With ``K(rho) = E[phi(h) phi(h')]``, ``K'(rho) = E[phi'(h) phi'(h')]`` at pre-activation
scale ``sigma_g`` (:mod:`phasefield.theory.mlp`'s tables, one hidden layer, whose
``p_M = sigma_g^2 K`` and ``D = sigma_g^4 K'``) and ``c = sigma_out^2 sigma_v^2 / sigma_g^2``::

    hidden unit  z = phi(h) v:   E[z z'] = K(rho) * sigma_v^2 rho
    forward      q' = c p_M(1),           p' = c rho p_M(rho)
    backward     diag -> c (D(1) + p_M(1)) diag,   off -> c (rho D(rho) + p_M(rho)) off

The backward factor is the derivative of the forward kernel's ``rho p_M(rho)`` in rho (the
gate path gives ``sigma_g^2 K' sigma_v^2 rho``, the value path ``sigma_v^2 K``; their cross
term vanishes): Price's theorem for the product kernel. ``sigma_out`` is the output layer's
fan-in scale (std ``sigma_out / sqrt(mult d)``).

Full Gram (:mod:`.gram`): the same maps on every pair (i, k) of a normalized input
(``rho = C_ik``), NaN for a token whose norm is not 1 (as :class:`.mlp.MLP`).
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
from flax import linen as nn
from flax import struct

from .. import activations
from ..theory import mlp as mlp_maps
from . import gram
from .base import Layer
from .state import Grad, Kernel, as_float
from .weights import check_weights, linear


@struct.dataclass
class GLU(Layer):
    sigma_g: Any = 1.0  # gate W_g: std sigma_g / sqrt(d)
    sigma_v: Any = 1.0  # value W_v: std sigma_v / sqrt(d)
    sigma_out: Any = 1.0  # output W_2: std sigma_out / sqrt(mult d)
    activation: str = struct.field(pytree_node=False, default="silu")
    mult: float = struct.field(pytree_node=False, default=8.0 / 3.0)
    kern: Any = None  # the gate's MLPKernel (prepare)

    def __post_init__(self):
        activations.get(self.activation)

    def prepare(self, ctx):
        if self.kern is not None:
            return self
        return self.replace(kern=mlp_maps.kernel(self.sigma_g, self.activation, 1))

    def kernel_scale(self):
        return self.sigma_g

    def kernel_at(self, scale, sigma_max):
        return mlp_maps.kernel(scale, self.activation, 1, sigma_max=sigma_max)

    def with_kernel(self, kern):
        return self.replace(kern=kern)

    def _c(self, k):
        """c, NaN where the tables do not answer (another sigma_g, input norm other than 1)."""
        c = jnp.square(as_float(self.sigma_out) * as_float(self.sigma_v) / as_float(self.sigma_g))
        ok = (k.q == 1.0) & (self.kern.sigma_w == as_float(self.sigma_g))
        return jnp.where(ok, c, jnp.nan)

    def forward(self, k, ctx):
        c, rho = self._c(k), k.rho
        return Kernel(c * jnp.broadcast_to(self.kern.q_m, jnp.shape(rho)), c * rho * mlp_maps.p_m(self.kern, rho))

    def backward(self, k, g, ctx):
        kern, c, rho = self.kern, self._c(k), k.rho
        d_rho = jnp.where(rho >= 1.0, kern.d_one, mlp_maps.d_m(kern, jnp.minimum(rho, 1.0)))
        c_d = c * (kern.d_one + kern.q_m)
        c_o = c * (rho * d_rho + mlp_maps.p_m(kern, rho))
        return Grad.from_diag_off(c_d * g.diag, c_o * g.b)

    def gram_forward(self, c, ctx):
        return gram.tokenwise_forward(self, c, ctx)

    def gram_backward(self, c, g, ctx):
        return gram.tokenwise_backward(self, c, g, ctx)

    def module(self, weights="dense", causal=False, name=None):
        return GLUModule(self, weights=weights, name=name)


class GLUModule(nn.Module):
    layer: GLU
    weights: str = "dense"

    @nn.compact
    def __call__(self, x):
        check_weights(self.weights)
        lay = self.layer
        d = x.shape[-1]
        hidden = max(1, int(round(lay.mult * d)))
        std = math.sqrt(d)
        gate, value = linear(
            self.weights,
            (hidden, hidden),
            (jnp.asarray(lay.sigma_g) / std, jnp.asarray(lay.sigma_v) / std),
            ("gate", "value"),
        )(x)
        h = activations.get(lay.activation)(gate) * value
        (out,) = linear(self.weights, (d,), (jnp.asarray(lay.sigma_out) / math.sqrt(hidden),), ("out",))(h)
        return out
