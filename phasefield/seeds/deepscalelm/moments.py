"""DeepScaleLM moment rules (Kedia et al. 2024; seed 002): components, blocks, stacks.

Forward moments of an activation tensor X (rows = the L tokens of a sequence, columns =
the d hidden units) are ``Fwd(mu, var, r)``: per-entry mean, variance and the correlation
``r`` between the same hidden unit of two different tokens (the paper's r^l). Backward
moments of the gradient are ``Bwd(var, r)`` (zero mean). Every component maps moments to
moments (Table 1 of the paper, App. A); blocks and stacks compose them (Table 2, App. E).

The seed text stops inside App. A.4 (ReLU); the LayerNorm, softmax, attention, FFN and
whole-model rules (App. A.6-E) are derived here from the component rules under the
paper's stated assumptions (Gaussian inputs, weights independent of activations, gradients
independent of the forward pass), see docs/seeds.md. Two attention models are provided:

* ``exact=False``: the paper's Table 1/2 simplification (SHA output variance r * var_in,
  r_out = 1; gradient variance r_g * var_g; value path only).
* ``exact=True`` (default): the same derivation keeping the finite-L, softmax-fluctuation
  (log-normal softmax of App. A.7) and shared-input terms: Q, K and V are projections of
  one X, so the softmax tilts the value average towards the tokens the query prefers
  (forward, ``sha(d_in=...)``) and the gradient also flows through the queries and keys
  (backward, ``sha_bwd(d_in=...)``); derivations in docs/seeds.md.

The attention block is  W_V -> softmax attention -> W_O -> dropout (W_Q, W_K act on the
same input); the FFN block is W_1 (d -> m d) -> ReLU -> W_2 (m d -> d) -> dropout (m = 4).

The attention rules also take the token-covariance anisotropy kappa = d tr(S^2)/(tr S)^2;
``stack(kappa="auto")`` predicts it at every attention input with the kappa closure
(``kappa_linear``, ``kappa_relu``, ``kappa_dropout``, ``kappa_residual``, ``kappa_attention``,
``kappa_ffn``). The LayerNorm backward uses the tracked per-token norm fluctuation
(``norm_cv2_block``, ``norm_cv2_residual``; ``stack(ln_fluct=...)``) where it is validated:
a LayerNorm after Gaussian layers (post-LN without a skip path, lam = 0; the first post-LN
LayerNorm, which reads the Gaussian input x_0 through the skip path) and the pre-LN stream.
The other post-LN LayerNorms with a skip path keep the chi^2 value: other O(1/d) terms of
the post-LN backward are still missing there, and the chi^2 value offsets part of them
(docs/seeds.md).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ...theory.attention import exact
from ...theory.precision import float64

ARCHS = ("pre-ln", "post-ln")
INITS = ("xavier", "dslm", "dslm-simple")


class Fwd(NamedTuple):
    mu: float
    var: float
    r: float


class Bwd(NamedTuple):
    var: float
    r: float


# --------------------------------------------------------------------------------------
# components (Table 1)
# --------------------------------------------------------------------------------------
@float64
def linear(x: Fwd, d_in, sigma_w2) -> Fwd:
    """x W, W ~ N(0, sigma_w2): mu 0, var d_in s^2 (var + mu^2), r (r var + mu^2)/(var + mu^2)."""
    m2 = x.var + x.mu**2
    return Fwd(0.0 * x.mu, d_in * sigma_w2 * m2, (x.r * x.var + x.mu**2) / m2)


@float64
def linear_bwd(g: Bwd, d_out, sigma_w2) -> Bwd:
    return Bwd(d_out * sigma_w2 * g.var, g.r)


@float64
def dropout(x: Fwd, p) -> Fwd:
    """Inverted dropout: var (var + p mu^2)/(1-p), r r var (1-p)/(var + p mu^2)."""
    den = x.var + p * x.mu**2
    return Fwd(x.mu, den / (1 - p), x.r * x.var * (1 - p) / den)


@float64
def dropout_bwd(g: Bwd, p) -> Bwd:
    return Bwd(g.var / (1 - p), (1 - p) * g.r)


@float64
def relu_corr(r, approx=False):
    """Correlation of ReLU outputs of zero-mean unit-correlation-r Gaussians: the exact
    arc-cosine kernel [sqrt(1-r^2) + (pi - arccos r) r - 1] / (pi - 1), or 0.7 r + 0.3 r^2."""
    r = jnp.clip(jnp.asarray(r, jnp.float64), -1.0, 1.0)
    if approx:
        return 0.7 * r + 0.3 * r**2
    return (jnp.sqrt(1 - r**2) + (jnp.pi - jnp.arccos(r)) * r - 1) / (jnp.pi - 1)


@float64
def relu(x: Fwd, approx=False) -> Fwd:
    """ReLU of zero-mean Gaussian input (App. A.4)."""
    s2 = x.var
    return Fwd(jnp.sqrt(s2 / (2 * jnp.pi)), s2 * (1 - 1 / jnp.pi) / 2, relu_corr(x.r, approx))


@float64
def relu_bwd(g: Bwd, r_in) -> Bwd:
    """var/2, r_g (1/2 + arcsin(r_in)/pi)."""
    return Bwd(g.var / 2, g.r * (0.5 + jnp.arcsin(jnp.clip(r_in, -1, 1)) / jnp.pi))


@float64
def layernorm(x: Fwd) -> Fwd:
    """LayerNorm (no affine): mean 0, variance 1, correlation unchanged."""
    return Fwd(0.0 * x.mu, 1.0 + 0.0 * x.var, x.r)


@float64
def layernorm_bwd(g: Bwd, var_in, d=None, cv2=None) -> Bwd:
    """var_g / var_in (the d -> infinity rule). With ``d`` the finite-width factor: the
    Jacobian (I - 11^T/d - y y^T/d)/s projects onto d - 2 dimensions and divides by the
    token's empirical std s, with s^2 ~ var_in chi^2_{d-1}/d, so E[1/s^2] = d/((d-3) var_in)
    and the factor is (d-2)/d * d/(d-3) = (d-2)/(d-3) (needs d > 3). ``cv2``: the squared
    coefficient of variation of s^2 over tokens, sequences and weights when it is not the
    chi^2_{d-1} value 2/(d-1) (inside a stack, ``norm_cv2``): E[1/s^2] = d/((d-1)(1 - cv2) var_in)
    (Gamma-distributed s^2), factor (d-2)/(d-1)/(1 - cv2); cv2 = 2/(d-1) gives (d-2)/(d-3)."""
    f = 1.0 if d is None else (d - 2) / (d - 3)
    if d is not None and cv2 is not None:
        f = (d - 2) / (d - 1) / (1 - cv2)
    return Bwd(f * g.var / var_in, g.r)


@float64
def softmax(var_logit, r_logit, L):
    """Softmax over L logits of variance var_logit and mutual correlation r_logit
    (log-normal approximation, App. A.7 of the paper): (mean, variance) of one entry."""
    s = (1 - r_logit) * var_logit
    return 1.0 / L, jnp.expm1(s) / L**2


@float64
def softmax_bwd(g: Bwd, var_logit, r_logit, L) -> Bwd:
    s = (1 - r_logit) * var_logit
    return Bwd(jnp.exp(s) / L**2 * g.var, g.r)


@functools.lru_cache(maxsize=4096)
def softmax_row_moments(s, rho, L):
    """Exact finite-L moments of softmax weights A_j = e^{z_j}/sum_k e^{z_k} of L i.i.d.
    N(0, s) logits, and of a second row B_j from logits w_j with corr(z_j, w_j) = rho
    (pairs i.i.d. over j). Returns the expectations of

    S2 = sum A^2, S3 = sum A^3, S2sq = (sum A^2)^2, P = sum A B, R = sum A B^2,
    P2 = (sum A B)^2, S2S2 = sum A^2 sum B^2.

    The log-normal rule of App. A.7 (S2 ~ e^s/L, P ~ e^{rho s}/L) is their L -> infinity
    limit; at L = 32, s = 0.8 it is 10 % high for S2 and 34 % high for S3 ~ e^{3s}/L^2.
    These are the per-key moments of the exact-softmax attention map
    (:mod:`phasefield.theory.attention.exact`, Laplace transform of the denominators,
    checked there against brute-force Monte Carlo) summed over keys: the row logits of the
    theory map, variance sigma_A^2 (1 - rho) and cross-row correlation rho, are these with
    sigma_A^2 = s / (1 - rho)."""
    s, rho, L = float(s), float(min(max(rho, -1.0), 1.0)), int(L)
    if s <= 1e-12 or rho >= 1.0:
        u = 1.0 / L
        return dict(S2=u, S3=u * u, S2sq=u * u, P=u, R=u * u, P2=u * u, S2S2=u * u)
    a, b = _exact_moments(math.sqrt(s / (1.0 - rho)), rho, L)
    pairs = L * (L - 1)
    return dict(
        S2=L * a["a2"],
        S3=L * a["a3"],
        S2sq=L * a["a4"] + pairs * a["a2a2"],
        P=L * b["ab"],
        R=L * b["a2b"],
        P2=L * b["a2b2"] + pairs * b["abab"],
        S2S2=L * b["a2b2"] + pairs * b["a2_b2"],
    )


@float64
def _exact_moments(sigma_a, rho, L):
    # grid sizes for sigma_A rounded up to a quarter: a handful of compiled shapes per L
    n_a, n_z = exact.sizes(sigma_max=math.ceil(4 * sigma_a) / 4, n_max=L)
    a, b = _exact_moments_jit(sigma_a, rho, L, n_a, n_z)
    return ({k: float(v) for k, v in a.items()}, {k: float(v) for k, v in b.items()})


@functools.partial(jax.jit, static_argnames=("L", "n_a", "n_z"))
def _exact_moments_jit(sigma_a, rho, L, n_a, n_z):
    return (
        exact.row_moments(sigma_a, L, rho, n_a, n_z),
        exact.pair_moments(sigma_a, L, rho, n_a, n_z, higher=True),
    )


def _softmax_weights(r, var_logit, L):
    """E sum_j A_ij^2 and, for two rows, E sum_j A_ij A_kj at row-centred logit variance
    s = (1 - r) var_logit and cross-row logit correlation r (exact finite L,
    ``softmax_row_moments``; the log-normal e^s/L, e^c/L with c = r s is its large-L limit)."""
    q = softmax_row_moments(float((1 - r) * var_logit), float(r), int(L))
    return q["S2"], q["P"]


def _tilt(r, var_logit, L, d_in):
    """(1 - r)^2 var_logit / d_in (L - 1)/L: squared shift of the softmax-weighted token
    average towards the query's preferred direction, per unit of V variance (0 without d_in)."""
    if d_in is None:
        return 0.0
    return (1 - r) ** 2 * var_logit / d_in * (L - 1) / L


@float64
def sha(v: Fwd, L, var_logit=0.0, exact=True, d_in=None, kappa=1.0) -> Fwd:
    """Value mixing A V of one attention head (zero-mean V with var, r across tokens).

    ``exact=True``: var = v [r + (1 - r) S2 + T], cov = v [r + (1 - r) P + r T], with the
    exact finite-L softmax moments S2 = E sum_j A_ij^2 ~ e^s/L, P = E sum_j A_ij A_kj ~ e^c/L
    (``softmax_row_moments``).
    T = ``_tilt`` (``d_in`` given: V = X W_V and the logits X W_Q (X W_K)^T share the
    d_in-wide input X, so the softmax weights favour tokens whose X leans towards the
    query's direction B^T x_i; the weighted average of X moves by (1 - r) var_x B^T x_i).
    ``d_in=None``: V independent of the logits, T = 0.
    ``kappa`` = d tr(S^2) / (tr S)^2 of the token covariance S of the input (1: isotropic):
    the shift is S B^T x_i, so T scales with tr(S^2), i.e. by kappa (docs/seeds.md)."""
    if not exact:
        return Fwd(0.0 * v.mu, v.r * v.var, 1.0 + 0.0 * v.r)
    a, ac = _softmax_weights(v.r, var_logit, L)
    t = kappa * _tilt(v.r, var_logit, L, d_in)
    var = v.var * (v.r + (1 - v.r) * a + t)
    cov = v.var * (v.r + (1 - v.r) * ac + v.r * t)
    return Fwd(0.0 * v.mu, var, cov / var)


@float64
def sha_bwd(g: Bwd, L, var_logit=0.0, r_in=0.0, exact=True, d_in=None, kappa=1.0) -> Bwd:
    """Gradient of one attention head, returned at V (before W_V^T; r_in = r of V).

    Softmax-weight moments at row logit variance s = (1 - r_in) var_logit, cross-row
    correlation r_in, exact at finite L (``softmax_row_moments``: S2 = E sum_j A_ij^2,
    S3 = E sum A^3, S2sq = E (sum A^2)^2, two rows P = E sum_j A_ij A_kj, R = E sum A_ij A_kj^2,
    P2 = E P^2, S2S2 = E sum A_ij^2 sum A_kj^2; the log-normal S2 ~ e^s/L, P ~ e^c/L is their
    large-L limit and is 10-45 % high at L = 32, which showed as a 20-30 % overestimate of
    the attention-sublayer input gradient in DSLM-init stacks, where no skip path dilutes it).

    Value path A^T g: var_g [S2 + r_g (L - 1) P], cov var_g [(1 - S2)/(L - 1) + r_g (1 - P)].
    With ``d_in`` (Q, K, V from one d_in-wide X) add the query and key paths, which reach X
    directly; their variances carry the same factor d_v sigma_v^2 as the value path through
    W_V^T, so they are expressed in the same units here (b = (1 - r_in)^2 var_logit/d_in):

    * query path, B C_i W_V g_i with C_i = sum_j A_ij (x_j - xbar_i)(x_j - xbar_i)^T the
      softmax-weighted covariance of the tokens: E tr C_i^2 / d for fixed weights is exactly
      (1-r)^2 var_x^2 [1 + (d-1) S2 - 2(d+1) S3 + (d+2) S2^2] (Gaussian tokens), so
      var b [1 + (d-1) S2 - 2(d+1) S3 + (d+2) S2sq]; for two rows
      cov r_g b [1 + (d+1)(P - 2R + P2) - 2 S2 + S2S2];
    * key path, sum_i A_ij g_i.(x_j - xbar_i) B^T x_i with E|x_j - xbar_i|^2 proportional to
      1 - 2 A_ij + sum_k A_ik^2: (1 - r_in) var_logit [S2 - 2 S3 + S2sq + r_g r_in (L - 1)
      (P - 2R + P2)]; its sum over tokens is exactly zero (the rows of dL/dlogits sum to
      zero), so its cov is -var/(L - 1).

    Anisotropic tokens (covariance S with ``kappa`` = d tr(S^2)/(tr S)^2 > 1): for fixed
    weights M = diag(A) - A A^T, C = S^{1/2} W S^{1/2} with E[W_ab W_cd] = a d_ab d_cd +
    b (d_ac d_bd + d_ad d_bc), a = E(tr M)^2 = 1 - 2 S2 + S2sq, b = E|M|_F^2 =
    S2 - 2 S3 + S2sq, so E tr C^2 / d = (1-r)^2 var_x^2 [(a + b) kappa + b d] (the isotropic
    bracket above at kappa = 1; two rows alike). The value and key paths see only traces.

    Dropped: terms of relative order (1 - r) var_logit / d_in from the tilt of the weights
    along B^T x_i (key path measured 2-11 % above the rule at d_in = 64-128, L = 32).
    """
    if not exact:
        return Bwd(g.r * g.var, 1.0 + 0.0 * g.r)
    q = softmax_row_moments(float((1 - r_in) * var_logit), float(r_in), int(L))
    var = q["S2"] + g.r * (L - 1) * q["P"]
    cov = (1 - q["S2"]) / (L - 1) + g.r * (1 - q["P"])
    if d_in is not None:
        d = d_in
        base = (1 - r_in) ** 2 * var_logit / d  # (1 - r)^2 var_logit / d_in, T without (L-1)/L
        a1, b1 = 1 - 2 * q["S2"] + q["S2sq"], q["S2"] - 2 * q["S3"] + q["S2sq"]  # one row
        a2, b2 = 1 - 2 * q["S2"] + q["S2S2"], q["P"] - 2 * q["R"] + q["P2"]  # two rows
        var_q = base * ((a1 + b1) * kappa + b1 * d)
        cov_q = g.r * base * ((a2 + b2) * kappa + b2 * d)
        var_k = (
            (1 - r_in)
            * var_logit
            * (q["S2"] - 2 * q["S3"] + q["S2sq"] + g.r * r_in * (L - 1) * (q["P"] - 2 * q["R"] + q["P2"]))
        )
        var, cov = var + var_q + var_k, cov + cov_q - var_k / (L - 1)
    return Bwd(g.var * var, cov / var)


# --------------------------------------------------------------------------------------
# blocks (Table 2)
# --------------------------------------------------------------------------------------
@float64
def logit_variance(x: Fwd, d, sigma_qk2):
    """Variance of q.k/sqrt(d) with q = x W_Q, k = x W_K: (d s_q^2)(d s_k^2)(var + mu^2)^2."""
    return (d * sigma_qk2) ** 2 * (x.var + x.mu**2) ** 2


@float64
def attention_block(x: Fwd, d, L, init, p=0.0, exact=True, kappa=1.0):
    """W_V -> attention -> W_O -> dropout, with W_Q, W_K on the same input (token-covariance
    anisotropy ``kappa``, see ``sha``). Returns the output moments and a cache."""
    v = linear(x, d, init["v"])
    s2 = logit_variance(x, d, init["qk"]) if exact else 0.0
    h = sha(v, L, s2, exact, d_in=d, kappa=kappa)
    o = linear(h, d, init["o"])
    return dropout(o, p), dict(r_v=v.r, s2=s2, kappa=kappa)


@float64
def attention_block_bwd(g: Bwd, cache, d, L, init, p=0.0, exact=True, qk_grad=True) -> Bwd:
    """Gradient at the block input; ``qk_grad=False`` keeps the value path only."""
    g = dropout_bwd(g, p)
    g = linear_bwd(g, d, init["o"])
    g = sha_bwd(g, L, cache["s2"], cache["r_v"], exact, d_in=d if qk_grad else None, kappa=cache["kappa"])
    return linear_bwd(g, d, init["v"])


@float64
def ffn_block(x: Fwd, d, init, p=0.0, mult=4, approx=False):
    """W_1 (d -> m d) -> ReLU -> W_2 -> dropout (input assumed zero-mean)."""
    h = linear(x, d, init["w1"])
    a = relu(h, approx)
    o = linear(a, mult * d, init["w2"])
    return dropout(o, p), dict(r_h=h.r)


@float64
def ffn_block_bwd(g: Bwd, cache, d, init, p=0.0, mult=4) -> Bwd:
    g = dropout_bwd(g, p)
    g = linear_bwd(g, d, init["w2"])
    g = relu_bwd(g, cache["r_h"])
    return linear_bwd(g, mult * d, init["w1"])


@float64
def residual(x: Fwd, y: Fwd, lam2, beta2) -> Fwd:
    """lam x + beta y with y uncorrelated with x (fresh zero-mean weights)."""
    var = lam2 * x.var + beta2 * y.var
    return Fwd(0.0 * x.mu, var, (lam2 * x.r * x.var + beta2 * y.r * y.var) / var)


@float64
def residual_bwd(g: Bwd, gb: Bwd, lam2, beta2) -> Bwd:
    var = lam2 * g.var + beta2 * gb.var
    return Bwd(var, (lam2 * g.r * g.var + beta2 * gb.r * gb.var) / var)


# --------------------------------------------------------------------------------------
# per-token norm fluctuation (the LayerNorm backward's E[1/s^2])
# --------------------------------------------------------------------------------------
def norm_cv2_block(cv2, kind, d, p=0.0, mult=4):
    """Squared coefficient of variation of a token's second moment s^2 = |x|^2/d (over tokens,
    sequences and weight draws) at a sublayer output, from its value ``cv2`` at the input.
    A Gaussian layer (fan-out n) multiplies |x|^2 by chi^2_n/n for any x: 1 + cv2 -> (1 + cv2)
    (1 + 2/n) (the common part of the tokens is one vector per sequence, so this does not
    average out over tokens); ReLU of n units i.i.d. given the token: (1 + 5/n)
    (E relu^4 / (E relu^2)^2 = 6); dropout: (1 + 3 p/((1-p) d)) (Gaussian entries); the
    attention mixing is taken to keep it (it moves only the within-sequence part). A
    LayerNorm sets it to 0. The FFN's first layer has no factor of its own: given the token,
    its n = mult d pre-activations are i.i.d. Gaussian, and the ReLU's 5/n is the whole
    fluctuation of |relu(W_1^T x)|^2 (an extra (1 + 2/n) counted it twice; Monte Carlo in
    test_norm_cv2_of_the_ffn_output)."""
    f = (1 + 5 / (mult * d)) * (1 + 2 / d) if kind == "ffn" else (1 + 2 / d) ** 2
    return (1 + cv2) * f * (1 + 3 * p / ((1 - p) * d)) - 1


def norm_cv2_residual(x: Fwd, cx, y: Fwd, cy, lam2, beta2, d, coupled=False):
    """lam x + beta y: s_u^2 = lam^2 s_x^2 + beta^2 s_y^2 + 2 lam beta x.y/d with x.y/d of variance
    m_x m_y / d (the branch ends in a fresh matrix) and s_x, s_y uncorrelated (pre-LN: the
    branch sees LN(x); post-LN: s_x = 1) unless ``coupled`` (the branch sees x itself, whose
    scale it carries: post-LN's first sublayer), which adds 2 lam^2 beta^2 m_x m_y cx."""
    mx, my = float(x.var) + float(x.mu) ** 2, float(y.var) + float(y.mu) ** 2
    a, b = lam2 * mx, beta2 * my
    c = 2 * a * b * cx if coupled else 0.0
    return (a * a * cx + b * b * cy + c + 4 * lam2 * beta2 * mx * my / d) / (a + b) ** 2


# --------------------------------------------------------------------------------------
# token-covariance anisotropy: the kappa closure (docs/seeds.md, "kappa closure")
# --------------------------------------------------------------------------------------
# The within-sequence covariance S of the token vectors (d x d; per-unit trace
# m1 = (1 - r) var) is summarised by kappa = d tr(S^2) / (tr S)^2 = m2 / m1^2 (1: isotropic).
# Every rule below is a ratio of expectations over Gaussian weights at leading order in
# 1/d (the O(1/d) terms that are kept are written out); higher spectral moments of S, which
# only the attention tilt needs, come from the free-Poisson (Marchenko-Pastur) spectrum with
# the same kappa ("_mp_moments"). ``cross`` is |Cov(x, y)|_F^2 / d between a sublayer's
# input x and its output y, which the residual sum needs.
def _mp_moments(kappa):
    """(m3, m4) per unit m1 of the free-Poisson spectrum with m2 / m1^2 = kappa (c = kappa - 1):
    1 + 3c + c^2 and 1 + 6c + 6c^2 + c^3 (exact for a Wishart / a Gaussian layer of an
    isotropic input)."""
    c = max(float(kappa) - 1.0, 0.0)
    return 1 + 3 * c + c * c, 1 + 6 * c + 6 * c * c + c**3


def kappa_linear(kappa, d_in, d_out):
    """x W, W (d_in x d_out) Gaussian: E tr(W^T S W)^2 = s^4 d_out [(d_out + 1) tr S^2 + (tr S)^2],
    so kappa' = (1 + 1/d_out)(d_out/d_in) kappa + 1 (free multiplicative convolution with a
    Marchenko-Pastur law; square: kappa + 1 + kappa/d)."""
    return (1 + 1 / d_out) * (d_out / d_in) * float(kappa) + 1.0


_GH = np.polynomial.hermite_e.hermegauss(80)


def _relu_unit_moments(x: Fwd):
    """Per-unit quantities of ReLU(h), h zero-mean with var q and token correlation r: each
    unit a has its sequence mean hbar_a ~ N(0, r q) and within-sequence variance s = (1-r) q.
    Returns s, E v, E v^2 (v_a: within-sequence variance of the unit's output) and E phi^2
    (phi_a = Phi(hbar_a / sqrt s) = E relu'), averaged over units by Gauss-Hermite quadrature."""
    from scipy.special import ndtr

    q, r = float(x.var), min(max(float(x.r), 0.0), 1.0)
    s = (1 - r) * q
    z, w = _GH
    w = w / w.sum()
    m = math.sqrt(r * q) * z
    if s <= 0:
        return 0.0, 0.0, 0.0, float(np.sum(w * (m > 0)))
    t = m / math.sqrt(s)
    cdf, pdf = ndtr(t), np.exp(-0.5 * t * t) / math.sqrt(2 * math.pi)
    e1 = m * cdf + math.sqrt(s) * pdf
    e2 = (m * m + s) * cdf + m * math.sqrt(s) * pdf
    v = e2 - e1 * e1
    return s, float(np.sum(w * v)), float(np.sum(w * v * v)), float(np.sum(w * cdf * cdf))


def kappa_relu(h: Fwd, kappa, delta=0.0):
    """ReLU of a Gaussian h with token-covariance anisotropy ``kappa``. Per unit pair, the
    within-sequence covariance of the outputs is (Mehler / Stein) phi_a phi_b S_ab + O(S_ab^2)
    off the diagonal, v_a on it, so d tr S'^2 / (tr S')^2 = [E v^2 (1 + delta) +
    s^2 (E phi^2)^2 (kappa - 1 - delta)] / (E v)^2. ``delta`` = Var(S_aa)/s^2 is the spread of
    the input's diagonal (2 kappa_x / d_in after a Gaussian layer)."""
    s, ev, ev2, ephi2 = _relu_unit_moments(h)
    if ev <= 0:
        return 1.0
    return (ev2 * (1 + delta) + s * s * ephi2**2 * (float(kappa) - 1 - delta)) / ev**2


def kappa_dropout(x: Fwd, kappa, p):
    """Inverted dropout (mask per entry): S' = S + diag(rho (S_aa + mu_a^2)), rho = p/(1-p),
    mu_a the unit's sequence mean (E mu_a^2 = c0 = r var + mu^2, Gaussian: E mu_a^4 = 3 c0^2)."""
    if p == 0:
        return float(kappa)
    rho = p / (1 - p)
    m1, c0 = (1 - float(x.r)) * float(x.var), float(x.r) * float(x.var) + float(x.mu) ** 2
    m2 = m1 * m1 * float(kappa) + 2 * rho * (m1 * m1 + m1 * c0) + rho * rho * (m1 * m1 + 2 * m1 * c0 + 3 * c0 * c0)
    return m2 / (m1 + rho * (m1 + c0)) ** 2


def kappa_residual(x: Fwd, kx, y: Fwd, ky, lam2, beta2, cross=0.0):
    """lam x + beta y: S_u = lam^2 S_x + beta^2 S_y + lam beta (C + C^T), C = Cov(x, y).
    The branch ends in a fresh zero-mean matrix, so E tr(S_x S_y) = tr S_x tr S_y / d and the
    terms odd in it vanish; E tr(C + C^T)^2 = 2 |C|_F^2 = 2 d ``cross`` (tr C^2 is lower order):
    tr S_u^2 / d = lam^4 m1x^2 kx + beta^4 m1y^2 ky + 2 lam^2 beta^2 (m1x m1y + cross)."""
    m1x, m1y = (1 - float(x.r)) * float(x.var), (1 - float(y.r)) * float(y.var)
    a, b = lam2 * m1x, beta2 * m1y
    if a + b <= 0:
        return 1.0
    m2 = a * a * float(kx) + b * b * float(ky) + 2 * lam2 * beta2 * (m1x * m1y + cross)
    return m2 / (a + b) ** 2


def kappa_attention(x: Fwd, kappa, d, L, init, p=0.0):
    """Anisotropy of the attention block output and its cross term with the input (x units).

    Within-sequence covariance of A V before W_V, per the forward rule: the value mixing
    (S2 - P) S (shape of S) plus the tilt f K, K = S B^T S B S, f = (L-1)/L, B = W_Q W_K^T/sqrt(d)
    (entries of variance sigma_B^2 = sigma_M^2 / (d m2x)^2, m2x = var + mu^2). For B
    free from S (product of two Gaussians, planar pairings): tr K = sigma_B^2 tr S tr S^2,
    tr SK = sigma_B^2 tr S tr S^3, tr K^2 = sigma_B^4 [(tr S)^2 tr S^4 + tr S^2 (tr S^2)^2 +
    (tr S)^2 (tr S^2)^2 / d] (the last from B being a product; isotropic: kappa_K = 3). Then W_V and W_O (``kappa_linear``),
    dropout. Cross term: Cov(x_j, y_j) = (S/L + f S B S) W_V W_O, so |C|_F^2 / d =
    d sigma_v^2 sigma_o^2 [tr S^2 / L^2 + f^2 sigma_B^2 (tr S^2)^2]. Returns (kappa_out, cross)."""
    r = float(x.r)
    m2x = float(x.var) + float(x.mu) ** 2
    s2 = float(logit_variance(x, d, init["qk"]))
    q = softmax_row_moments(float((1 - r) * s2), r, int(L))
    f = (L - 1) / L
    m1 = (1 - r) * float(x.var)
    m2 = m1 * m1 * float(kappa)
    m3, m4 = _mp_moments(kappa)
    m3, m4 = m3 * m1**3, m4 * m1**4
    sb2 = s2 / (d * m2x) ** 2  # sigma_B^2 (d sigma_qk^2)^2 m2x^2 = s2
    mix = q["S2"] - q["P"]
    # per-unit traces (tr / d) of X = mix S + f K, in x units
    t1 = mix * m1 + f * sb2 * d * m1 * m2
    t2 = (
        mix * mix * m2
        + 2 * mix * f * sb2 * d * m1 * m3
        + f * f * sb2**2 * d * d * (m1 * m1 * m4 + m2**3 + m1 * m1 * m2 * m2)
    )
    k = kappa_linear(kappa_linear(t2 / t1**2, d, d), d, d)
    v = linear(x, d, init["v"])
    h = sha(v, L, s2, True, d_in=d, kappa=kappa)
    o = linear(h, d, init["o"])
    k = kappa_dropout(o, k, p)
    cross = d * d * init["v"] * init["o"] * (m2 / L**2 + f * f * sb2 * d * m2 * m2)
    return k, cross


def kappa_ffn(x: Fwd, kappa, d, init, p=0.0, mult=4):
    """Anisotropy of the FFN block output (W_1 -> ReLU -> W_2 -> dropout) and its cross term:
    Cov(x, relu(x W_1)) = S W_1 diag(phi) (Stein), so |C|_F^2 / d = d sigma_2^2 m d sigma_1^2
    E phi^2 tr S^2 / d. Returns (kappa_out, cross)."""
    h = linear(x, d, init["w1"])
    kh = kappa_linear(kappa, d, mult * d)
    k = kappa_relu(h, kh, delta=2 * float(kappa) / d)
    a = relu(h)
    k = kappa_linear(k, mult * d, d)
    o = linear(a, mult * d, init["w2"])
    k = kappa_dropout(o, k, p)
    _, _, _, ephi2 = _relu_unit_moments(h)
    m1 = (1 - float(x.r)) * float(x.var)
    cross = mult * d * d * init["w1"] * init["w2"] * ephi2 * m1 * m1 * float(kappa)
    return k, cross


# --------------------------------------------------------------------------------------
# initialisations and scalings (Section 3.5)
# --------------------------------------------------------------------------------------
@float64
def dslm_scaling(layers, k=2.0, alpha=1.0):
    """beta^2 = k / N^alpha, lambda^2 = 1 - beta^2."""
    beta2 = k / float(layers) ** alpha
    if not 0 < beta2 <= 1:
        raise ValueError(f"beta^2 = k / N^alpha = {beta2:g} must lie in (0, 1]")
    return 1.0 - beta2, beta2


@float64
def xavier_init(d, mult=4):
    """Glorot: 2 / (fan_in + fan_out) for every matrix."""
    return dict(qk=1.0 / d, v=1.0 / d, o=1.0 / d, w1=2.0 / ((1 + mult) * d), w2=2.0 / ((1 + mult) * d))


@float64
def dslm_init(d, p=0.0, mult=4, r=None, L=None, exact=True):
    """DeepScaleLM: sigma_w1^2 = sigma_w2^2 = (1/d) sqrt((1-p)/(mult/2)) (unit FFN output;
    the paper's (1/d) sqrt((1-p)/2) is the mult = 4 case written per 4d fan-in), and
    sigma_v^2 = sigma_o^2 chosen so the attention block output variance is 1 at input
    correlation r (``r=None``: the 'simple' init, same as the FFN)."""
    f = 1.0 / d * math.sqrt((1 - p) / (mult / 2))
    init = dict(qk=1.0 / d, v=f, o=f, w1=f, w2=f)
    if r is not None:
        if exact:  # attention output variance per unit of V variance (sha with the tilt)
            s2 = logit_variance(Fwd(0.0, 1.0, r), d, init["qk"])
            eff = float(sha(Fwd(0.0, 1.0, r), L, s2, True, d_in=d).var)
        else:
            eff = r
        init["v"] = init["o"] = 1.0 / d * math.sqrt((1 - p) / eff)
    return init


# --------------------------------------------------------------------------------------
# whole stacks (App. E)
# --------------------------------------------------------------------------------------
@float64
def stack(
    arch="pre-ln",
    layers=4,
    d=256,
    L=64,
    init="xavier",
    p=0.0,
    lam2=1.0,
    beta2=1.0,
    var0=1.0,
    r0=0.2,
    g_var=1.0,
    g_r=0.0,
    exact=True,
    approx=False,
    mult=4,
    ln_exact=True,
    qk_grad=True,
    kappa=None,
    kappa0=1.0,
    ln_fluct="auto",
    norm_response=True,
):
    """Moments through ``layers`` transformer layers (attention + FFN sublayers).

    Returns dict of numpy arrays over the 2 * layers + 1 sublayer boundaries: forward
    ``var``, ``r`` of x_l (x_0 = input) and backward ``g_var``, ``g_r`` of dLoss/dx_l for an
    output gradient of variance g_var and token correlation g_r, and ``inits``: the weight
    variances used by each sublayer. ``init`` is a name in INITS or a dict (keys qk, v, o,
    w1, w2); 'dslm' re-solves sigma_v, sigma_o per layer. ``ln_exact``: the finite-d
    LayerNorm gradient factor (d-2)/(d-3); ``qk_grad=False``: value path only. ``kappa``:
    one token-covariance anisotropy d tr(S^2)/(tr S)^2 per attention sublayer input (None:
    isotropic, 1; measured values come from ``simulate_stack``) or ``"auto"``: predicted by
    the kappa closure (``kappa_linear``, ``kappa_relu``, ``kappa_dropout``, ``kappa_residual``,
    ``kappa_attention``, ``kappa_ffn``; input anisotropy ``kappa0``), see docs/seeds.md.
    Returned: ``kappa`` (the values used at the attention inputs) and, with "auto",
    ``kappa_all`` (the prediction at every sublayer boundary x_l). ``ln_fluct``: the LayerNorm
    backward uses the tracked per-token norm fluctuation (``norm_cv2_block``,
    ``norm_cv2_residual``; Gaussian input 2/(d-1)) instead of the chi^2 value: True, False or
    "auto" (default): on where it is validated, in pre-LN stacks and at every post-LN LayerNorm
    whose input norm carries the fluctuation of Gaussian layers: all of them without a skip
    path (lam2 = 0, the LayerNorm reads the branch output) and, with a skip path, the first
    (it reads lam x_0 + beta y(x_0), x_0 the Gaussian input); off at the other post-LN
    LayerNorms, whose skip input is a LayerNorm output (docs/seeds.md). ``norm_response``
    (pre-LN, where the tracked fluctuation is used): a token whose stream norm is above
    average gets smaller branch gradients (the LayerNorm divides by it), and with a skip path
    its norm persists down the stack, so its gradient energy responds to its norm deviation
    delta = s^2/E s^2 - 1 as E[|g|^2 | delta] = E|g|^2 (1 + c delta). The LayerNorm backward
    then has E[(1 + c_b delta)/(1 + delta)] = (1 - c_b cv2)/(1 - cv2) (Gamma delta), with the
    response c_b = c a carried from the sublayer output (a = lam^2 m_x / m_out: the part of
    the output norm that is the input's; attention included: the norm deviation is mostly
    common to the tokens of a sequence, which the mixing keeps); returned as
    ``g_norm_response`` (c at every boundary; checked against Monte Carlo in the tests)."""
    if not (isinstance(ln_fluct, bool) or ln_fluct == "auto"):
        raise ValueError(f"ln_fluct must be True, False or 'auto', not {ln_fluct!r}")
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHS)}")
    d_ln = d if ln_exact else None
    auto = isinstance(kappa, str)
    if auto and kappa != "auto":
        raise ValueError(f"kappa must be None, 'auto' or one value per layer, not {kappa!r}")
    x = Fwd(0.0, float(var0), float(r0))
    k = float(kappa0)  # anisotropy of the stream (kappa="auto")
    xs, caches, ks, k_att = [x], [], [k], []
    cv = 2 / (d - 1)  # norm fluctuation of the stream (ln_fluct)

    def tracked(sub):  # the LayerNorm after sublayer ``sub`` uses the tracked fluctuation
        if isinstance(ln_fluct, bool):
            return ln_fluct
        return arch == "pre-ln" or float(lam2) == 0.0 or sub == 0

    for sub in range(2 * layers):
        kind = "attn" if sub % 2 == 0 else "ffn"
        ini = resolve_init(init, d, p, mult, x, L, exact)
        xin = layernorm(x) if arch == "pre-ln" else x
        if kind == "attn":
            kap = k if auto else (1.0 if kappa is None else float(kappa[sub // 2]))
            k_att.append(kap)
            y, c = attention_block(xin, d, L, ini, p, exact, kap)
        else:
            y, c = ffn_block(xin, d, ini, p, mult, approx)
        u = residual(x, y, lam2, beta2)
        if auto:
            ky, cross = kappa_attention(xin, k, d, L, ini, p) if kind == "attn" else kappa_ffn(xin, k, d, ini, p, mult)
            scale = float(x.var) + float(x.mu) ** 2 if arch == "pre-ln" else 1.0  # Cov(x, y) = l Cov(LN x, y)
            k = kappa_residual(x, k, y, ky, lam2, beta2, cross * scale)
            ks.append(k)
        cv_in = cv if arch == "post-ln" else 0.0  # the branch input: LN(x) in pre-LN
        cv_y = norm_cv2_block(cv_in, kind, d, p, mult)
        cv_u = norm_cv2_residual(x, cv, y, cv_y, lam2, beta2, d, coupled=arch == "post-ln")
        caches.append((kind, c, ini, x, u) + ((cv, cv_u) if tracked(sub) else (None, None)))
        x = u if arch == "pre-ln" else layernorm(u)
        cv = cv_u if arch == "pre-ln" else 0.0
        xs.append(x)
    worst = max([c for cache in caches for c in cache[5:] if c is not None] + [0.0])
    if d_ln is not None and worst >= 1:
        raise ValueError(
            f"width d = {d} is too small for the finite-width LayerNorm rules: the tracked "
            f"norm fluctuation cv^2 = {worst:.3g} >= 1, so E[1/s^2] diverges (use a larger d, "
            "ln_fluct=False or ln_exact=False)"
        )
    g = Bwd(float(g_var), float(g_r))
    gs, resp, resps = [g], 0.0, [0.0]
    for kind, c, ini, xin_, u, cv_x, cv_u in reversed(caches):
        if arch == "post-ln":
            g = layernorm_bwd(g, u.var, d_ln, cv_u)
        if kind == "attn":
            gb = attention_block_bwd(g, c, d, L, ini, p, exact, qk_grad)
        else:
            gb = ffn_block_bwd(g, c, d, ini, p, mult)
        if arch == "pre-ln":
            gb = layernorm_bwd(gb, xin_.var, d_ln, cv_x)
            if norm_response and d_ln is not None and cv_x is not None:
                gb, resp = _norm_response(g, gb, resp, xin_, u, cv_x, lam2, beta2)
        g = residual_bwd(g, gb, lam2, beta2)
        gs.append(g)
        resps.append(resp)
    gs = gs[::-1]
    return dict(
        var=np.array([float(v.var) for v in xs]),
        r=np.array([float(v.r) for v in xs]),
        g_var=np.array([float(v.var) for v in gs]),
        g_r=np.array([float(v.r) for v in gs]),
        g_norm_response=np.array(resps[::-1]),
        inits=[c[2] for c in caches],
        kappa=np.array(k_att),
        kappa_all=np.array(ks) if auto else None,
    )


def _norm_response(g: Bwd, gb: Bwd, resp, x: Fwd, out: Fwd, cv2, lam2, beta2):
    """One pre-LN sublayer of ``stack(norm_response=True)``: the branch gradient ``gb`` (its
    LayerNorm factor already has E[1/s^2] = 1/(1 - cv2)) corrected for the response ``resp`` of
    the incoming gradient ``g`` to the output's norm deviation, and the response at the input."""
    mx, mo = float(x.var) + float(x.mu) ** 2, float(out.var) + float(out.mu) ** 2
    cb = resp * lam2 * mx / mo
    gb = Bwd(gb.var * (1 - cb * cv2), gb.r)
    skip, branch = lam2 * float(g.var), beta2 * float(gb.var)
    return gb, (skip * resp * lam2 * mx / mo + branch * (cb - 1)) / (skip + branch)


@float64
def resolve_init(init, d, p, mult, x: Fwd, L, exact=True):
    """Weight variances of one sublayer whose input has moments ``x`` (see ``stack``)."""
    if isinstance(init, dict):
        return init
    if init == "xavier":
        return xavier_init(d, mult)
    if init == "dslm-simple":
        return dslm_init(d, p, mult)
    if init == "dslm":
        return dslm_init(d, p, mult, r=float(x.r), L=L, exact=exact)
    raise ValueError(f"unknown init {init!r}; choose one of {', '.join(INITS)}")
