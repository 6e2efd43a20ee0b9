"""DeepScaleLM moment propagation (Kedia et al. 2024; seed 002).

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
  r_out = 1; gradient variance r_g * var_g).
* ``exact=True`` (default): the same derivation keeping the finite-L and softmax-fluctuation
  terms (log-normal softmax of App. A.7): with s = (1 - r) var_logit the within-row and
  c = r (1 - r) var_logit the across-row covariance of the centred logits,
  var_out = var_in [r + (1 - r) e^s / L],  cov_out = var_in [r + (1 - r) e^c / L].

The attention block is  W_V -> softmax attention -> W_O -> dropout; the FFN block is
W_1 (d -> m d) -> ReLU -> W_2 (m d -> d) -> dropout (m = 4). Backward rules include the
value path only; the query/key path is measured by simulation (``simulate_stack``).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

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
def linear(x: Fwd, d_in, sigma_w2) -> Fwd:
    """x W, W ~ N(0, sigma_w2): mu 0, var d_in s^2 (var + mu^2), r (r var + mu^2)/(var + mu^2)."""
    m2 = x.var + x.mu**2
    return Fwd(0.0 * x.mu, d_in * sigma_w2 * m2, (x.r * x.var + x.mu**2) / m2)


def linear_bwd(g: Bwd, d_out, sigma_w2) -> Bwd:
    return Bwd(d_out * sigma_w2 * g.var, g.r)


def dropout(x: Fwd, p) -> Fwd:
    """Inverted dropout: var (var + p mu^2)/(1-p), r r var (1-p)/(var + p mu^2)."""
    den = x.var + p * x.mu**2
    return Fwd(x.mu, den / (1 - p), x.r * x.var * (1 - p) / den)


def dropout_bwd(g: Bwd, p) -> Bwd:
    return Bwd(g.var / (1 - p), (1 - p) * g.r)


def relu_corr(r, approx=False):
    """Correlation of ReLU outputs of zero-mean unit-correlation-r Gaussians: the exact
    arc-cosine kernel [sqrt(1-r^2) + (pi - arccos r) r - 1] / (pi - 1), or 0.7 r + 0.3 r^2."""
    r = jnp.clip(jnp.asarray(r, jnp.float64), -1.0, 1.0)
    if approx:
        return 0.7 * r + 0.3 * r**2
    return (jnp.sqrt(1 - r**2) + (jnp.pi - jnp.arccos(r)) * r - 1) / (jnp.pi - 1)


def relu(x: Fwd, approx=False) -> Fwd:
    """ReLU of zero-mean Gaussian input (App. A.4)."""
    s2 = x.var
    return Fwd(jnp.sqrt(s2 / (2 * jnp.pi)), s2 * (1 - 1 / jnp.pi) / 2, relu_corr(x.r, approx))


def relu_bwd(g: Bwd, r_in) -> Bwd:
    """var/2, r_g (1/2 + arcsin(r_in)/pi)."""
    return Bwd(g.var / 2, g.r * (0.5 + jnp.arcsin(jnp.clip(r_in, -1, 1)) / jnp.pi))


def layernorm(x: Fwd) -> Fwd:
    """LayerNorm (no affine): mean 0, variance 1, correlation unchanged."""
    return Fwd(0.0 * x.mu, 1.0 + 0.0 * x.var, x.r)


def layernorm_bwd(g: Bwd, var_in, d=None) -> Bwd:
    """var_g / var_in; with ``d`` the projection onto the (d-2)-dim complement of 1 and x
    is kept: factor (d-2)/d (derived)."""
    f = 1.0 if d is None else (d - 2) / d
    return Bwd(f * g.var / var_in, g.r)


def softmax(var_logit, r_logit, L):
    """Softmax over L logits of variance var_logit and mutual correlation r_logit
    (log-normal approximation, App. A.7 of the paper): (mean, variance) of one entry."""
    s = (1 - r_logit) * var_logit
    return 1.0 / L, jnp.expm1(s) / L**2


def softmax_bwd(g: Bwd, var_logit, r_logit, L) -> Bwd:
    s = (1 - r_logit) * var_logit
    return Bwd(jnp.exp(s) / L**2 * g.var, g.r)


def sha(v: Fwd, L, var_logit=0.0, exact=True) -> Fwd:
    """Value mixing A V of one attention head (zero-mean V with var, r across tokens)."""
    if not exact:
        return Fwd(0.0 * v.mu, v.r * v.var, 1.0 + 0.0 * v.r)
    es = jnp.exp((1 - v.r) * var_logit)
    ec = jnp.exp(v.r * (1 - v.r) * var_logit)
    var = v.var * (v.r + (1 - v.r) * es / L)
    cov = v.var * (v.r + (1 - v.r) * ec / L)
    return Fwd(0.0 * v.mu, var, cov / var)


def sha_bwd(g: Bwd, L, var_logit=0.0, r_in=0.0, exact=True) -> Bwd:
    """A^T g (value path): var_g [e^s/L + r_g (1 - 1/L) e^c], s = (1 - r_in) var_logit,
    c = r_in (1 - r_in) var_logit."""
    if not exact:
        return Bwd(g.r * g.var, 1.0 + 0.0 * g.r)
    es = jnp.exp((1 - r_in) * var_logit)
    ec = jnp.exp(r_in * (1 - r_in) * var_logit)
    var = g.var * (es / L + g.r * (1 - 1 / L) * ec)
    cov = g.var * ((1 - es / L) / (L - 1) + g.r * (1 - 1 / L))
    return Bwd(var, cov / var)


# --------------------------------------------------------------------------------------
# blocks (Table 2)
# --------------------------------------------------------------------------------------
def logit_variance(x: Fwd, d, sigma_qk2):
    """Variance of q.k/sqrt(d) with q = x W_Q, k = x W_K: (d s_q^2)(d s_k^2)(var + mu^2)^2."""
    return (d * sigma_qk2) ** 2 * (x.var + x.mu**2) ** 2


def attention_block(x: Fwd, d, L, init, p=0.0, exact=True):
    """W_V -> attention -> W_O -> dropout. Returns the output moments and a cache."""
    v = linear(x, d, init["v"])
    s2 = logit_variance(x, d, init["qk"]) if exact else 0.0
    h = sha(v, L, s2, exact)
    o = linear(h, d, init["o"])
    return dropout(o, p), dict(r_v=v.r, s2=s2)


def attention_block_bwd(g: Bwd, cache, d, L, init, p=0.0, exact=True) -> Bwd:
    g = dropout_bwd(g, p)
    g = linear_bwd(g, d, init["o"])
    g = sha_bwd(g, L, cache["s2"], cache["r_v"], exact)
    return linear_bwd(g, d, init["v"])


def ffn_block(x: Fwd, d, init, p=0.0, mult=4, approx=False):
    """W_1 (d -> m d) -> ReLU -> W_2 -> dropout (input assumed zero-mean)."""
    h = linear(x, d, init["w1"])
    a = relu(h, approx)
    o = linear(a, mult * d, init["w2"])
    return dropout(o, p), dict(r_h=h.r)


def ffn_block_bwd(g: Bwd, cache, d, init, p=0.0, mult=4) -> Bwd:
    g = dropout_bwd(g, p)
    g = linear_bwd(g, d, init["w2"])
    g = relu_bwd(g, cache["r_h"])
    return linear_bwd(g, mult * d, init["w1"])


def residual(x: Fwd, y: Fwd, lam2, beta2) -> Fwd:
    """lam x + beta y with y uncorrelated with x (fresh zero-mean weights)."""
    var = lam2 * x.var + beta2 * y.var
    return Fwd(0.0 * x.mu, var, (lam2 * x.r * x.var + beta2 * y.r * y.var) / var)


def residual_bwd(g: Bwd, gb: Bwd, lam2, beta2) -> Bwd:
    var = lam2 * g.var + beta2 * gb.var
    return Bwd(var, (lam2 * g.r * g.var + beta2 * gb.r * gb.var) / var)


# --------------------------------------------------------------------------------------
# initialisations and scalings (Section 3.5)
# --------------------------------------------------------------------------------------
def dslm_scaling(layers, k=2.0, alpha=1.0):
    """beta^2 = k / N^alpha, lambda^2 = 1 - beta^2."""
    beta2 = k / float(layers) ** alpha
    if not 0 < beta2 <= 1:
        raise ValueError(f"beta^2 = k / N^alpha = {beta2:g} must lie in (0, 1]")
    return 1.0 - beta2, beta2


def xavier_init(d, mult=4):
    """Glorot: 2 / (fan_in + fan_out) for every matrix."""
    return dict(qk=1.0 / d, v=1.0 / d, o=1.0 / d, w1=2.0 / ((1 + mult) * d), w2=2.0 / ((1 + mult) * d))


def dslm_init(d, p=0.0, mult=4, r=None, L=None, exact=True):
    """DeepScaleLM: sigma_w1^2 = sigma_w2^2 = (1/d) sqrt((1-p)/(mult/2)) (unit FFN output;
    the paper's (1/d) sqrt((1-p)/2) is the mult = 4 case written per 4d fan-in), and
    sigma_v^2 = sigma_o^2 chosen so the attention block output variance is 1 at input
    correlation r (``r=None``: the 'simple' init, same as the FFN)."""
    f = 1.0 / d * math.sqrt((1 - p) / (mult / 2))
    init = dict(qk=1.0 / d, v=f, o=f, w1=f, w2=f)
    if r is not None:
        eff = r if not exact else None
        if exact:
            s2 = logit_variance(Fwd(0.0, 1.0, r), d, init["qk"])
            eff = r + (1 - r) * math.exp((1 - r) * s2) / L
        init["v"] = init["o"] = 1.0 / d * math.sqrt((1 - p) / eff)
    return init


# --------------------------------------------------------------------------------------
# whole stacks (App. E)
# --------------------------------------------------------------------------------------
def stack(arch="pre-ln", layers=4, d=256, L=64, init="xavier", p=0.0, lam2=1.0, beta2=1.0,
          var0=1.0, r0=0.2, g_var=1.0, g_r=0.0, exact=True, approx=False, mult=4, ln_exact=False):
    """Moments through ``layers`` transformer layers (attention + FFN sublayers).

    Returns dict of numpy arrays over the 2 * layers + 1 sublayer boundaries: forward
    ``var``, ``r`` of x_l (x_0 = input) and backward ``g_var``, ``g_r`` of dLoss/dx_l for an
    output gradient of variance g_var and token correlation g_r. ``init`` is a name in INITS
    or a dict (keys qk, v, o, w1, w2); 'dslm' re-solves sigma_v, sigma_o per layer."""
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHS)}")
    x = Fwd(0.0, float(var0), float(r0))
    xs, caches, inits = [x], [], []
    for sub in range(2 * layers):
        kind = "attn" if sub % 2 == 0 else "ffn"
        ini = _resolve_init(init, d, p, mult, x, L, exact, arch)
        xin = layernorm(x) if arch == "pre-ln" else x
        if kind == "attn":
            y, c = attention_block(xin, d, L, ini, p, exact)
        else:
            y, c = ffn_block(xin, d, ini, p, mult, approx)
        u = residual(x, y, lam2, beta2)
        caches.append((kind, c, ini, x, u))
        x = u if arch == "pre-ln" else layernorm(u)
        xs.append(x)
    g = Bwd(float(g_var), float(g_r))
    gs = [g]
    for kind, c, ini, xin_, u in reversed(caches):
        if arch == "post-ln":
            g = layernorm_bwd(g, u.var, d if ln_exact else None)
        gb = Bwd(g.var, g.r)
        if kind == "attn":
            gb = attention_block_bwd(gb, c, d, L, ini, p, exact)
        else:
            gb = ffn_block_bwd(gb, c, d, ini, p, mult)
        if arch == "pre-ln":
            gb = layernorm_bwd(gb, xin_.var, d if ln_exact else None)
        g = residual_bwd(g, gb, lam2, beta2)
        gs.append(g)
    gs = gs[::-1]
    return dict(var=np.array([float(v.var) for v in xs]), r=np.array([float(v.r) for v in xs]),
                g_var=np.array([float(v.var) for v in gs]), g_r=np.array([float(v.r) for v in gs]),
                inits=inits)


def _resolve_init(init, d, p, mult, x, L, exact, arch):
    if isinstance(init, dict):
        return init
    if init == "xavier":
        return xavier_init(d, mult)
    if init == "dslm-simple":
        return dslm_init(d, p, mult)
    if init == "dslm":
        return dslm_init(d, p, mult, r=float(x.r), L=L, exact=exact)
    raise ValueError(f"unknown init {init!r}; choose one of {', '.join(INITS)}")


# --------------------------------------------------------------------------------------
# simulation
# --------------------------------------------------------------------------------------
def _ln(x, eps=1e-12):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    xc = x - mu
    return xc / jnp.sqrt(jnp.mean(xc * xc, axis=-1, keepdims=True) + eps)


def _moments(x):
    """(sum of x, sum of x^2, sum over token pairs i != j of x_ik x_jk, count) per tensor."""
    n, d = x.shape[-2:]
    s = jnp.sum(x)
    s2 = jnp.sum(x * x)
    col = jnp.sum(x, axis=-2)
    pair = jnp.sum(col * col) - s2
    return jnp.stack([s, s2, pair, jnp.asarray(n * d, x.dtype)])


def simulate_stack(key, arch="pre-ln", layers=4, d=64, L=16, init="xavier", p=0.0, lam2=1.0,
                   beta2=1.0, var0=1.0, r0=0.2, draws=8, mult=4, qk_grad=True, exact=True):
    """Finite-width simulation of the stack of ``stack`` (same init, scaling, dropout).

    Per draw: random weights, random Gaussian input with (var0, r0), random dropout masks,
    an i.i.d. N(0, 1) output gradient. ``qk_grad=False`` stops the gradient through the
    query/key path (isolating the value path the theory models). Returns the measured
    var, r of x_l and g_var, g_r of dLoss/dx_l (ratio of means over draws)."""
    n_sub = 2 * layers
    th = stack(arch, layers, d, L, init, p, lam2, beta2, var0, r0, exact=exact, mult=mult)
    inits = []
    x = Fwd(0.0, float(var0), float(r0))
    for sub in range(n_sub):  # per-sublayer weight variances (dslm re-solves them)
        inits.append(_resolve_init(init, d, p, mult, Fwd(0.0, th["var"][sub], th["r"][sub]), L,
                                   exact, arch))
    sv = {k: jnp.array([ini[k] for ini in inits]) for k in ("qk", "v", "o", "w1", "w2")}
    lam, beta = math.sqrt(lam2), math.sqrt(beta2)

    def one(k):
        kx, kw, kd, kg = jax.random.split(k, 4)
        g0, e0 = jax.random.normal(kx, (2, L, d), jnp.float64)
        x0 = math.sqrt(var0) * (math.sqrt(r0) * g0[:1] + math.sqrt(1 - r0) * e0)
        kws = jax.random.split(kw, n_sub)
        kds = jax.random.split(kd, n_sub)

        def sublayer(x, xin, kk, sub_v, is_attn):
            ks = jax.random.split(kk, 4)
            if is_attn:
                sq = jnp.sqrt(sub_v["qk"])
                WQ = jax.random.normal(ks[0], (d, d)) * sq
                WK = jax.random.normal(ks[1], (d, d)) * sq
                WV = jax.random.normal(ks[2], (d, d)) * jnp.sqrt(sub_v["v"])
                WO = jax.random.normal(ks[3], (d, d)) * jnp.sqrt(sub_v["o"])
                xq = xin if qk_grad else jax.lax.stop_gradient(xin)
                A = jax.nn.softmax((xq @ WQ) @ (xq @ WK).T / math.sqrt(d), axis=-1)
                return A @ (xin @ WV) @ WO
            W1 = jax.random.normal(ks[0], (d, mult * d)) * jnp.sqrt(sub_v["w1"])
            W2 = jax.random.normal(ks[1], (mult * d, d)) * jnp.sqrt(sub_v["w2"])
            return jax.nn.relu(xin @ W1) @ W2

        def f(probes):
            def layer(x, inp):
                kw2, kd2, v2, pr2 = inp
                outs = []
                for j in range(2):
                    xin = _ln(x) if arch == "pre-ln" else x
                    y = sublayer(x, xin, kw2[j], {k: v[j] for k, v in v2.items()}, j == 0)
                    if p > 0:
                        keep = jax.random.bernoulli(kd2[j], 1 - p, y.shape)
                        y = jnp.where(keep, y / (1 - p), 0.0)
                    u = lam * x + beta * y
                    x = (u if arch == "pre-ln" else _ln(u)) + pr2[j]
                    outs.append(x)
                return x, jnp.stack(outs)

            x = x0 + probes[0]
            pair = lambda a: a.reshape((layers, 2) + a.shape[1:])
            _, outs = jax.lax.scan(layer, x, (pair(kws), pair(kds), {k: pair(v) for k, v in sv.items()},
                                              pair(probes[1:])))
            return jnp.concatenate([x[None], outs.reshape((n_sub, L, d))])

        probes = jnp.zeros((n_sub + 1, L, d))
        outs, vjp = jax.vjp(f, probes)
        gout = jnp.zeros_like(outs).at[-1].set(jax.random.normal(kg, (L, d)))
        (gp,) = vjp(gout)
        return jax.vmap(_moments)(outs), jax.vmap(_moments)(gp)

    mx, mg = jax.jit(jax.vmap(one))(jax.random.split(key, draws))
    mx, mg = np.asarray(mx).sum(0), np.asarray(mg).sum(0)
    out = {}
    for name, m in (("", mx), ("g_", mg)):
        cnt = m[:, 3]
        mu = m[:, 0] / cnt
        var = m[:, 1] / cnt - mu**2
        r = (m[:, 2] / (cnt * (L - 1)) - mu**2) / var
        out[name + "var"], out[name + "r"] = var, r
    out["theory"] = th
    return out


def validate(key, archs=ARCHS, widths=(64, 128, 256), depths=(1, 2, 4, 8), inits=("xavier", "dslm"),
             p=0.1, L=32, draws=8, r0=0.2, k=2.0, qk_grad=False, exact=True):
    """Relative errors |theory - sim| / |sim| of var, r (forward) and g_var (backward) at
    every sublayer boundary over a grid; returns rows and 50/90/99th percentiles."""
    rows = []
    for arch in archs:
        for init in inits:
            for d in widths:
                for N in depths:
                    lam2, beta2 = dslm_scaling(N, min(k, N)) if init.startswith("dslm") else (1.0, 1.0)
                    key, sub = jax.random.split(key)
                    sim = simulate_stack(sub, arch, N, d, L, init, p, lam2, beta2, 1.0, r0, draws,
                                         qk_grad=qk_grad, exact=exact)
                    th = sim["theory"]
                    for q in ("var", "r", "g_var"):
                        err = np.abs(th[q][1:] - sim[q][1:]) / np.abs(sim[q][1:])
                        if q == "g_var":
                            err = np.abs(th[q][:-1] - sim[q][:-1]) / np.abs(sim[q][:-1])
                        rows.append(dict(arch=arch, init=init, width=d, depth=N, quantity=q,
                                         max_rel_err=float(err.max()), errs=err.tolist()))
    summary = {}
    for q in ("var", "r", "g_var"):
        e = np.concatenate([r["errs"] for r in rows if r["quantity"] == q])
        summary[q] = {f"p{k}": float(np.percentile(e, k)) for k in (50, 90, 99)}
    return rows, summary
