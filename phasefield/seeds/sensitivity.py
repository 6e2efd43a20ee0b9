"""Sensitivity of deep residual stacks (Catformer appendix; seed 004).

Definition 2: with V_p[f] = E||f||^2 / dim(f),

    S_{u,p}[f] = lim_{delta -> 0} E_{(u,v)~p, u~ ~ p(u)} ||f(u + delta u~, v) - f(u, v)||^2
                 / (delta^2 E||f(u, v)||^2)

(the perturbation u~ is drawn from the *initialisation* distribution of the parameters).
Proposition 5 writes it as a Jacobian norm, E||J_u f . u~||^2 / E||f||^2, which is the
``method="jvp"`` estimator; ``method="fd"`` is the finite difference of the definition.
Both are ratios of Monte-Carlo means; the standard error comes from the delta method.

Depth profiles S[x_hat_i], i = 1..N, of the appendix's stacks (modules F_i linear, d x d,
N(0, 1/fan_in), input x_0 ~ N(0, I) not a parameter), against their closed forms
(Prop. 8, App. C): feedforward N, pre-norm H_{N+1} - 1, post-norm N/2, no-norm N/2,
weighted residual sum_i beta^2 / V_i (-> (1 - alpha^2) N) and beta^2 N / (alpha^2 + beta^2),
RescaleNet H_N, AdMin H_{N+1} - 1 and, derived here from the concatenation rule (the
Catformer's main-text result is not in the seed), Catformer H_{N+1} - 1.

``norm="deterministic"`` divides by the exact expected scale sqrt(V_i) (the appendix's
"norm is dividing by a constant"); the closed forms are then exact in expectation at any
width. ``norm="layernorm"`` uses sqrt(dim) x / |x|, which removes the radial part of
every perturbation but also divides by the fluctuating norm (E[d/chi^2_d] = d/(d-2)): a
per-layer O(1/d) excess that compounds with depth; it is measured, not modelled.
"""

from __future__ import annotations

import math
from functools import lru_cache, partial

import jax
import jax.numpy as jnp
import numpy as np

from ..theory.precision import float64

ARCHS = (
    "feedforward",
    "pre-norm",
    "post-norm",
    "no-norm",
    "weighted-pre",
    "weighted-post",
    "rescalenet",
    "admin",
    "catformer",
)
NORMS = ("deterministic", "layernorm")


# --------------------------------------------------------------------------------------
# closed forms
# --------------------------------------------------------------------------------------
@float64
def harmonic(n):
    return float(sum(1.0 / k for k in range(1, int(n) + 1)))


@float64
def closed_form(arch, depth, alpha=0.5, beta=None):
    """S[x_hat_i] for i = 1..depth (numpy array). ``alpha``, ``beta`` only for the weighted
    residuals (beta defaults to sqrt(1 - alpha^2))."""
    beta = math.sqrt(1 - alpha**2) if beta is None else beta
    i = np.arange(1, depth + 1, dtype=float)
    if arch == "feedforward":
        return i
    if arch in ("pre-norm", "admin", "catformer"):
        return np.cumsum(1.0 / (i + 1))
    if arch in ("post-norm", "no-norm"):
        return i / 2
    if arch == "rescalenet":
        return np.cumsum(1.0 / i)
    if arch == "weighted-pre":
        V, out, s = 1.0, [], 0.0
        for _ in range(depth):
            V = alpha**2 * V + beta**2
            s += beta**2 / V
            out.append(s)
        return np.array(out)
    if arch == "weighted-post":
        return i * beta**2 / (alpha**2 + beta**2)
    raise ValueError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHS)}")


@float64
def variances(arch, depth, alpha=0.5, beta=None):
    """Expected per-component variance of the (un-normalised) sum before each norm."""
    beta = math.sqrt(1 - alpha**2) if beta is None else beta
    V, out = 1.0, []
    for i in range(1, depth + 1):
        if arch == "pre-norm":
            V = V + 1
        elif arch == "no-norm":
            V = 2 * V
        elif arch == "weighted-pre":
            V = alpha**2 * V + beta**2
        elif arch == "post-norm":
            V = 2.0
        elif arch == "weighted-post":
            V = alpha**2 + beta**2
        elif arch == "admin":
            V = i + 1.0
        else:
            V = 1.0
        out.append(V)
    return out


# --------------------------------------------------------------------------------------
# the stacks
# --------------------------------------------------------------------------------------
@float64
def init_params(key, arch, depth, d):
    """Linear modules W_i ~ N(0, 1/fan_in); the Catformer's fan-in grows as i d."""
    keys = jax.random.split(key, depth)
    fan = [(i + 1) * d if arch == "catformer" else d for i in range(depth)]
    return [jax.random.normal(k, (f, d), jnp.float64) / math.sqrt(f) for k, f in zip(keys, fan)]


@float64
def forward(params, x0, arch, alpha=0.5, beta=None, norm="deterministic"):
    """All normalised layer outputs x_hat_1..x_hat_N (list)."""
    beta = math.sqrt(1 - alpha**2) if beta is None else beta
    N = len(params)
    Vs = variances(arch, N, alpha, beta)

    def nrm(x, V):
        if norm == "deterministic":
            return x / math.sqrt(V)
        if norm == "layernorm":
            return x * jnp.sqrt(x.shape[-1] / jnp.sum(x * x, axis=-1, keepdims=True))
        raise ValueError(f"unknown norm {norm!r}; choose one of {', '.join(NORMS)}")

    x, V, outs = x0, 1.0, []
    for i, W in enumerate(params, start=1):
        Vn = Vs[i - 1]
        if arch == "feedforward":
            x = x @ W
            xh = x
        elif arch == "pre-norm":
            x = x + nrm(x, V) @ W
            xh = nrm(x, Vn)
        elif arch == "weighted-pre":
            x = alpha * x + beta * nrm(x, V) @ W
            xh = nrm(x, Vn)
        elif arch == "no-norm":
            x = x + x @ W
            xh = nrm(x, Vn)
        elif arch == "post-norm":
            x = nrm(x + x @ W, Vn)
            xh = x
        elif arch == "weighted-post":
            x = nrm(alpha * x + beta * (x @ W), Vn)
            xh = x
        elif arch == "admin":
            x = nrm(math.sqrt(i) * x + x @ W, Vn)
            xh = x
        elif arch == "rescalenet":
            x = math.sqrt((i - 1) / i) * x + math.sqrt(1 / i) * (x @ W)
            xh = x
        elif arch == "catformer":
            x = jnp.concatenate([x, nrm(x, 1.0) @ W], axis=-1)
            xh = nrm(x, 1.0)
        else:
            raise ValueError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHS)}")
        V = Vn
        outs.append(xh)
    return outs


# --------------------------------------------------------------------------------------
# estimator
# --------------------------------------------------------------------------------------
def _ratio(a, b):
    """mean(a)/mean(b) with a delta-method standard error (a, b: [draws, ...])."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    n = a.shape[0]
    ma, mb = a.mean(0), b.mean(0)
    r = ma / mb
    va, vb = a.var(0, ddof=1), b.var(0, ddof=1)
    cab = ((a - ma) * (b - mb)).sum(0) / (n - 1)
    se = np.sqrt(np.maximum(va - 2 * r * cab + r**2 * vb, 0.0) / n) / mb
    return r, se


@float64
def estimate(f, sample_params, sample_input, key, draws=256, method="jvp", delta=1e-5):
    """Sensitivity of every output of ``f(params, x)`` (a pytree of arrays) w.r.t. params.

    params ~ sample_params(key), perturbation ~ sample_params(other key) (the init
    distribution, Definition 2), x ~ sample_input(key). Returns (S, se) per output leaf."""
    num, den = _estimator(f, sample_params, sample_input, method, delta)(jax.random.split(key, draws))
    return _ratio(num, den)


def _estimator(f, sample_params, sample_input, method, delta):
    def one(k):
        kp, kt, kx = jax.random.split(k, 3)
        p, t, x = sample_params(kp), sample_params(kt), sample_input(kx)
        g = lambda q: f(q, x)
        if method == "jvp":
            y, dy = jax.jvp(g, (p,), (t,))
        elif method == "fd":
            y = g(p)
            yp = g(jax.tree_util.tree_map(lambda a, b: a + delta * b, p, t))
            dy = jax.tree_util.tree_map(lambda u, v: (u - v) / delta, yp, y)
        else:
            raise ValueError(f"unknown method {method!r}; choose jvp or fd")
        sq = lambda tree: jnp.stack([jnp.sum(jnp.square(a)) for a in jax.tree_util.tree_leaves(tree)])
        return sq(dy), sq(y)

    return jax.jit(jax.vmap(one))


@float64
def profile(
    arch, depth=8, width=32, draws=256, key=None, alpha=0.5, beta=None, norm="deterministic", method="jvp", delta=1e-5
):
    """Measured S[x_hat_i], i = 1..depth, with standard errors, and the closed form."""
    key = jax.random.PRNGKey(0) if key is None else key
    est = _profile_estimator(
        arch, int(depth), int(width), float(alpha), None if beta is None else float(beta), norm, method, float(delta)
    )
    S, se = _ratio(*est(jax.random.split(key, draws)))
    return dict(
        arch=arch,
        depth=depth,
        width=width,
        draws=draws,
        norm=norm,
        method=method,
        S=S,
        se=se,
        theory=closed_form(arch, depth, alpha, beta),
    )


@lru_cache(maxsize=64)
def _profile_estimator(arch, depth, width, alpha, beta, norm, method, delta):
    f = partial(forward, arch=arch, alpha=alpha, beta=beta, norm=norm)
    return _estimator(
        lambda p, x: f(p, x),
        lambda k: init_params(k, arch, depth, width),
        lambda k: jax.random.normal(k, (width,), jnp.float64),
        method,
        delta,
    )


# --------------------------------------------------------------------------------------
# the seed-001 block
# --------------------------------------------------------------------------------------
@float64
def block_sensitivity(
    alpha_a,
    alpha_m,
    sigma_w=1.0,
    sigma_a=1.0,
    n_tokens=8,
    width=32,
    rho0=0.5,
    draws=64,
    key=None,
    activation="tanh",
    residual="unit-norm",
    method="jvp",
):
    """Sensitivity of one phasefield.block.Block output to all its weights, at input tokens
    with q = 1 and cosine rho0 (fresh tokens per draw), perturbations from Block.init."""
    from .. import HParams
    from ..block import Block

    hp = HParams(
        sigma_w=sigma_w,
        sigma_a=sigma_a,
        alpha_a=alpha_a,
        alpha_m=alpha_m,
        n_tokens=n_tokens,
        activation=activation,
        residual=residual,
    )
    blk = Block(hp)
    key = jax.random.PRNGKey(0) if key is None else key
    x_shape = jnp.zeros((n_tokens, width), jnp.float64)
    sample_params = lambda k: blk.init(k, x_shape)["params"]

    def sample_input(k):
        k1, k2 = jax.random.split(k)
        g = jax.random.normal(k1, (1, width), jnp.float64)
        e = jax.random.normal(k2, (n_tokens, width), jnp.float64)
        return math.sqrt(rho0) * g + math.sqrt(1 - rho0) * e

    S, se = estimate(lambda p, x: blk.apply({"params": p}, x), sample_params, sample_input, key, draws, method)
    return float(S[0]), float(se[0])


@float64
def block_grid(alpha_a_values, alpha_m_values, **kw):
    S = np.zeros((len(alpha_a_values), len(alpha_m_values)))
    se = np.zeros_like(S)
    for i, aa in enumerate(alpha_a_values):
        for j, am in enumerate(alpha_m_values):
            S[i, j], se[i, j] = block_sensitivity(float(aa), float(am), **kw)
    return S, se
