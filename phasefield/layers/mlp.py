"""The tokenwise MLP as a layer: ``W_{k+1} phi(W_k ... phi(W_1 x))``, weights
``N(0, sigma_w^2 / fan_in)``, bias-free, hidden width ``mult * d``.

Mean field (docs/theory.md §4, :mod:`phasefield.theory.mlp`): on a normalized input ``(1, rho)``
the output is ``(q_M, p_M(rho))`` and the backward map is ``diag -> D(1) diag``,
``off -> D(rho) off`` (Price's theorem, :func:`phasefield.theory.mlp.d_m`). The hidden width
does not enter the infinite-width map.

The Gaussian-integral tables (:class:`phasefield.theory.mlp.MLPKernel`) are built for one
``sigma_w`` and a unit input norm. They ride along in ``kern`` (built by :meth:`MLP.prepare`
outside any trace, sized from the concrete sigma_w) and are *checked*, never trusted: where
the layer's sigma_w is not the kernel's, or the input norm is not 1 (no norm before the
MLP), every output is NaN rather than the answer for another sigma_w.

Full Gram (:mod:`.gram`): the same maps on every pair (i, k) of a normalized input
(``C_ii = 1``): ``C'_ii = q_M``, ``C'_ik = p_M(C_ik)``, backward ``G_ik -> D(C_ik) G_ik``
(``D(1)`` on the diagonal); NaN for a token whose norm is not 1.
"""

from __future__ import annotations

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
class MLP(Layer):
    sigma_w: Any = 1.0
    activation: str = struct.field(pytree_node=False, default="tanh")
    layers: int = struct.field(pytree_node=False, default=1)
    mult: float = struct.field(pytree_node=False, default=1.0)
    sigma_out: Any = None  # fan-in scale of the output layer (None: sigma_w)
    kern: Any = None  # MLPKernel (prepare)
    name: str | None = struct.field(pytree_node=False, default=None)  # its Flax module's (None: automatic)

    def __post_init__(self):
        activations.get(self.activation)  # ValueError for an unknown one
        if not (isinstance(self.layers, int) and self.layers >= 1):
            raise ValueError(f"mlp layers must be an integer >= 1 (got {self.layers!r})")

    def prepare(self, ctx):
        if self.kern is not None:
            return self
        return self.replace(kern=mlp_maps.kernel(self.sigma_w, self.activation, self.layers))

    def kernel_scale(self):
        return self.sigma_w

    def kernel_at(self, scale, sigma_max):
        return mlp_maps.kernel(scale, self.activation, self.layers, sigma_max=sigma_max)

    def with_kernel(self, kern):
        return self.replace(kern=kern)

    def _checked(self, k, x):
        """x times the output layer's (sigma_out / sigma_w)^2, NaN where the kernel does not
        answer for this layer (another sigma_w, or an input norm other than 1)."""
        ok = (k.q == 1.0) & (self.kern.sigma_w == as_float(self.sigma_w))
        if self.sigma_out is not None:
            x = x * jnp.square(as_float(self.sigma_out) / as_float(self.sigma_w))
        return jnp.where(ok, x, jnp.nan)

    def forward(self, k, ctx):
        kern = self.kern
        rho = k.rho
        return Kernel(
            self._checked(k, jnp.broadcast_to(kern.q_m, jnp.shape(rho))), self._checked(k, mlp_maps.p_m(kern, rho))
        )

    def backward(self, k, g, ctx):
        kern = self.kern
        rho = k.rho
        # at rho = 1 the 1-D value (the table's end node; needs no table)
        d_rho = jnp.where(rho >= 1.0, kern.d_one, mlp_maps.d_m(kern, jnp.minimum(rho, 1.0)))
        return Grad.from_diag_off(self._checked(k, kern.d_one * g.diag), self._checked(k, d_rho * g.b))

    def gram_forward(self, c, ctx):
        return gram.tokenwise_forward(self, c, ctx)

    def gram_backward(self, c, g, ctx):
        return gram.tokenwise_backward(self, c, g, ctx)

    def module(self, weights="dense", causal=False, name=None):
        return MLPModule(self, weights=weights, name=name)


class MLPModule(nn.Module):
    layer: MLP
    weights: str = "dense"

    @nn.compact
    def __call__(self, x):
        check_weights(self.weights)
        lay = self.layer
        d = x.shape[-1]
        hidden = max(1, int(round(lay.mult * d)))
        phi = activations.get(lay.activation)
        k = lay.layers
        h = x
        for i, (fan_in, fan_out) in enumerate([(d, hidden)] + [(hidden, hidden)] * (k - 1) + [(hidden, d)]):
            scale = lay.sigma_w if (i < k or lay.sigma_out is None) else lay.sigma_out
            std = jnp.asarray(scale) / jnp.sqrt(fan_in)
            (h,) = linear(self.weights, (fan_out,), (std,), (f"dense_{i}",))(h)
            if i < k:
                h = phi(h)
        return h
