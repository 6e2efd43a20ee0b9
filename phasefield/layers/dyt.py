"""DyT (Dynamic Tanh; Zhu et al. 2025, "Transformers without Normalization") as a layer:
the normalization replaced by the elementwise ``DyT(x) = gamma * tanh(a x) + beta``, a
learnable scalar ``a`` (init ``alpha0`` = 0.5), per-channel ``gamma`` (init 1) and ``beta``
(init 0).

Mean field (components of a token jointly Gaussian, the ansatz of every layer here), at
scale ``s = a sqrt(q)`` and input cosine ``rho``, with ``K(s, rho) = E[tanh(h) tanh(h')]``
and ``J(s, rho) = E[tanh'(h) tanh'(h')]``, ``(h, h') ~ N(0, s^2 [[1, rho], [rho, 1]])``::

    forward    q' = gamma^2 K(s, 1),              p' = gamma^2 K(s, rho)
    backward   diag -> gamma^2 a^2 J(s, 1) diag,  off -> gamma^2 a^2 J(s, rho) off

The backward map is the elementwise Jacobian ``gamma a tanh'(a x)`` under gradient
independence (as one hidden layer of :class:`.mlp.MLP` without its weights); its factor is
``d p' / d p`` (Price's theorem). Unlike a normalization, DyT leaves the norm free: its
output has ``q' = gamma^2 K(s, 1) < gamma^2``, varying with the input norm.

The integrals take the split ``tanh = erf(KAPPA h) + rest(h)`` of
:mod:`phasefield.theory.smoothed`: the erf part in closed form, the localized remainder and
tanh' on the fixed-size local rules of :mod:`phasefield.theory.quadrature` (N_LOCAL nodes
per axis at any scale), so ``s`` may be traced (jit, vmap, no value-dependent shapes); a
custom JVP gives the rho-derivative by Price's theorem (``dK/drho = s^2 J``), finite at the
collapsed point rho = 1 where the rule's rotation angle arccos(rho) is not differentiable.
At rho = 1 (the collapsed geometry, half of a finite-depth run) the pair is the diagonal:
1-D rules (``lax.cond``), and the forward map returns the diagonal's own values, so p' = q'
to the bit (the collapsed geometry stays exactly invariant).

:class:`AnyNormMLP` is the tokenwise MLP whose maps hold at any input norm (the MLP of a
block whose branch reads DyT's output, whose q is not 1): the same network as
:class:`.mlp.MLP` with one hidden layer, its Gaussian integrals at the scale
``sigma_w sqrt(q)`` in closed form (gelu, erf, relu, linear) or by the split above (tanh).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import struct

from ..theory import quadrature, smoothed
from ..theory.mlp import arccos_j1
from . import gram
from .base import Layer
from .mlp import MLP, MLPModule
from .state import Grad, Kernel, as_float
from .weights import check_weights

ANY_NORM_ACTIVATIONS = ("gelu", "tanh", "erf", "relu", "linear")


# ---- Gaussian integrals of tanh at a traced scale -------------------------------------------


def _dtanh(x):
    return 1.0 - jnp.square(jnp.tanh(x))


def _d2tanh(x):
    t = jnp.tanh(x)
    return -2.0 * t * (1.0 - t * t)


# A finer spacing than the MLP tables' (quadrature.C_TABLE = 0.3, ~1e-10 on tanh'^2 at s ~ 1,
# where the poles of sech^2 at h = i pi / 2 set the trapezoid error): C_LOCAL = 0.2 puts it
# near 1e-16; N_LOCAL nodes cover |h| <= quadrature.R_LOCAL at any scale.
C_LOCAL = 0.2
N_LOCAL = 2 * int(math.ceil(quadrature.R_LOCAL / C_LOCAL)) + 1


def _expect_2d(pairs, s, theta):
    """E[f(h1) g(h2)] for each (f, g) in ``pairs`` (every f, g odd or even and localized,
    and f is g), cosine cos(theta): :func:`phasefield.theory.quadrature.expect_2d`'s rotated
    local rule at spacing C_LOCAL, folded in u and v."""
    a, b = jnp.cos(0.5 * theta), jnp.sin(0.5 * theta)
    u, wu = quadrature.trapezoid_axis(s * a, N_LOCAL, C_LOCAL, fold=True, local=True)
    v, wv = quadrature.trapezoid_axis(s * b, N_LOCAL, C_LOCAL, fold=True, local=True)
    x1 = s * (a * u[:, None] + b * v[None, :])
    x2 = s * (a * u[:, None] - b * v[None, :])
    out, cache = [], {}
    for f, g in pairs:
        f1 = cache.setdefault((id(f), 1), f(x1))
        g2 = cache.setdefault((id(g), 2), g(x2))
        out.append(wu @ (f1 * g2) @ wv)
    return tuple(out)


def _cross(s, rho):
    """E[rest(h1) erf(KAPPA h2)] by one 1-D rule (conditioning on h1, as
    :func:`phasefield.theory.quadrature.expect_2d_conditional`, at spacing C_LOCAL)."""
    x, w = quadrature.trapezoid_axis(s, N_LOCAL, C_LOCAL, local=True)
    c = s * jnp.sqrt(jnp.maximum(1.0 - rho * rho, 0.0))
    h1 = s * x
    return jnp.sum(w * smoothed.tanh_rest(h1) * smoothed.erf_given(rho * h1, c))


def _diag_rule(s):
    """(K, J) at rho = 1 (a scalar s): the same split by 1-D rules."""
    x, w = quadrature.trapezoid_axis(s, N_LOCAL, C_LOCAL, local=True)
    h = s * x
    rest = smoothed.tanh_rest(h)
    k = smoothed.erf_pair(s * s, 1.0) + 2.0 * _cross(s, 1.0) + jnp.sum(w * rest * rest)
    return k, jnp.sum(w * jnp.square(_dtanh(h)))


def _on_diagonal(rho, diag, pair):
    """``diag()`` at rho = 1 (the collapsed geometry: 1-D rules, N_LOCAL times less work
    than the 2-D rule on its line), else ``pair()`` (``lax.cond``: one is evaluated, both
    under ``vmap``)."""
    return jax.lax.cond(rho >= 1.0, diag, pair)


def _pair_rule(s, rho):
    """(K, J) at scale s and cosine rho (scalars): the split rule, differentiable in s."""
    rho = jnp.clip(rho, -1.0, 1.0)
    rest = smoothed.tanh_rest

    def pair():
        rr, dd = _expect_2d(((rest, rest), (_dtanh, _dtanh)), s, jnp.arccos(rho))
        return smoothed.erf_pair(s * s, rho) + 2.0 * _cross(s, rho) + rr, dd

    return _on_diagonal(rho, lambda: _diag_rule(s), pair)


def _d2_rule(s, rho):
    """E[tanh''(h) tanh''(h')] (scalars; rho clipped to [-1, 1])."""

    def diag():
        x, w = quadrature.trapezoid_axis(s, N_LOCAL, C_LOCAL, local=True)
        return jnp.sum(w * jnp.square(_d2tanh(s * x)))

    return _on_diagonal(rho, diag, lambda: _expect_2d(((_d2tanh, _d2tanh),), s, jnp.arccos(rho))[0])


@jax.custom_jvp
def _tanh_pair(s, rho):
    return _pair_rule(s, rho)


@_tanh_pair.defjvp
def _tanh_pair_jvp(primals, tangents):
    s, rho = primals
    ds, drho = tangents
    # the s-direction through the rule (rho held: no derivative of arccos(rho)); the
    # rho-direction by Price's theorem: dE[f f']/dcov = E[f' f'], cov = s^2 rho
    out, (dk_s, dj_s) = jax.jvp(lambda s_: _pair_rule(s_, rho), (s,), (ds,))
    d2 = _d2_rule(s, jnp.clip(rho, -1.0, 1.0))
    s2 = s * s
    return out, (dk_s + s2 * out[1] * drho, dj_s + s2 * d2 * drho)


def tanh_diag(s):
    """``tanh_pair(s, 1)``: ``(E[tanh(h)^2], E[tanh'(h)^2])``, ``h ~ N(0, s^2)``, by 1-D rules
    (the same split and spacing; the 2-D rule at rho = 1 spends N_LOCAL times the work on a
    line). Broadcasts over ``s``; differentiable in ``s``."""
    dt = jnp.result_type(float)
    return jnp.vectorize(_diag_rule)(jnp.asarray(s, dt))


def tanh_pair(s, rho):
    """``(E[tanh(h) tanh(h')], E[tanh'(h) tanh'(h')])``, ``(h, h') ~ N(0, s^2 [[1, rho],
    [rho, 1]])``: fixed-size rules at any (traced) scale ``s``; broadcasts over ``s`` and
    ``rho``. Within 1e-14 of a dense reference for s up to 30, rho in [-1, 1]
    (tests/test_dyt.py)."""
    dt = jnp.result_type(float)
    return jnp.vectorize(_tanh_pair)(jnp.asarray(s, dt), jnp.asarray(rho, dt))


def activation_pair(activation: str, s, rho):
    """``(E[phi(h) phi(h')], E[phi'(h) phi'(h')])`` at scale ``s`` (may be traced) and cosine
    ``rho``, for the activations with a closed form or the tanh split
    (:data:`ANY_NORM_ACTIVATIONS`)."""
    s2 = jnp.square(s)
    # clipped to [-1, 1] with slope 1 at and beyond the ends (jnp.clip's is 1/2 at them and
    # 0 beyond: the collapsed point rho = 1, which rounding may overshoot, is where the
    # angle rate differentiates these maps)
    rho = rho - jax.lax.stop_gradient(rho - jnp.clip(rho, -1.0, 1.0))
    if activation == "tanh":
        return tanh_pair(s, rho)
    if activation == "gelu":
        return smoothed.gelu_pair(s2, rho)
    if activation == "erf":
        den = 1.0 + 2.0 * s2
        return (
            (2 / math.pi) * jnp.arcsin(2 * s2 * rho / den),
            (4 / math.pi) / jnp.sqrt(den * den - 4 * s2 * s2 * rho * rho),
        )
    if activation == "relu":
        return s2 / 2 * arccos_j1(rho), (math.pi - jnp.arccos(rho)) / (2 * math.pi)
    if activation == "linear":
        return s2 * rho, jnp.ones_like(s2 * rho)
    raise ValueError(
        f"activation {activation!r} has no map at every input norm; choose one of {', '.join(ANY_NORM_ACTIVATIONS)}"
    )


# ---- the DyT layer --------------------------------------------------------------------------


@struct.dataclass
class DyT(Layer):
    """``gamma * tanh(a x) + beta`` (``beta`` = 0 at init); ``a`` and ``gamma`` are numbers
    (pytree leaves), the initial values of the network's parameters."""

    a: Any = 0.5
    gamma: Any = 1.0
    name: str | None = struct.field(pytree_node=False, default=None)  # its Flax module's (None: automatic)

    def _pairs(self, k):
        s = as_float(self.a) * jnp.sqrt(k.q)
        rho = k.rho
        k1, j1 = tanh_diag(jnp.broadcast_to(s, jnp.shape(rho)))
        kr, jr = tanh_pair(s, rho)
        # at rho = 1 the diagonal values themselves (p' = q' to the bit: the collapsed
        # geometry stays exactly invariant, however the compiler rounds the two routes),
        # with the pair's derivative in rho
        on = rho >= 1.0
        kr = jnp.where(on, kr + jax.lax.stop_gradient(k1 - kr), kr)
        jr = jnp.where(on, jr + jax.lax.stop_gradient(j1 - jr), jr)
        return k1, j1, kr, jr

    def forward(self, k, ctx):
        g2 = jnp.square(as_float(self.gamma))
        k1, _, kr, _ = self._pairs(k)
        return Kernel(g2 * k1, g2 * kr)

    def backward(self, k, g, ctx):
        c = jnp.square(as_float(self.gamma) * as_float(self.a))
        _, j1, _, jr = self._pairs(k)
        return Grad.from_diag_off(c * j1 * g.diag, c * jr * g.b)

    def gram_forward(self, c, ctx):
        return gram.tokenwise_forward(self, c, ctx)

    def gram_backward(self, c, g, ctx):
        return gram.tokenwise_backward(self, c, g, ctx)

    def module(self, weights="dense", causal=False, name=None):
        return DyTModule(self, weights=weights, name=name)


class DyTModule(nn.Module):
    """``gamma * tanh(a x) + beta``: with ``weights="dense"`` trainable parameters ``alpha``
    (the scalar a), ``weight`` (gamma, per channel) and ``bias`` (beta, per channel; the
    names of the paper's code), initialized at the layer's numbers and zero; with
    ``"lazy"`` (simulation) the same map at those initial values, no parameters."""

    layer: DyT
    weights: str = "dense"

    @nn.compact
    def __call__(self, x):
        check_weights(self.weights)
        lay = self.layer
        if self.weights == "lazy":
            a, gamma = jnp.asarray(lay.a, x.dtype), jnp.asarray(lay.gamma, x.dtype)
            return gamma * jnp.tanh(a * x)
        d = x.shape[-1]
        a = self.param("alpha", lambda key: jnp.asarray(lay.a, jnp.float32))
        gamma = self.param("weight", lambda key, shape: jnp.full(shape, lay.gamma, jnp.float32), (d,))
        beta = self.param("bias", nn.initializers.zeros, (d,), jnp.float32)
        dt = jnp.promote_types(x.dtype, jnp.float32)
        return (gamma.astype(dt) * jnp.tanh(a.astype(dt) * x) + beta.astype(dt)).astype(dt)


# ---- the MLP at any input norm --------------------------------------------------------------


@struct.dataclass
class AnyNormMLP(Layer):
    """``W_2 phi(W_1 x)`` (one hidden layer of width ``mult`` d, bias-free; W_1 of std
    ``sigma_w / sqrt(d)``, W_2 of fan-in scale ``sigma_out``, default sigma_w): the network of
    :class:`.mlp.MLP`, with maps at any input norm q and no tables::

        forward    q' = sigma_out^2 E[phi^2](s),  p' = sigma_out^2 E[phi phi'](s, rho),  s = sigma_w sqrt(q)
        backward   diag -> sigma_out^2 sigma_w^2 E[phi'^2](s) diag,  off -> ... E[phi' phi'](s, rho) off
    """

    sigma_w: Any = 1.0
    sigma_out: Any = None
    activation: str = struct.field(pytree_node=False, default="gelu")
    mult: float = struct.field(pytree_node=False, default=4.0)
    name: str | None = struct.field(pytree_node=False, default=None)

    def __post_init__(self):
        if self.activation not in ANY_NORM_ACTIVATIONS:
            raise ValueError(
                f"activation {self.activation!r} has no MLP map at every input norm; "
                f"choose one of {', '.join(ANY_NORM_ACTIVATIONS)}"
            )

    def _out2(self):
        return jnp.square(as_float(self.sigma_w if self.sigma_out is None else self.sigma_out))

    def _pairs(self, k):
        s = as_float(self.sigma_w) * jnp.sqrt(k.q)
        rho = k.rho
        e1, d1 = activation_pair(self.activation, s, jnp.ones_like(rho))
        er, dr = activation_pair(self.activation, s, rho)
        return e1, d1, er, dr

    def forward(self, k, ctx):
        c = self._out2()
        e1, _, er, _ = self._pairs(k)
        return Kernel(c * e1, c * er)

    def backward(self, k, g, ctx):
        c = self._out2() * jnp.square(as_float(self.sigma_w))
        _, d1, _, dr = self._pairs(k)
        return Grad.from_diag_off(c * d1 * g.diag, c * dr * g.b)

    def gram_forward(self, c, ctx):
        return gram.tokenwise_forward(self, c, ctx)

    def gram_backward(self, c, g, ctx):
        return gram.tokenwise_backward(self, c, g, ctx)

    def as_mlp(self) -> MLP:
        """The same network as an :class:`.mlp.MLP` (whose module this layer's is)."""
        return MLP(
            sigma_w=self.sigma_w,
            activation=self.activation,
            layers=1,
            mult=self.mult,
            sigma_out=self.sigma_out,
            name=self.name,
        )

    def module(self, weights="dense", causal=False, name=None):
        return MLPModule(self.as_mlp(), weights=weights, name=name)
