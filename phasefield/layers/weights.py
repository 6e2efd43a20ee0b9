"""The weights of every layer's network, and the paper's normalization.

``weights="dense"``  trainable ``nn.Dense`` layers (the ViT; the simulator's reference path).
``weights="lazy"``   lazily sampled i.i.d. Gaussian maps for simulation (:func:`random_linear`):
                     no parameters; the randomness comes from the ``"lazy"`` rng stream
                     (``module.apply({}, x, rngs={"lazy": key})``). Exact in distribution,
                     including one vector-Jacobian product per draw, at O(n^2 d) per block
                     instead of O(n d^2) and n d random numbers per map instead of d^2.

Every layer module builds its linear maps with :func:`linear` (one call per input: the lazy
maps on one input share its token basis).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn


def normalize(x, eps: float = 0.0):
    """LN(x) = sqrt(d) x / |x| over the last axis."""
    d = x.shape[-1]
    sq = jnp.sum(jnp.square(x), axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(sq / d + eps)


def _normal(std):
    def init(key, shape, dtype=jnp.float32):
        return jax.random.normal(key, shape, dtype) * jnp.asarray(std, dtype)

    return init


WEIGHTS = ("dense", "lazy")
LAZY_RNG = "lazy"


def check_weights(weights):
    """ValueError unless ``weights`` is one of :data:`WEIGHTS`."""
    if weights not in WEIGHTS:
        raise ValueError(f"unknown weights {weights!r}; choose one of {', '.join(WEIGHTS)}")


# ---------------------------------------------------------------- lazily sampled maps
# A Gaussian map W (d_in x d_out, i.i.d. N(0, s^2)) is used once forward, Y = X W, and
# once backward, U W^T. With Q (d_in x N) an orthonormal basis of the tokens' span (zero
# columns allowed, see token_basis):
#   W = Q S + (I - Q Q^T) W,   S = Q^T W: i.i.d. N(0, s^2), independent of the rest
#   (rotation invariance, given X), so Y = (X Q) S; and since U depends on W only through
#   Y, U W^T = U S^T Q^T + [(I - Q Q^T) G B^T]^T with G: d_in x N standard normal and
#   B B^T = C = s^2 U U^T (cotangent_root) -- an exact draw of the part of W the forward
#   never touched.
# Several maps on the same X (W_Q, W_K, W_V) share the basis; their untouched parts are
# independent, so their summed backward terms are one draw with C = sum_j s_j^2 U_j U_j^T.
#
# Q must be a *stable* function of X. An unpivoted Householder QR of rank-deficient X
# (identical tokens: the lambda_g protocol's collapsed input) completes Q with directions
# set by rounding noise, and S's rows along them enter the VJP with O(1) weight: the draw
# then depends on rounding (the same keys gave different numbers in a vmapped sweep and at
# a single point), and R's rounding-level rows made identical tokens drift apart. token_basis
# orthogonalizes the tokens in order (classical Gram-Schmidt, twice) and keeps token i's
# direction only if its residual exceeds RANK_TOL sqrt(d_in) eps |x_i| -- below that the
# residual's direction is mostly rounding noise (its rounding error is ~ sqrt(d_in) eps
# |x_i|) --; a dropped direction gets a zero column in Q, its part of W is drawn in the VJP's
# noise term, and the forward Y = (X Q) S omits X's (rounding-level) component along it.
# Identical tokens give identical rows of X Q, so a collapsed input stays collapsed.
RANK_TOL = 32.0


def token_basis(x):
    """Orthonormal-or-zero basis ``Q`` ``[d_in, N]`` of the span of the tokens ``x``
    (``[N, d_in]``), built in token order: column i is zero when token i lies in the span of
    tokens < i up to ``RANK_TOL sqrt(d_in)`` machine epsilons (relative to its norm), else the
    normalized residual. ``Q Q^T`` projects onto the (numerical) span of the tokens."""
    n, d_in = x.shape
    tol = RANK_TOL * jnp.sqrt(jnp.asarray(d_in, x.dtype)) * jnp.finfo(x.dtype).eps

    def step(i, q):
        c0 = x[i]
        c = c0 - q @ (q.T @ c0)
        c = c - q @ (q.T @ c)  # second pass: orthogonal to working precision
        nu = jnp.linalg.norm(c)
        keep = nu > tol * jnp.linalg.norm(c0)
        return q.at[:, i].set(jnp.where(keep, c / jnp.where(keep, nu, 1.0), 0.0))

    return jax.lax.fori_loop(0, n, step, jnp.zeros((d_in, n), x.dtype))


def cotangent_root(cts, scales):
    """``B`` ``[N, N]`` with ``B B^T = C = sum_j s_j^2 U_j U_j^T`` (up to rounding), taken
    as ``V^T``-coordinates of the rows of ``U = [s_1 U_1, ..., s_m U_m]`` in the
    :func:`token_basis` of those rows: ``B = U V``. Not the symmetric root ``C^{1/2}``,
    whose eigendecomposition of the squared matrix turns rounding (eps) in C into sqrt(eps)
    in the root where C is (nearly) singular -- at collapsed tokens the attention maps'
    cotangents have identical rows -- so the noise would depend on rounding at the 1e-3
    level in float32; B's rounding error stays at eps, and B is stable at rank deficiency."""
    u = jnp.concatenate([s * c for s, c in zip(scales, cts)], axis=-1)
    return u @ token_basis(u)


def _project(xq, scales, draws):
    return tuple(s * (xq @ w) for s, w in zip(scales, draws))


@jax.custom_vjp
def random_linear(x, scales, draws, noise):
    """``(x W_1, ..., x W_m)`` for independent Gaussian ``W_j`` (d_in x d_out_j, entries
    N(0, scales[j]^2)), sampled lazily: exact in distribution, together with one VJP.

    x       ``[N, d_in]`` (all N tokens that see the same W)
    scales  tuple of m scalars (the standard deviations s_j)
    draws   tuple of m standard-normal arrays ``[N, d_out_j]`` (the slabs S_j; row i is
            used only where :func:`token_basis` keeps token i's direction)
    noise   a standard-normal ``[d_in, N]`` array (G; used only by the VJP)

    The VJP with respect to ``x`` is ``sum_j s_j U_j S_j^T Q^T + [(I - QQ^T) G B^T]^T``,
    ``B B^T = C = sum_j s_j^2 U_j U_j^T`` (:func:`cotangent_root`): a fresh exact draw of the part of the W_j the forward did
    not touch, so it is *not* linear in the cotangents -- one VJP per draw (as in the
    lambda_g protocol); full Jacobians (``jacrev``) need ``weights="dense"``. The VJP of
    ``scales`` is exact (``sum U_j * Y_j / s_j``); ``draws`` and ``noise`` get zero.
    """
    return _project(x @ token_basis(x), scales, draws)


def _random_linear_fwd(x, scales, draws, noise):
    q = token_basis(x)  # d_in x N, orthonormal or zero columns
    xq = x @ q  # N x N, (numerically) upper triangular: R^T of x^T = Q R
    return _project(xq, scales, draws), (q, xq, scales, draws, noise)


def _random_linear_bwd(res, cts):
    q, xq, scales, draws, noise = res
    m = sum(s * (u @ w.T) for s, u, w in zip(scales, cts, draws))  # N x N
    # the untouched part: (I - QQ^T) G B^T (zero when Q spans all d_in directions)
    pg = noise - q @ (q.T @ noise)  # (I - QQ^T) G
    dx = m @ q.T + cotangent_root(cts, scales) @ pg.T
    dscales = tuple(jnp.sum((xq.T @ u) * w).astype(jnp.result_type(s)) for s, u, w in zip(scales, cts, draws))
    return (dx, dscales, tuple(jnp.zeros_like(w) for w in draws), jnp.zeros_like(noise))


random_linear.defvjp(_random_linear_fwd, _random_linear_bwd)


class RandomLinear(nn.Module):
    """Lazily sampled Gaussian linear maps ``x -> (x W_1, ..., x W_m)`` sharing one input
    (:func:`random_linear`); ``W_j`` has ``features[j]`` columns and entries
    N(0, ``stds[j]``^2). No parameters: S and G come from the ``"lazy"`` rng stream (standard
    normals, so points vmapped with the same key share them). All leading axes of ``x``
    are one token set seeing the same W (as a dense layer would)."""

    features: Sequence[int]
    stds: Sequence[Any]

    @nn.compact
    def __call__(self, x):
        *batch, d_in = x.shape
        x2 = x.reshape(-1, d_in)
        n = x2.shape[0]
        keys = jax.random.split(self.make_rng(LAZY_RNG), len(self.features) + 1)
        draws = tuple(jax.random.normal(kk, (n, f), x.dtype) for kk, f in zip(keys[1:], self.features))
        noise = jax.random.normal(keys[0], (d_in, n), x.dtype)
        scales = tuple(jnp.asarray(s, x.dtype) for s in self.stds)
        ys = random_linear(x2, scales, draws, noise)
        return tuple(y.reshape(*batch, f) for y, f in zip(ys, self.features))


def linear(weights, features, stds, names):
    """The block's linear layers on one input: trainable ``nn.Dense`` (named ``names``,
    the ViT's parameters) or one lazily sampled :class:`RandomLinear`."""
    check_weights(weights)
    if weights == "lazy":
        return RandomLinear(tuple(features), tuple(stds), name="lazy_" + "_".join(names))
    layers = [nn.Dense(f, use_bias=False, kernel_init=_normal(s), name=nm) for f, s, nm in zip(features, stds, names)]
    return lambda x: tuple(layer(x) for layer in layers)
