"""Rank collapse and query/key gradients (Noci et al. 2022; seeds 000 and 003).

A single-head attention layer without normalization,

    S = A X W_V,   A = softmax( tau X W_Q (X W_K)^T / sqrt(d_k) ),

with X in R^{n x d_v}, W_Q, W_K in R^{d_v x d_k} (entry variances sigma_q^2, sigma_k^2) and
W_V in R^{d_v x d_v} (variance sigma_v^2). The paper's Assumption 3.1 replaces A by the
uniform matrix 11^T/n and dA/dM by its value at M = 0. ``attention(..., mode="uniform")``
realises exactly that inside autodiff: the logits are ``M - stop_gradient(M)`` (value 0,
derivative that of M), so the forward pass is uniform attention and every Jacobian is the
paper's linearisation. ``mode="softmax"`` is the real layer.

Formulas (all pure float64 functions of their arguments):

* Eq. 6   ``value_grad_sq``      E||dS/dW_V||^2 = d_v n |x_bar|^2 (exact given X, uniform A)
* Eq. 7   ``query_grad_sq``      E||dS/dW_Q||^2 = s_v^2 s_k^2 d_v / n^2 ||X||^2 ||X^T X - n x_bar x_bar^T||^2
* Eq. 8   ``input_grad_sq_bound`` the paper's bound on E||dS/dX||^2, as printed, and
          ``input_grad_sq_exact`` the exact expectation derived here (docs/seeds.md): the
          printed prefactor d_k d_v should read d_v^2, and the second (commutation) term
          is s_q^2 s_k^2 s_v^2 d_v^2 ||X||^2 tr(X^T L X) / n^2, not equal to the first, so
          the printed bound can fail for correlated tokens with a large mean.
* Eq. 17  ``value_grad_gaussian``  sigma_x^2 d^2 (1 + rho (n-1))
* Eq. 18  ``query_grad_gaussian``  sigma_x^6 ((n-1)/n) (1-rho)^2 d (n+d); with ``exact=True``
          the norm/correlation independence assumption is dropped (Wishart moments), which
          multiplies it by 1 + 4 (1-rho) / (n d).
* Eq. 47  ``temperature``        tau equalising the two.
* Lemmas 3.2-3.3, Thm 3.3  ``forward_moments`` / ``forward_closed_form`` / ``depth_limit``
  for C(X) = n^2 |x_bar|^2 and ||X||_F^2 with per-layer residual scales (alpha1_l, alpha2_l).
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..theory.precision import float64

MODES = ("uniform", "softmax")


# --------------------------------------------------------------------------------------
# closed forms given X
# --------------------------------------------------------------------------------------
def _f64(x):
    return jnp.asarray(x, jnp.float64)


@float64
def mean_token(X):
    return jnp.mean(_f64(X), axis=-2)


@float64
def centered_gram(X):
    """X^T L X = X^T X - n x_bar x_bar^T (d_v x d_v), L = I - 11^T/n."""
    X = _f64(X)
    xc = X - jnp.mean(X, axis=-2, keepdims=True)
    return jnp.swapaxes(xc, -1, -2) @ xc


@float64
def C_of(X):
    """C(X) = sum_{k,k'} <X_k, X_k'> = n^2 |x_bar|^2."""
    X = _f64(X)
    return jnp.sum(jnp.square(jnp.sum(X, axis=-2)), axis=-1)


@float64
def frob2(X):
    return jnp.sum(jnp.square(_f64(X)), axis=(-2, -1))


@float64
def value_grad_sq(X):
    """Lemma 3.1 Eq. 6 (exact under uniform attention): d_v n |x_bar|^2."""
    n, d = X.shape[-2], X.shape[-1]
    return d * n * jnp.sum(jnp.square(mean_token(X)), axis=-1)


@float64
def query_grad_sq(X, sigma_v2=None, sigma_k2=None, d_k=None):
    """Lemma 3.1 Eq. 7: E_{W_K, W_V} ||dS/dW_Q||_F^2 given X (uniform attention).

    Defaults are the paper's init, sigma_v^2 = 1/d_v, sigma_k^2 = 1/d_k (d_k = d_v)."""
    n, d = X.shape[-2], X.shape[-1]
    d_k = d if d_k is None else d_k
    sigma_v2 = 1.0 / d if sigma_v2 is None else sigma_v2
    sigma_k2 = 1.0 / d_k if sigma_k2 is None else sigma_k2
    B = centered_gram(X)
    return sigma_v2 * sigma_k2 * d / n**2 * frob2(X) * jnp.sum(B * B, axis=(-2, -1))


def _scales(X, sigma_q2, sigma_k2, sigma_v2, d_k):
    """n, d and the default weight variances (1/d_k for queries and keys, 1/d for values)."""
    n, d = X.shape[-2], X.shape[-1]
    d_k = d if d_k is None else d_k
    return (
        n,
        d,
        d_k,
        1.0 / d_k if sigma_q2 is None else sigma_q2,
        1.0 / d_k if sigma_k2 is None else sigma_k2,
        1.0 / d if sigma_v2 is None else sigma_v2,
    )


@float64
def input_grad_sq_bound(X, sigma_q2=None, sigma_k2=None, sigma_v2=None, d_k=None):
    """Lemma 3.1 Eq. 8 as printed: 8 s_q^2 s_k^2 s_v^2 d_k d_v / n ||X^T L X||^2 + 2 d_v^2 s_v^2."""
    n, d, d_k, sigma_q2, sigma_k2, sigma_v2 = _scales(X, sigma_q2, sigma_k2, sigma_v2, d_k)
    B = centered_gram(X)
    return 8 * sigma_q2 * sigma_k2 * sigma_v2 * d_k * d / n * jnp.sum(B * B, axis=(-2, -1)) + 2 * d**2 * sigma_v2


@float64
def input_grad_terms(X, sigma_q2=None, sigma_k2=None, sigma_v2=None, d_k=None):
    """Exact E_W ||A_1||^2, E||A_2||^2, 2 E<A_1, A_2>, E||A_3||^2 of the paper's split
    dS/dX = A_1 + A_2 + A_3 (uniform attention). Derived in docs/seeds.md."""
    n, d, d_k, sigma_q2, sigma_k2, sigma_v2 = _scales(X, sigma_q2, sigma_k2, sigma_v2, d_k)
    B = centered_gram(X)
    b2 = jnp.sum(B * B, axis=(-2, -1))
    trb = jnp.trace(B, axis1=-2, axis2=-1)
    s = sigma_q2 * sigma_k2 * sigma_v2
    return dict(
        A1=s * d**2 * b2 / n,
        A2=s * d**2 * frob2(X) * trb / n**2,
        cross=2 * s * d * b2 / n**2,
        A3=jnp.broadcast_to(sigma_v2 * d**2, b2.shape),
    )


@float64
def input_grad_sq_exact(X, sigma_q2=None, sigma_k2=None, sigma_v2=None, d_k=None):
    """Exact E_W ||dS/dX||_F^2 under uniform attention (derived; replaces Eq. 8)."""
    t = input_grad_terms(X, sigma_q2, sigma_k2, sigma_v2, d_k)
    return t["A1"] + t["A2"] + t["cross"] + t["A3"]


@float64
def input_grad_sq_bound_corrected(X, sigma_q2=None, sigma_k2=None, sigma_v2=None, d_k=None):
    """The paper's triangle-inequality bound 4E||A1||^2 + 4E||A2||^2 + 2E||A3||^2 with the
    correct term values (always >= the exact value)."""
    t = input_grad_terms(X, sigma_q2, sigma_k2, sigma_v2, d_k)
    return 4 * t["A1"] + 4 * t["A2"] + 2 * t["A3"]


# --------------------------------------------------------------------------------------
# Gaussian tokens with cosine rho (Section 3.3, App. A.2)
# --------------------------------------------------------------------------------------
@float64
def value_grad_gaussian(sigma_x, rho, n, d):
    """Eq. 17: E||dS/dW_V||^2 = sigma_x^2 d^2 (1 + rho (n-1))."""
    sigma_x, rho = _f64(sigma_x), _f64(rho)
    return sigma_x**2 * d**2 * (1 + rho * (n - 1))


@float64
def query_grad_gaussian(sigma_x, rho, n, d, exact=False, tau=1.0):
    """Eq. 18 (tau^2 times it: Eq. 46): sigma_x^6 ((n-1)/n) (1-rho)^2 d (n+d).

    ``exact=True`` drops the paper's assumption that ||X||^2 and ||X^T L X||^2 are
    uncorrelated: with lam_perp = sigma_x^2 (1-rho), m = n-1, W = Wishart_m(d),
    E[tr W tr W^2] = (dm + 4) E[tr W^2], giving the factor 1 + 4 (1-rho) / (n d)."""
    sigma_x, rho, tau = _f64(sigma_x), _f64(rho), _f64(tau)
    base = tau**2 * sigma_x**6 * (n - 1) / n * (1 - rho) ** 2 * d * (n + d)
    if exact:
        base = base * (1 + 4 * (1 - rho) / (n * d))
    return base


@float64
def grad_ratio(sigma_x, rho, n, d, exact=False, tau=1.0):
    """E||dS/dW_Q||^2 / E||dS/dW_V||^2 = sigma_x^4 (n-1)(1-rho)^2 (n+d) / (n d (1+rho(n-1)))."""
    return query_grad_gaussian(sigma_x, rho, n, d, exact, tau) / value_grad_gaussian(sigma_x, rho, n, d)


@float64
def temperature(sigma_x, rho, n, d):
    """Eq. 47: tau^2 = d n (1 + rho (n-1)) / (sigma_x^4 (1-rho)^2 (n+d) (n-1))."""
    sigma_x, rho = _f64(sigma_x), _f64(rho)
    return jnp.sqrt(d * n * (1 + rho * (n - 1)) / (sigma_x**4 * (1 - rho) ** 2 * (n + d) * (n - 1)))


@float64
def gaussian_tokens(key, n, d, sigma_x=1.0, rho=0.0, shape=()):
    """Tokens with E[X_ij X_i'j] = sigma_x^2 (delta_ii' + rho (1 - delta_ii')), dims independent."""
    k1, k2 = jax.random.split(key)
    g = jax.random.normal(k1, (*shape, 1, d), jnp.float64)
    e = jax.random.normal(k2, (*shape, n, d), jnp.float64)
    return sigma_x * (jnp.sqrt(rho) * g + jnp.sqrt(1.0 - rho) * e)


# --------------------------------------------------------------------------------------
# forward recursions (Lemmas 3.2-3.3, Theorem 3.3)
# --------------------------------------------------------------------------------------
@float64
def forward_moments(C0, F0, n, alpha1, alpha2, depth=None):
    """E C(X^l) and E||X^l||_F^2 for l = 0..L (linear MLP, uniform attention, no LN).

    alpha1, alpha2: scalars or per-layer arrays of length L. Recursion (App. A.3):
    C' = (1+a2^2)(1+a1^2) C,   F' = (1+a2^2)(a1^2 C / n + F)."""
    a1 = jnp.atleast_1d(_f64(alpha1))
    a2 = jnp.atleast_1d(_f64(alpha2))
    L = int(depth) if depth is not None else max(a1.shape[0], a2.shape[0])
    a1 = jnp.broadcast_to(a1, (L,)) if a1.shape[0] == 1 else a1
    a2 = jnp.broadcast_to(a2, (L,)) if a2.shape[0] == 1 else a2

    def step(carry, a):
        C, F = carry
        b1, b2 = a[0] ** 2, a[1] ** 2
        Cn = (1 + b2) * (1 + b1) * C
        Fn = (1 + b2) * (b1 * C / n + F)
        return (Cn, Fn), (Cn, Fn)

    (_, _), (Cs, Fs) = lax.scan(step, (_f64(C0), _f64(F0)), jnp.stack([a1, a2], axis=1))
    return jnp.concatenate([_f64(C0)[None], Cs]), jnp.concatenate([_f64(F0)[None], Fs])


@float64
def forward_closed_form(C0, F0, n, alpha1, alpha2, L):
    """Eqs. 10 and 12 for constant alphas."""
    b1, b2 = _f64(alpha1) ** 2, _f64(alpha2) ** 2
    C = (1 + b2) ** L * (1 + b1) ** L * C0
    geo = jnp.where(b1 > 0, ((1 + b1) ** L - 1) / jnp.where(b1 > 0, b1, 1.0), float(L))
    F = n * (1 + b2) ** L * b1 * geo * (C0 / n**2) + (1 + b2) ** L * F0
    return C, F


@float64
def correlation(C, F, n):
    """Average token correlation (Thm 3.3 proof): rho = C / ((n-1) F) - 1/(n-1)."""
    return C / ((n - 1) * F) - 1.0 / (n - 1)


@float64
def depth_limit(C0, F0, n, alpha1_t, alpha2_t):
    """L -> infinity with alpha_i^2 = alpha_i~ / L: Eqs. 11, 13, 15. Returns (C, F, rho)."""
    a1, a2 = _f64(alpha1_t), _f64(alpha2_t)
    C = jnp.exp(a1 + a2) * C0
    F = jnp.exp(a2) * (jnp.expm1(a1) * C0 / n + F0)
    rho = n * jnp.exp(a1) * C0 / ((n - 1) * (jnp.expm1(a1) * C0 + n * F0)) - 1.0 / (n - 1)
    return C, F, rho


# --------------------------------------------------------------------------------------
# random blocks (autodiff checks)
# --------------------------------------------------------------------------------------
@float64
def attention(X, WQ, WK, WV, tau=1.0, mode="softmax"):
    """S = softmax(tau X W_Q (X W_K)^T / sqrt(d_k)) X W_V; mode 'uniform' = Assumption 3.1."""
    d_k = WQ.shape[-1]
    M = tau * (X @ WQ) @ jnp.swapaxes(X @ WK, -1, -2) / jnp.sqrt(d_k)
    if mode == "uniform":
        M = M - lax.stop_gradient(M)
    elif mode != "softmax":
        raise ValueError(f"unknown attention mode {mode!r}; choose one of {', '.join(MODES)}")
    return jax.nn.softmax(M, axis=-1) @ X @ WV


@float64
def draw_weights(key, d_v, d_k, sigma_q2=None, sigma_k2=None, sigma_v2=None):
    sigma_q2 = 1.0 / d_k if sigma_q2 is None else sigma_q2
    sigma_k2 = 1.0 / d_k if sigma_k2 is None else sigma_k2
    sigma_v2 = 1.0 / d_v if sigma_v2 is None else sigma_v2
    kq, kk, kv = jax.random.split(key, 3)
    return (
        jax.random.normal(kq, (d_v, d_k), jnp.float64) * jnp.sqrt(sigma_q2),
        jax.random.normal(kk, (d_v, d_k), jnp.float64) * jnp.sqrt(sigma_k2),
        jax.random.normal(kv, (d_v, d_v), jnp.float64) * jnp.sqrt(sigma_v2),
    )


def _sq(t):
    return jnp.sum(jnp.square(t))


@float64
def gradient_norms(X, W, tau=1.0, mode="softmax"):
    """Squared Frobenius norms of the Jacobians of S w.r.t. W_V, W_Q, W_K and X (autodiff)."""
    WQ, WK, WV = W
    f = partial(attention, tau=tau, mode=mode)
    return dict(
        value=_sq(jax.jacrev(lambda w: f(X, WQ, WK, w))(WV)),
        query=_sq(jax.jacrev(lambda w: f(X, w, WK, WV))(WQ)),
        key=_sq(jax.jacrev(lambda w: f(X, WQ, w, WV))(WK)),
        input=_sq(jax.jacrev(lambda x: f(x, WQ, WK, WV))(X)),
    )


@float64
def input_grad_split(X, W, tau=1.0, mode="softmax"):
    """||A_1||^2, ||A_2||^2, ||A_3||^2 of dS/dX = A_1 + A_2 + A_3 by autodiff: A_1 is the
    derivative through the query-side X, A_2 through the key-side X, A_3 through the values."""
    WQ, WK, WV = W
    d_k = WQ.shape[-1]

    def S(X1, X2, X3):
        M = tau * (X1 @ WQ) @ jnp.swapaxes(X2 @ WK, -1, -2) / jnp.sqrt(d_k)
        if mode == "uniform":
            M = M - lax.stop_gradient(M)
        return jax.nn.softmax(M, axis=-1) @ X3 @ WV

    J = jax.jacrev(S, argnums=(0, 1, 2))(X, X, X)
    return dict(A1=_sq(J[0]), A2=_sq(J[1]), A3=_sq(J[2]), cross=2 * jnp.sum(J[0] * J[1]))


@partial(jax.jit, static_argnames=("draws", "d_k", "mode", "fixed_X", "n", "d"))
def _mc(key, X, draws, d_k, mode, tau, sigma_x, rho, fixed_X, n, d, sq2, sk2, sv2):
    keys = jax.random.split(key, draws)

    def one(k):
        kx, kw = jax.random.split(k)
        Xd = X if fixed_X else gaussian_tokens(kx, n, d, sigma_x, rho)
        W = draw_weights(kw, d, d_k, sq2, sk2, sv2)
        out = gradient_norms(Xd, W, tau, mode)
        out.update({"input_" + k: v for k, v in input_grad_split(Xd, W, tau, mode).items()})
        return out

    return jax.vmap(one)(keys)


@float64
def mc_gradient_norms(
    key,
    *,
    X=None,
    n=None,
    d=None,
    sigma_x=1.0,
    rho=0.0,
    draws=64,
    d_k=None,
    mode="uniform",
    tau=1.0,
    sigma_q2=None,
    sigma_k2=None,
    sigma_v2=None,
):
    """Monte-Carlo means and standard errors of the four squared gradient norms.

    With X given the expectation is over the weights only (as in Lemma 3.1); otherwise X is
    redrawn each time as Gaussian tokens (sigma_x, rho) (as in Eqs. 17-18)."""
    fixed = X is not None
    if fixed:
        X = _f64(X)
        n, d = X.shape
    else:
        X = jnp.zeros((n, d))
    d_k = d if d_k is None else int(d_k)
    sq2 = 1.0 / d_k if sigma_q2 is None else sigma_q2
    sk2 = 1.0 / d_k if sigma_k2 is None else sigma_k2
    sv2 = 1.0 / d if sigma_v2 is None else sigma_v2
    out = _mc(
        key,
        X,
        int(draws),
        d_k,
        mode,
        float(tau),
        float(sigma_x),
        float(rho),
        fixed,
        int(n),
        int(d),
        float(sq2),
        float(sk2),
        float(sv2),
    )
    res = {}
    for k, v in out.items():
        v = np.asarray(v)
        res[k] = float(v.mean())
        res[k + "_se"] = float(v.std(ddof=1) / math.sqrt(len(v)))
    return res


# --------------------------------------------------------------------------------------
# deep stack without normalization (Lemmas 3.2-3.3)
# --------------------------------------------------------------------------------------
@float64
def stack_forward(X, key, depth, alpha1, alpha2, mode="uniform", d_k=None, activation="linear"):
    """X^{l+1} = alpha2 Y + Z, Z = alpha1 S(X) + X, Y = sigma(Z W1) W2 (weights var 1/d;
    W1 var 2/d for relu). Returns C(X^l) and ||X^l||^2 for l = 0..L (one weight draw)."""
    n, d = X.shape
    d_k = d if d_k is None else d_k
    a1 = jnp.broadcast_to(jnp.atleast_1d(_f64(alpha1)), (depth,))
    a2 = jnp.broadcast_to(jnp.atleast_1d(_f64(alpha2)), (depth,))
    phi = (lambda x: x) if activation == "linear" else jax.nn.relu
    g1 = 1.0 if activation == "linear" else 2.0

    def step(Xl, inp):
        k, b1, b2 = inp
        kw, k1, k2 = jax.random.split(k, 3)
        W = draw_weights(kw, d, d_k)
        Z = b1 * attention(Xl, *W, mode=mode) + Xl
        W1 = jax.random.normal(k1, (d, d), jnp.float64) * jnp.sqrt(g1 / d)
        W2 = jax.random.normal(k2, (d, d), jnp.float64) / jnp.sqrt(d)
        Xn = b2 * phi(Z @ W1) @ W2 + Z
        return Xn, (C_of(Xn), frob2(Xn))

    _, (Cs, Fs) = lax.scan(step, _f64(X), (jax.random.split(key, depth), a1, a2))
    return jnp.concatenate([C_of(X)[None], Cs]), jnp.concatenate([frob2(X)[None], Fs])


@float64
def mc_stack_forward(key, X, depth, alpha1, alpha2, draws=256, mode="uniform", activation="linear"):
    """Means and standard errors over weight draws of C(X^l), ||X^l||^2 (l = 0..L)."""
    f = jax.jit(jax.vmap(lambda k: stack_forward(X, k, depth, alpha1, alpha2, mode, activation=activation)))
    C, F = f(jax.random.split(key, draws))
    C, F = np.asarray(C), np.asarray(F)
    se = lambda a: a.std(axis=0, ddof=1) / math.sqrt(a.shape[0])
    return dict(C=C.mean(0), C_se=se(C), F=F.mean(0), F_se=se(F), rho=correlation(C.mean(0), F.mean(0), X.shape[0]))


@float64
def query_grad_through_loss(X, key, depth=2, mode="softmax"):
    """Gradient norms of a random scalar loss w.r.t. W_Q, W_K, W_V of the first block of a
    no-LN linear stack (alpha = 1): Thm 3.2 says the Q/K ones vanish when X = 1 x^T."""
    n, d = X.shape
    keys = jax.random.split(key, 2 * depth + 1)
    Ws = [draw_weights(keys[i], d, d) for i in range(depth)]
    Fs = [jax.random.normal(keys[depth + i], (2, d, d), jnp.float64) / jnp.sqrt(d) for i in range(depth)]
    R = jax.random.normal(keys[-1], (n, d), jnp.float64)

    def loss(W0):
        Xl = X
        for i in range(depth):
            W = W0 if i == 0 else Ws[i]
            Z = attention(Xl, *W, mode=mode) + Xl
            Xl = Z @ Fs[i][0] @ Fs[i][1] + Z
        return jnp.sum(jnp.tanh(Xl) * R)

    g = jax.grad(loss)(Ws[0])
    return dict(query=float(_sq(g[0])), key=float(_sq(g[1])), value=float(_sq(g[2])))
