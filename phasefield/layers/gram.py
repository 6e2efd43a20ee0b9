"""The full-Gram mean field of any block (docs/theory.md §8, "Gram maps of the layers"): the
whole n x n token Gram ``C`` forward and the gradient Gram ``G`` backward, through each
layer's own Gram maps (:mod:`.base`'s protocol)::

    layer.gram_forward(c, ctx)      -> C'   the Gram of its output, input Gram c [n, n]
    layer.gram_backward(c, g, ctx)  -> G    the gradient Gram at its input, given the one
                                            at its output g [n, n], input Gram c

A causal attention (its static field ``causal``, :func:`.base.masked`) attends to the keys
j <= i. ``n`` is the (static) size of ``c``; ``ctx.n_tokens`` is not read. With a permutation-symmetric input ``C = (q - p) I +
p 11^T`` and no mask the Gram maps are the (q, p) maps (paper-mode attention: to rounding;
exact-softmax attention and the softmax path average fixed Monte-Carlo attention samples
here, so to their sampling error; tests/test_gram_layers.py).

The helpers of the layers' Gram maps are here too: :func:`cosines`, :func:`causal_mask`, and
the tokenwise route (:func:`tokenwise_forward`, :func:`tokenwise_backward`), which evaluates
a tokenwise layer's own (q, p) maps on every pair (i, k) at once. The functions are pure in
``(block, ctx, ...)`` (numbers are pytree leaves: one compiled program per block structure,
depth and n); the float64 entry points :func:`grams` and :func:`gram_gradient` prepare the
block and jit-compile once per structure.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..theory.precision import float64
from .base import masked
from .state import Context, Grad, Kernel


def cosines(c):
    """Cosine matrix of a Gram matrix (unit diagonal; not clipped, so derivatives at the
    collapsed point R = 11^T are those of the smooth formula)."""
    d = jnp.sqrt(jnp.diagonal(c, axis1=-2, axis2=-1))
    r = c / (d[..., :, None] * d[..., None, :])
    eye = jnp.eye(c.shape[-1], dtype=bool)
    return jnp.where(eye, 1.0, r)


def causal_mask(n: int, causal: bool) -> np.ndarray:
    """Allowed (query, key) pairs: lower triangle with the diagonal, or everything."""
    return np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)


def symmetric_gram(n: int, q, p):
    """C = (q - p) I + p 11^T (traced numbers allowed)."""
    dt = jnp.result_type(float)
    q, p = jnp.asarray(q, dt), jnp.asarray(p, dt)
    return (q - p) * jnp.eye(n, dtype=dt) + p * jnp.ones((n, n), dt)


def equal_norms(c):
    """[n, n]: whether tokens i and k have the same squared norm (C_ii == C_kk)."""
    q = jnp.diagonal(c, axis1=-2, axis2=-1)
    return q[..., :, None] == q[..., None, :]


def pair_kernel(c) -> Kernel:
    """Every pair (i, k) as a (q, p) state [n, n]: ``q = sqrt(C_ii C_kk)`` (= C_ii where the
    norms are equal: sqrt(x * x) is x in floating point), ``p = C_ik`` off the diagonal and
    0 on it (a diagonal entry reads only the maps' q, which no tokenwise map takes from p;
    rho = 0 there keeps the maps' rho = 1 end, and its derivatives, out of the diagonal)."""
    q = jnp.diagonal(c, axis1=-2, axis2=-1)
    eye = jnp.eye(c.shape[-1], dtype=bool)
    return Kernel(jnp.sqrt(q[..., :, None] * q[..., None, :]), jnp.where(eye, 0.0, c))


def tokenwise_forward(layer, c, ctx, equal_only: bool = True):
    """C' of a tokenwise layer (norm, MLP, GLU, DyT: each output token a function of its own
    input token) from its (q, p) map on every pair: ``C'_ii = forward(C_ii, .).q``,
    ``C'_ik = forward(k_ik).p`` with :func:`pair_kernel`'s ``k_ik``. That map holds for two
    tokens of equal norm; ``equal_only``: NaN where ``C_ii != C_kk`` (a layer whose map at
    unequal norms is another integral); a layer whose map is exact at the geometric mean
    norm (a normalization) passes False."""
    out = layer.forward(pair_kernel(c), ctx)
    eye = jnp.eye(c.shape[-1], dtype=bool)
    res = jnp.where(eye, out.q, out.p)
    return jnp.where(equal_norms(c), res, jnp.nan) if equal_only else res


def tokenwise_backward(layer, c, g, ctx, equal_only: bool = True):
    """G at the input of a tokenwise layer: its backward map on every pair, entry by entry
    (a tokenwise layer's gradient Gram map is a Hadamard product: G_ik -> f_ik G_ik, its
    (q, p) map's diagonal factor on the diagonal and off-diagonal factor off it), at
    :func:`pair_kernel`'s states; ``equal_only`` as :func:`tokenwise_forward`."""
    out = layer.backward(pair_kernel(c), Grad(jnp.zeros_like(g), g), ctx)
    eye = jnp.eye(c.shape[-1], dtype=bool)
    res = jnp.where(eye, out.diag, out.b)
    return jnp.where(equal_norms(c), res, jnp.nan) if equal_only else res


# ---- a stack of blocks ---------------------------------------------------------------------


def forward_grams(block, ctx, c0, depth: int):
    """Grams [depth + 1, n, n] through ``depth`` blocks (index 0: ``c0``)."""

    def step(c, _):
        c1 = block.gram_forward(c, ctx)
        return c1, c1

    c0 = jnp.asarray(c0, jnp.result_type(float))
    _, cs = jax.lax.scan(step, c0, None, length=depth)
    return jnp.concatenate([c0[None], cs])


def backward_grams(block, ctx, cs):
    """``(lambda_g, gs)`` along the forward Grams ``cs`` [L + 1, n, n] of
    :func:`forward_grams`: the gradient Gram ``G = I`` at the output backpropagated through
    the L blocks, rescaled to ``tr G / n = 1`` after each (``gs`` [L], index l: at block
    l's input), and ``lambda_g(L) = (1/L) log(tr G_0 / n)`` (docs/theory.md §7)."""
    n = cs.shape[-1]
    depth = cs.shape[0] - 1

    def step(carry, c):
        g, log_scale = carry
        g = block.gram_backward(c, g, ctx)
        s = jnp.trace(g) / n
        return (g / s, log_scale + jnp.log(s)), g / s

    g0 = jnp.eye(n, dtype=cs.dtype)
    (_, log_total), gs = jax.lax.scan(step, (g0, jnp.zeros((), cs.dtype)), cs[:-1], reverse=True)
    return log_total / depth, gs


def forward_adjoint(block, ctx, c0, x0, depth: int):
    """``(C_L, log <x0, G_0>)``: the Gram after ``depth`` blocks from ``c0``, and the log of
    ``<x0, G_0>`` (Frobenius) for the gradient Gram ``G_L = I`` at the output backpropagated
    to the input, in one forward pass: ``<x0, B_1(...B_L(I))> = tr(B_L^T(...B_1^T(x0)))``
    with each block's adjoint at its input Gram (:meth:`.base.Layer.gram_step`), ``x``
    rescaled to unit trace after each block. ``x0 = e_i e_i^T`` gives ``log G_0[i, i]``,
    token i's own squared gradient: what :func:`backward_grams` gives, without storing the
    forward Grams or drawing a layer's fields twice."""

    def step(carry, _):
        c, x, log_scale = carry
        c, x = block.gram_step(c, x, ctx)
        s = jnp.trace(x)
        return (c, x / s, log_scale + jnp.log(s)), None

    dt = jnp.result_type(float)
    c0, x0 = jnp.asarray(c0, dt), jnp.asarray(x0, dt)
    s0 = jnp.trace(x0)
    (c_l, _, log_total), _ = jax.lax.scan(step, (c0, x0 / s0, jnp.log(s0)), None, length=depth)
    return c_l, log_total


@functools.cache
def _compiled(name: str):
    fn = {
        "forward": forward_grams,
        "gradient": lambda b, x, c0, depth: backward_grams(b, x, forward_grams(b, x, c0, depth)),
    }
    return jax.jit(fn[name], static_argnames=("depth",))


def prepare_kernels(layer, ctx):
    """``layer`` with the tables its Gram maps read built (the Gaussian-integral kernels of
    the layers that have one, :meth:`.base.Layer.kernel_scale`); the attention's logit
    tables serve its (q, p) maps only and are not built."""
    if layer.children():
        return layer.map_children(lambda child: prepare_kernels(child, ctx))
    return layer.prepare(ctx) if layer.kernel_scale() is not None else layer


def _prepared(block, c0, causal: bool | None):
    if causal is not None:
        block = masked(block, bool(causal))
    c0 = jnp.asarray(c0, jnp.result_type(float))
    n = c0.shape[-1]
    return prepare_kernels(block, Context(n)), Context(jnp.asarray(n, c0.dtype)), c0


@float64
def grams(block, c0, depth: int = 16, causal: bool | None = None):
    """Grams [depth + 1, n, n] of ``block`` stacked ``depth`` times from ``c0`` [n, n]
    (float64; compiled once per block structure, n, depth and mask). ``causal``: every
    attention masked (True) or not (False); None: as the block's layers say."""
    block, ctx, c0 = _prepared(block, c0, causal)
    return _compiled("forward")(block, ctx, c0, depth=int(depth))


@float64
def gram_gradient(block, c0, depth: int = 16, causal: bool | None = None):
    """``(lambda_g, gs)`` of :func:`backward_grams` from ``c0`` through ``depth`` blocks
    (float64; compiled once per block structure, n, depth and mask; ``causal`` as
    :func:`grams`)."""
    block, ctx, c0 = _prepared(block, c0, causal)
    return _compiled("gradient")(block, ctx, c0, depth=int(depth))
