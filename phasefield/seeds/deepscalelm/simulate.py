"""Finite-width Monte Carlo of the DeepScaleLM moment rules: one attention head
(``simulate_sha``), whole stacks (``simulate_stack``) and the validation grid (``validate``)."""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from ..._runtime import optimized_jit
from ...theory.precision import float64
from .moments import ARCHS, dslm_scaling, stack

PATHS = ("value", "query", "key", "all")


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


def _correlated(key, shape, r):
    """Gaussian rows of unit variance and mutual correlation r (a shared row plus noise)."""
    z = jax.random.normal(key, (shape[0] + 1,) + shape[1:], jnp.float64)
    return jnp.sqrt(r) * z[:1] + jnp.sqrt(1 - r) * z[1:]


def _kappa(x):
    """Token-covariance anisotropy d tr(S^2)/(tr S)^2 of the population behind the L rows
    of x (S = their covariance): the sample value, less its finite-L bias
    (E tr(S_hat^2) = (1 + 1/m) tr(S^2) + (tr S)^2 / m, m = L - 1, for Gaussian rows)."""
    L, d = x.shape
    xc = x - jnp.mean(x, axis=0)
    s = xc.T @ xc / (L - 1)
    tr = jnp.trace(s)
    m = L - 1
    return (d * jnp.sum(s * s) / (tr * tr) - d / m) / (1 + 1 / m)


@functools.cache
def _sha_draws(L, d_in, d_v):
    """The compiled draws of :func:`simulate_sha`: one program per structure (sizes, and
    whether the tokens have a spectrum: ``None`` or an array, told apart by jit's own cache;
    the draws' batching is the keys' shape); the numbers (r,
    var_logit, r_g, the variances, the spectrum) are arguments, so a new configuration
    compiles nothing."""

    def one(k, nums, spectrum):
        var_x, r = nums["var_x"], nums["r"]
        sq = jnp.sqrt(jnp.sqrt(nums["var_logit"]) / (d_in * var_x))
        sv = jnp.sqrt(nums["sv2"])
        kx, kq, kk, kv, kg, ko = jax.random.split(k, 6)
        if spectrum is None:
            X = jnp.sqrt(var_x) * _correlated(kx, (L, d_in), r)
        else:
            rot = jnp.linalg.qr(jax.random.normal(ko, (d_in, d_in), jnp.float64))[0]
            z = jax.random.normal(kx, (L + 1, d_in), jnp.float64)
            dev = (z[1:] * jnp.sqrt(spectrum)) @ rot.T
            X = jnp.sqrt(var_x) * (jnp.sqrt(r) * z[:1] + jnp.sqrt(1 - r) * dev)
        WQ = jax.random.normal(kq, (d_in, d_v), jnp.float64) * sq
        WK = jax.random.normal(kk, (d_in, d_v), jnp.float64) * sq
        WV = jax.random.normal(kv, (d_in, d_v), jnp.float64) * sv
        G = jnp.sqrt(nums["var_g"]) * _correlated(kg, (L, d_v), nums["r_g"])

        def f(xq, xk, xv):
            A = jax.nn.softmax((xq @ WQ) @ (xk @ WK).T / math.sqrt(d_v), axis=-1)
            return A @ (xv @ WV)

        O, vjp = jax.vjp(f, X, X, X)
        gq, gk, gv = vjp(G)
        return jax.vmap(_moments)(jnp.stack([O, gv, gq, gk, gq + gk + gv]))

    many = jax.vmap(one, (0, None, None))
    return jax.jit(lambda keys, nums, spectrum: jax.lax.map(lambda k: many(k, nums, spectrum), keys))


@float64
def simulate_sha(
    key, L, d_in, d_v, r, var_logit, r_g=0.0, draws=64, var_x=1.0, var_g=1.0, sigma_v2=None, batch=8, spectrum=None
):
    """Monte Carlo of one head O = softmax(X W_Q (X W_K)^T / sqrt(d_v)) X W_V.

    X: L tokens of width d_in, entries N(0, var_x), token correlation r; W_Q, W_K with
    sigma^2 = sqrt(var_logit)/(d_in var_x) so the logits have variance var_logit;
    W_V ~ N(0, sigma_v2) (default 1/d_in); output gradient N(0, var_g), token correlation
    r_g. ``spectrum`` (d_in values, mean 1): the token deviations get that covariance
    spectrum in a random orientation per draw (anisotropic tokens, kappa = d_in sum s^2 /
    (sum s)^2); default isotropic. Returns per-draw means and standard errors of the per-entry second moment
    ``var`` and the cross-token ``cov`` of the output (key ``out``) and of dLoss/dX through
    each path of ``PATHS`` (value: through V; query, key: through the logits)."""
    sv2 = 1.0 / d_in if sigma_v2 is None else sigma_v2
    nums = {
        k: jnp.asarray(v, jnp.float64)
        for k, v in dict(r=r, var_logit=var_logit, r_g=r_g, var_x=var_x, var_g=var_g, sv2=sv2).items()
    }
    spec = None if spectrum is None else jnp.asarray(spectrum, jnp.float64)
    keys = jax.random.split(key, draws).reshape(-1, batch, 2)
    m = np.asarray(_sha_draws(L, d_in, d_v)(keys, nums, spec)).reshape(draws, 5, 4)
    cnt = m[..., 3]
    stats = np.stack([m[..., 1] / cnt, m[..., 2] / (cnt * (L - 1))], -1)  # draws x 5 x (var, cov)
    mean, se = stats.mean(0), stats.std(0, ddof=1) / math.sqrt(draws)
    return {
        name: dict(var=mean[i, 0], var_se=se[i, 0], cov=mean[i, 1], cov_se=se[i, 1])
        for i, name in enumerate(("out",) + PATHS)
    }


@functools.cache
def _stack_draws(arch, layers, d, L, mult, qk_grad, dropout, batch):
    """The compiled draws of :func:`simulate_stack`: one program per structure (architecture,
    sizes, whether dropout is on, the batch); the numbers (init variances, lambda, beta, the
    input's var0, r0, the dropout rate) are arguments, so a new configuration compiles
    nothing. ``batch``: draws run that many at a time (None: all at once)."""
    n_sub = 2 * layers

    def one(k, nums):
        sv, lam, beta, p = nums["sv"], nums["lam"], nums["beta"], nums["p"]
        kx, kw, kd, kg = jax.random.split(k, 4)
        x0 = jnp.sqrt(nums["var0"]) * _correlated(kx, (L, d), nums["r0"])
        kws = jax.random.split(kw, n_sub)
        kds = jax.random.split(kd, n_sub)

        def f(probes):
            def layer(x, inp):
                kw2, kd2, v2, pr2 = inp
                outs, kall = [], []
                for j in range(2):
                    xin = _ln(x) if arch == "pre-ln" else x
                    if j == 0:
                        kap = _kappa(jax.lax.stop_gradient(xin))
                    y = branch(kw2[j], {k: v[j] for k, v in v2.items()}, d, j == 0, mult, qk_grad)(xin)
                    if dropout:
                        keep = jax.random.bernoulli(kd2[j], 1 - p, y.shape)
                        y = jnp.where(keep, y / (1 - p), 0.0)
                    u = lam * x + beta * y
                    x = (u if arch == "pre-ln" else _ln(u)) + pr2[j]
                    outs.append(x)
                    kall.append(_kappa(jax.lax.stop_gradient(x)))
                return x, (jnp.stack(outs), kap, jnp.stack(kall))

            x = x0 + probes[0]
            pair = lambda a: a.reshape((layers, 2) + a.shape[1:])
            _, (outs, kaps, kall) = jax.lax.scan(
                layer, x, (pair(kws), pair(kds), {k: pair(v) for k, v in sv.items()}, pair(probes[1:]))
            )
            kall = jnp.concatenate([_kappa(jax.lax.stop_gradient(x))[None], kall.reshape(n_sub)])
            return jnp.concatenate([x[None], outs.reshape((n_sub, L, d))]), (kaps, kall)

        probes = jnp.zeros((n_sub + 1, L, d))
        outs, vjp, (kaps, kall) = jax.vjp(f, probes, has_aux=True)
        gout = jnp.zeros_like(outs).at[-1].set(jax.random.normal(kg, (L, d)))
        (gp,) = vjp(gout)
        n, e = jnp.mean(outs * outs, -1), jnp.mean(gp * gp, -1)  # per token: (boundary, L)
        ne = jnp.stack([n.sum(-1), e.sum(-1), (n * e).sum(-1), (n * n).sum(-1)], -1)
        return jax.vmap(_moments)(outs), jax.vmap(_moments)(gp), kaps, kall, ne

    many = jax.vmap(one, (0, None))
    if batch is None:
        return optimized_jit(many)

    def batched(keys, nums):
        out = jax.lax.map(lambda k: many(k, nums), keys.reshape((-1, batch) + keys.shape[1:]))
        return tuple(v.reshape((keys.shape[0],) + v.shape[2:]) for v in out)

    return optimized_jit(batched)


@float64
def simulate_stack(
    key,
    arch="pre-ln",
    layers=4,
    d=64,
    L=16,
    init="xavier",
    p=0.0,
    lam2=1.0,
    beta2=1.0,
    var0=1.0,
    r0=0.2,
    draws=8,
    mult=4,
    qk_grad=True,
    exact=True,
    ln_exact=True,
    batch=64,
    kappa=None,
):
    """Finite-width simulation of the stack of ``stack`` (same init, scaling, dropout).
    Draws run ``batch`` at a time (vmapped; memory bounded by the batch).

    Per draw: random weights, random Gaussian input with (var0, r0), random dropout masks,
    an i.i.d. N(0, 1) output gradient. ``qk_grad=False`` stops the gradient through the
    query/key path (the theory then keeps the value path only). Returns the measured
    var, r of x_l and g_var, g_r of dLoss/dx_l (ratio of means over draws; ``*_se`` their
    jackknife standard errors) and the
    ``theory`` (``stack`` with the same settings), and ``kappa``: the token-covariance
    anisotropy d tr(S^2)/(tr S)^2 at each attention sublayer's input (mean over draws), which
    ``stack(kappa=...)`` accepts, and ``kappa_all`` at every sublayer boundary x_l (``*_se``:
    standard errors over draws). ``kappa`` is passed to ``stack`` (e.g. "auto").
    ``g_norm_response``: at every boundary, the response c of a token's gradient energy to its
    norm deviation delta = |x|^2 / E|x|^2 - 1, Cov(|g|^2, delta) / (E|g|^2 Var delta) over tokens
    and draws (``stack``'s ``g_norm_response``; ``_se`` by jackknife over draws; NaN where the
    norms do not vary)."""
    th = stack(
        arch,
        layers,
        d,
        L,
        init,
        p,
        lam2,
        beta2,
        var0,
        r0,
        exact=exact,
        mult=mult,
        ln_exact=ln_exact,
        qk_grad=qk_grad,
        kappa=kappa,
    )
    numbers = dict(
        sv={k: jnp.array([ini[k] for ini in th["inits"]]) for k in ("qk", "v", "o", "w1", "w2")},
        lam=jnp.float64(math.sqrt(lam2)),
        beta=jnp.float64(math.sqrt(beta2)),
        var0=jnp.float64(var0),
        r0=jnp.float64(r0),
        p=jnp.float64(p),
    )
    keys = jax.random.split(key, draws)
    by = batch if draws > batch and draws % batch == 0 else None
    mx, mg, kaps, kall, ne = _stack_draws(arch, layers, d, L, mult, qk_grad, p > 0, by)(keys, numbers)
    kaps, kall = np.asarray(kaps), np.asarray(kall)
    out = {
        "kappa": kaps.mean(0),
        "kappa_se": kaps.std(0, ddof=1) / math.sqrt(draws) if draws > 1 else np.nan,
        "kappa_all": kall.mean(0),
        "kappa_all_se": kall.std(0, ddof=1) / math.sqrt(draws) if draws > 1 else np.nan,
    }
    for name, m in (("", np.asarray(mx)), ("g_", np.asarray(mg))):
        total = m.sum(0)
        out[name + "var"], out[name + "r"] = _var_r(total, L)
        # jackknife (leave one draw out) standard errors of the ratio-of-means estimates
        loo = [_var_r(total - m[i], L) for i in range(draws)] if draws > 1 else []
        for j, q in enumerate(("var", "r")):
            est = np.array([v[j] for v in loo]) if loo else np.full((1,) + total.shape[:1], np.nan)
            out[name + q + "_se"] = np.sqrt((draws - 1) / max(draws, 1) * np.sum((est - est.mean(0)) ** 2, 0))
    ne = np.asarray(ne)
    total = ne.sum(0)
    out["g_norm_response"] = _response(total, draws * L)
    loo = np.array([_response(total - ne[i], (draws - 1) * L) for i in range(draws)]) if draws > 1 else None
    out["g_norm_response_se"] = (
        np.sqrt((draws - 1) / draws * np.sum((loo - loo.mean(0)) ** 2, 0)) if loo is not None else np.nan
    )
    out["theory"] = th
    return out


def _response(t, count):
    """Cov(e, n) m_n / (m_e Var n) from summed (n, e, n e, n^2) per boundary; NaN where the
    token norms do not vary (post-LN LayerNorm outputs: the response is undefined)."""
    mn, me = t[:, 0] / count, t[:, 1] / count
    var_n = t[:, 3] / count - mn * mn
    ok = var_n > 1e-9 * mn * mn
    return np.where(ok, (t[:, 2] / count - mn * me) * mn / (me * np.where(ok, var_n, 1.0)), np.nan)


def branch(key, init, d, is_attn, mult=4, qk_grad=True):
    """One random sublayer branch of the stacks, x_in -> y (no dropout): attention
    softmax(x W_Q (x W_K)^T / sqrt(d)) x W_V W_O or the FFN relu(x W_1) W_2, weights drawn from
    ``key`` with the variances of ``init`` (keys qk, v, o / w1, w2; arrays inside a scan)."""
    ks = jax.random.split(key, 4)
    if is_attn:
        sq = jnp.sqrt(init["qk"])
        WQ = jax.random.normal(ks[0], (d, d)) * sq
        WK = jax.random.normal(ks[1], (d, d)) * sq
        WV = jax.random.normal(ks[2], (d, d)) * jnp.sqrt(init["v"])
        WO = jax.random.normal(ks[3], (d, d)) * jnp.sqrt(init["o"])

        def attention(xin):
            xq = xin if qk_grad else jax.lax.stop_gradient(xin)
            A = jax.nn.softmax((xq @ WQ) @ (xq @ WK).T / math.sqrt(d), axis=-1)
            return A @ (xin @ WV) @ WO

        return attention
    W1 = jax.random.normal(ks[0], (d, mult * d)) * jnp.sqrt(init["w1"])
    W2 = jax.random.normal(ks[1], (mult * d, d)) * jnp.sqrt(init["w2"])
    return lambda xin: jax.nn.relu(xin @ W1) @ W2


def _var_r(m, L):
    """Per-entry variance and cross-token correlation from summed ``_moments``."""
    cnt = m[:, 3]
    mu = m[:, 0] / cnt
    var = m[:, 1] / cnt - mu**2
    return var, (m[:, 2] / (cnt * (L - 1)) - mu**2) / var


@float64
def validate(
    key,
    archs=ARCHS,
    widths=(64, 128, 256),
    depths=(1, 2, 4, 8),
    inits=("xavier", "dslm"),
    p=0.1,
    seq_lens=(32,),
    draws=8,
    r0=0.2,
    k=2.0,
    qk_grad=True,
    exact=True,
    ln_exact=True,
    batch=64,
    kappa=None,
):
    """Relative errors |theory - sim| / |sim| over a grid: var, r (forward) at every sublayer
    output, g_var (backward) at every sublayer input; per boundary also ``z`` = (theory - sim)
    / se and ``rel_se`` = se / |sim| (jackknife over draws), and the values themselves (``sim``,
    ``se``, ``theory``, and the measured and used token anisotropy ``kappa_sim``, ``kappa_th``
    at the boundaries / attention inputs). ``kappa`` goes to ``stack`` (None: isotropic;
    "auto": the kappa closure). Returns rows and 50/90/99th percentiles per quantity."""
    rows = []
    for arch, init, d, N, L in itertools.product(archs, inits, widths, depths, seq_lens):
        lam2, beta2 = dslm_scaling(N, min(k, N)) if init.startswith("dslm") else (1.0, 1.0)
        key, sub = jax.random.split(key)
        sim = simulate_stack(
            sub,
            arch,
            N,
            d,
            L,
            init,
            p,
            lam2,
            beta2,
            1.0,
            r0,
            draws,
            qk_grad=qk_grad,
            exact=exact,
            ln_exact=ln_exact,
            batch=batch,
            kappa=kappa,
        )
        th = sim["theory"]
        for q in ("var", "r", "g_var"):
            part = slice(None, -1) if q == "g_var" else slice(1, None)
            err = np.abs(th[q][part] - sim[q][part]) / np.abs(sim[q][part])
            se, diff = sim[q + "_se"][part], th[q][part] - sim[q][part]
            # exact quantities (post-LN forward variance is 1 in every draw): se ~ rounding
            exact_q = se <= 1e-9 * np.abs(sim[q][part])
            z = np.where(exact_q, 0.0, diff / np.where(exact_q, 1.0, se))
            rows.append(
                dict(
                    arch=arch,
                    init=init,
                    width=d,
                    depth=N,
                    seq_len=L,
                    quantity=q,
                    max_rel_err=float(err.max()),
                    errs=err.tolist(),
                    z=z.tolist(),
                    rel_se=(sim[q + "_se"][part] / np.abs(sim[q][part])).tolist(),
                    sim=sim[q][part].tolist(),
                    se=se.tolist(),
                    theory=th[q][part].tolist(),
                    kappa_sim=sim["kappa_all"].tolist(),
                    kappa_sim_se=np.atleast_1d(sim["kappa_all_se"]).tolist(),
                    kappa_th=th["kappa"].tolist(),
                    kappa_th_all=None if th["kappa_all"] is None else th["kappa_all"].tolist(),
                )
            )
    summary = {}
    for q in ("var", "r", "g_var"):
        e = np.concatenate([r["errs"] for r in rows if r["quantity"] == q])
        summary[q] = {f"p{k}": float(np.percentile(e, k)) for k in (50, 90, 99)}
    return rows, summary
