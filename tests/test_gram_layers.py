"""The Gram maps of the layers (phasefield.layers.gram): every preset's Gram route reduces to
its (q, p) route on a permutation-symmetric input, the paper preset's reproduces the paper
engine's full-Gram formulas (causal or not), layers refuse the norms their maps do not
cover, and a causal standard block matches its finite-width network per position."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phasefield import HParams, layers
from phasefield.layers import gram, registry, spec
from phasefield.layers.causal import masked
from phasefield.layers.paper import gram as paper_gram
from phasefield.layers.state import Context, Grad, Kernel
from phasefield.theory import attention, mlp

pytestmark = pytest.mark.usefixtures("float64")
N = 6
EYE = np.eye(N, dtype=bool)

# two points of every registered preset, in the maps both routes compute alike (paper-mode
# attention, values path: the exact map and the softmax path average Monte-Carlo samples on
# the Gram route)
_PLAIN = dict(attention="paper", softmax_correction=False)
POINTS = {
    "paper": [
        dict(sigma_w=1.6, sigma_a=1.3, alpha_a=0.5, alpha_m=0.7),
        dict(sigma_w=0.8, sigma_a=2.2, alpha_a=0.9, alpha_m=0.3, activation="relu", mlp_layers=2),
    ],
    "pre-ln": [dict(sigma=0.9, alpha=0.6, heads=2, **_PLAIN), dict(sigma=1.4, alpha=0.3, qk_norm=True, **_PLAIN)],
    "post-ln": [dict(sigma=0.7, alpha=0.8, **_PLAIN), dict(sigma=1.2, alpha_attn=0.4, alpha_mlp=1.1, **_PLAIN)],
    "rms-swiglu": [dict(sigma=0.9, alpha=0.5, **_PLAIN), dict(sigma=1.3, alpha=0.2, qk_norm=True, **_PLAIN)],
    "deepscalelm": [dict(depth=4, k=2.0, **_PLAIN), dict(depth=8, k=5.0, sigma_a=1.7, **_PLAIN)],
    "dyt": [dict(sigma=0.9, alpha=0.6, a=0.7, **_PLAIN), dict(sigma=1.3, alpha=0.3, a=1.5, qk_norm=True, **_PLAIN)],
    # the decoders' presets at their own init (pre-ln's and rms-swiglu's structures above)
    "gpt2": [dict(width=256, depth=3, heads=2, **_PLAIN)],
    "llama": [dict(width=2025, heads=12, **_PLAIN)],  # sigma 0.9: rms-swiglu's first point's tables
}
STATES = [(1.0, 0.3), (0.7, 0.85)]


def test_every_registered_preset_has_points():
    assert set(POINTS) == set(registry.names())


@jax.jit
def _forward(layer, k, ctx):
    return layer.forward(k, ctx)


def _leaf_gaps(layer, k, ctx, out):
    """Appends to ``out`` the gaps (:func:`_layer_gaps`) of every leaf of ``layer`` at its own
    input through the block, from ``layer``'s input ``k``; returns ``layer``'s (q, p) output
    (a leaf's from the forward map of its :func:`_layer_maps`, a residual's from
    :func:`_forward`)."""
    kids = layer.children()
    if not kids:
        fwd, bwd = _layer_maps(layer, k, ctx)
        out.append((type(layer).__name__, (_gap(*fwd), _gap(*bwd))))
        return Kernel(fwd[1], fwd[2])
    if isinstance(layer, layers.Serial):
        for child in kids:
            k = _leaf_gaps(child, k, ctx, out)
        return k
    _leaf_gaps(kids[0], k, ctx, out)  # a residual: its branch reads its input
    return _forward(layer, k, ctx)


def _sym(k):
    return gram.symmetric_gram(N, k.q, k.p)


def _as_qp(c):
    c = np.asarray(c)
    return np.diagonal(c), c[~EYE]


def _gap(c, q, p):
    d, off = _as_qp(c)
    return max(np.max(np.abs(d - np.asarray(q))), np.max(np.abs(off - np.asarray(p))))


@jax.jit
def _layer_maps(layer, k, ctx):
    """A layer's forward and backward maps at input ``k``, on both routes: one program per
    layer structure (every point, state and position of it)."""
    g = Grad(jnp.asarray(0.8), jnp.asarray(-0.05))
    f, cf = layer.forward(k, ctx), layer.gram_forward(_sym(k), ctx)
    b = layer.backward(k, g, ctx)
    cb = layer.gram_backward(_sym(k), g.a * jnp.eye(N) + g.b, ctx)
    return (cf, f.q, f.p), (cb, b.diag, b.b)


def _layer_gaps(layer, k, ctx):
    """max |Gram - (q, p)| of a layer's forward and backward maps at input ``k``."""
    fwd, bwd = _layer_maps(layer, k, ctx)
    return _gap(*fwd), _gap(*bwd)


@pytest.mark.parametrize("name", list(POINTS))
def test_gram_route_is_the_qp_route_on_a_symmetric_input(name):
    worst = 0.0
    for kw in POINTS[name]:
        block, ctx = layers.prepare(spec.build(name, kw), N)
        for q0, rho0 in STATES:
            k = Kernel(jnp.asarray(q0), jnp.asarray(rho0 * q0))
            checked = []
            _leaf_gaps(block, k, ctx, checked)  # every leaf at its own input
            checked.append((type(block).__name__, _layer_gaps(block, k, ctx)))  # and the whole block
            for layer, gaps in checked:
                assert np.all(np.isfinite(gaps)) and max(gaps) < 1e-10, (layer, gaps)
                worst = max(worst, *gaps)
            # a few blocks: the trajectory and lambda_g(L) from the input
            qs, ps = layers.trajectory(block, q0, rho0, n_tokens=N, depth=3)
            cs = gram.grams(block, gram.symmetric_gram(N, q0, rho0 * q0), depth=3)
            d, off = np.diagonal(cs, axis1=1, axis2=2), np.asarray(cs)[:, ~EYE]
            # np.max, not Python's max: a NaN in either part makes the gap NaN (and fails below)
            gap = np.max([np.max(np.abs(d - np.asarray(qs)[:, None])), np.max(np.abs(off - np.asarray(ps)[:, None]))])
            lg = float(layers.gradient_exponent(block, q0, rho0, n_tokens=N, depth=3))
            lg_gram = float(gram.gram_gradient(block, gram.symmetric_gram(N, q0, rho0 * q0), depth=3)[0])
            assert np.isfinite(lg_gram) and gap < 1e-10 and abs(lg - lg_gram) < 1e-10, (gap, lg, lg_gram)
            worst = max(worst, gap, abs(lg - lg_gram))
    print(f"{name}: max |Gram - (q, p)| = {worst:.1e}")


# ---- the paper preset against the paper engine's full-Gram formulas ---------------------------


@jax.jit  # one program per structure (the three blocks of both masks), not op by op
def _reference_block(hp, kern, c, mask):
    """One paper block on the full Gram written out (docs/theory.md §8): (C^z, C')."""
    ca = attention.gram_forward(hp.sigma_a, hp.sigma_v, paper_gram.cosines(c), mask, hp.attention)
    cz = jnp.square(hp.beta_a) * c + jnp.square(hp.alpha_a) * ca
    rz = paper_gram.cosines(cz)
    pm = jnp.where(EYE, kern.q_m, mlp.p_m(kern, jnp.where(EYE, 0.0, rz)))
    return cz, jnp.square(hp.beta_m) * cz + jnp.square(hp.alpha_m) * pm


@jax.jit
def _reference_backward(hp, kern, c, cz, g, mask):
    qz, q = jnp.diagonal(cz), jnp.diagonal(c)
    dm = jnp.where(EYE, kern.d_one, mlp.d_m(kern, jnp.where(EYE, 0.0, paper_gram.cosines(cz))))
    g = (jnp.square(hp.beta_m) + jnp.square(hp.alpha_m) * dm / jnp.sqrt(qz[:, None] * qz[None, :])) * g
    r = paper_gram.cosines(c)
    ga = attention.gram_backward(hp.sigma_a, hp.sigma_v, r, g, mask, hp.attention, hp.softmax_correction)
    return jnp.square(hp.beta_a) * g + jnp.square(hp.alpha_a) * ga / jnp.sqrt(q[:, None] * q[None, :])


@jax.jit  # one program per layer structure, not op by op
def _gram_forward(layer, c, ctx):
    return layer.gram_forward(c, ctx)


@jax.jit
def _gram_backward(layer, c, g, ctx):
    return layer.gram_backward(c, g, ctx)


@pytest.mark.parametrize("mode", ["paper", "exact"])
def test_paper_preset_on_the_common_route_is_the_paper_gram_map(mode):
    hp = HParams(sigma_w=1.7, sigma_a=1.4, alpha_a=0.6, alpha_m=0.7, n_tokens=N, depth=3, attention=mode)
    hp = hp.replace(softmax_correction=mode == "exact")
    kern = mlp.kernel(hp)
    block = spec.build("paper", {k: getattr(hp, k) for k in ("sigma_w", "sigma_a", "alpha_a", "alpha_m", "attention")})
    block = block.replace(layers=tuple(paper_gram._sublayers(hp, kern)))  # the same kernel
    c0 = paper_gram.two_group_gram(N, 1.3, 0.7, 0.1)
    worst, acausal = 0.0, None
    for causal in (False, True):
        mask = paper_gram.causal_mask(N, causal)
        ctx = Context(float(N))
        c, cs, czs = c0, [c0], []
        for _ in range(3):
            cz, c = _reference_block(hp, kern, c, mask)
            cs.append(c)
            czs.append(cz)
        got = np.asarray(gram.grams(block, c0, depth=3, causal=causal))
        got_paper = np.asarray(paper_gram.trajectory_from_gram(hp, c0, 3, causal, kern))
        g = np.eye(N)
        for layer in reversed(range(3)):
            want = np.asarray(_reference_backward(hp, kern, cs[layer], czs[layer], g, mask))
            have = np.asarray(_gram_backward(masked(block, causal), cs[layer], g, ctx))
            worst = np.max([worst, np.max(np.abs(want - have))])  # NaN-propagating
            g = want / (np.trace(want) / N)
        worst = np.max([worst, np.max(np.abs(got - np.stack(cs))), np.max(np.abs(got_paper - got))])
        # causal: the first token attends to itself alone, so it differs from the acausal map
        if causal:
            assert abs(float(got[1, 0, 0]) - float(acausal[1, 0, 0])) > 1e-3
        acausal = got
    # rounding: float64's; the exact map's sampled part runs in float32 (full_gram.SAMPLE_DTYPE),
    # where a 1e-16 difference of the two routes' cosines moves a rounding by ~1e-7 relative
    tol = 1e-10 if mode == "paper" else 1e-6
    assert np.isfinite(worst) and worst < tol, worst
    print(f"paper preset ({mode}): max |common route - paper Gram formulas| = {worst:.1e}")


# ---- norms the maps do not cover ------------------------------------------------------------


def test_unequal_norms():
    """A normalization is exact at any norms; an MLP's tables need unit norms, DyT's rules
    equal ones: NaN for the pairs they do not cover, never another pair's answer."""
    ctx = Context(float(N))
    r = paper_gram.two_group_gram(N, 1.0, 0.6, 0.2)
    scale = np.sqrt(np.linspace(0.5, 1.5, N))
    c = scale[:, None] * np.asarray(r) * scale[None, :]
    norm = layers.Norm("layernorm")
    np.testing.assert_allclose(_gram_forward(norm, c, ctx), r, rtol=0, atol=1e-15)
    g = 0.3 + np.eye(N)
    np.testing.assert_allclose(_gram_backward(norm, c, g, ctx), g / (scale[:, None] * scale[None, :]), atol=1e-15)
    block, _ = layers.prepare(layers.MLP(sigma_w=1.2, activation="tanh"), N)
    out = np.asarray(_gram_forward(block, c, ctx))
    assert np.all(np.isnan(out))  # no token at norm 1
    assert np.all(np.isfinite(np.asarray(_gram_forward(block, r, ctx))))
    dyt = layers.DyT(a=0.8)
    out = np.asarray(_gram_forward(dyt, c, ctx))
    assert np.all(np.isnan(out[~EYE])) and np.all(np.isfinite(np.diag(out)))
    # equal norms not 1: DyT answers with its (q, p) map at that norm
    k = Kernel(jnp.asarray(0.6), jnp.asarray(0.6 * 0.3))
    fwd, _ = _layer_maps(dyt, k, ctx)
    assert _gap(*fwd) < 1e-12


# ---- structure-keyed programs -------------------------------------------------------------


def test_a_new_number_compiles_nothing(compiles):
    c0 = gram.symmetric_gram(N, 1.0, 0.4)
    first = gram.gram_gradient(spec.build("pre-ln", dict(sigma=0.8, alpha=0.5, **_PLAIN)), c0, depth=2, causal=True)
    before = compiles.count
    lam, gs = gram.gram_gradient(spec.build("pre-ln", dict(sigma=1.1, alpha=0.3, **_PLAIN)), c0, depth=2, causal=True)
    assert compiles.count == before
    assert np.isfinite(float(lam)) and float(lam) != float(first[0])


# ---- a causal standard block against its finite-width network ----------------------------------


def test_causal_pre_ln_against_network_per_position():
    """Per-position squared norms and cosines after 2 causal pre-LN blocks (exact-softmax
    map): within 4 standard errors over 48 draws plus an O(1/d) allowance at d = 256; the
    acausal Gram map, the wrong one, lies far outside."""
    from phasefield.simulate import measure

    n, depth, draws, width = 5, 2, 48, 256
    kw = dict(sigma=1.2, alpha=0.9, heads=2, attention="exact", softmax_correction=False)
    block = spec.build("pre-ln", kw)
    c0 = gram.symmetric_gram(n, 1.0, 0.3)
    th = {c: np.asarray(gram.grams(block, c0, depth=depth, causal=c))[-1] for c in (True, False)}
    sim = measure.token_geometry(
        block, 1.0, 0.3, n_tokens=n, width=width, draws=draws, depth=depth, causal=True, seed=1
    )
    norms = sim["norms"].reshape(depth + 1, draws, n)[-1]
    iu = np.triu_indices(n, 1)
    cos = sim["cosines"].reshape(depth + 1, draws, -1)[-1]
    sim_vals = np.concatenate([norms, cos], axis=1)
    mean, se = sim_vals.mean(0), sim_vals.std(0, ddof=1) / np.sqrt(draws)

    def theory(c):
        return np.concatenate([np.diag(c), gram.cosines(c)[iu]])

    z = (mean - theory(th[True])) / se
    print("causal pre-ln, per position (norms, cosines) z:", np.round(z, 2))
    allowance = 2.0 / width * np.abs(theory(th[True]))
    assert np.all(np.abs(mean - theory(th[True])) < 4 * se + allowance)
    z_wrong = (mean - theory(th[False])) / se
    assert np.max(np.abs(z_wrong)) > 8


# ---- the exact maps' Monte-Carlo fields ------------------------------------------------------


def _plain_samples(sigma_a, c, mask, pairs, seed):
    """Attention matrices [2, pairs, n, n] of plain antithetic logit fields in float64, written
    out here (no whitening, no float32): the independent estimate."""
    n = c.shape[-1]
    lam, u = np.linalg.eigh(np.asarray(c))
    lm = u * np.sqrt(np.clip(lam, 0.0, None))
    z = np.random.default_rng(seed).standard_normal((pairs, n, n))
    logits = sigma_a * np.einsum("ij,sjk,lk->sil", lm, np.stack([z, -z]).reshape(-1, n, n), lm)
    logits = np.where(mask, logits, -np.inf)
    a = np.exp(logits - logits.max(-1, keepdims=True))
    return (a / a.sum(-1, keepdims=True)).reshape(2, pairs, n, n)


def test_exact_maps_against_many_plain_fields():
    """The exact Gram maps' fields (whitened antithetic, float32; full_gram.mc_normals) against
    16,384 plain antithetic fields in float64 on a causal two-group Gram: the forward map and
    the backward map with the softmax path within 4 se of their difference (the default
    estimate's se bounded by that of 1,024 plain fields, 4x the reference's, plus 1e-6 relative
    for float32's rounding); the unmasked maps,
    the wrong ones, lie outside. The default fields' second moments are exactly the normal
    law's."""
    fg = attention.full_gram
    z = np.asarray(fg.mc_normals(N))
    flat = z.reshape(len(z), -1)
    assert len(z) == fg.mc_samples(N) == fg.MC_WHITENED
    assert np.max(np.abs(flat.mean(0))) < 1e-14 and np.max(np.abs(flat.T @ flat / len(z) - np.eye(N * N))) < 1e-12

    sa, pairs = 1.5, 8192
    c = paper_gram.two_group_gram(N, 1.3, 0.7, 0.1)
    g = 0.2 + np.diag(np.linspace(0.5, 1.5, N))
    per_sample = jax.jit(
        jax.vmap(
            lambda a: (
                a @ c @ a.T,
                a.T @ g @ a + attention.softmax.gram_softmax_term(sa, 1.0, c, g, None, a=a[None]),
            )
        )
    )
    for causal in (True, False):
        mask = gram.causal_mask(N, causal)
        ref = [
            np.asarray(x).reshape(2, pairs, N, N).mean(0)
            for x in per_sample(_plain_samples(sa, c, mask, pairs, 7).reshape(-1, N, N))
        ]
        got = jax.jit(  # one program per mask, not op by op
            lambda: (
                attention.gram_forward(sa, 1.0, c, mask, "exact"),
                attention.gram_backward(sa, 1.0, c, g, mask, "exact", softmax_correction=True),
            )
        )()
        if causal:
            # plus float32's rounding (where the mask leaves one key, A is exact: se 0)
            tol = [4 * np.sqrt(1 + 16) * x.std(0, ddof=1) / np.sqrt(pairs) + 1e-6 * np.abs(x.mean(0)) for x in ref]
            want = [x.mean(0) for x in ref]
            for have, w, t in zip(got, want, tol):
                assert np.all(np.isfinite(have)) and np.all(np.abs(np.asarray(have) - w) < t)
        else:  # the unmasked maps against the causal reference
            assert all(np.any(np.abs(np.asarray(have) - w) > t) for have, w, t in zip(got, want, tol))


# ---- the adjoint route of the gradient (gram_step, gram.forward_adjoint) --------------------

_ADJOINT_BLOCKS = {  # the exact map's fused step with the softmax path (plain and QK-normed
    # attention: the logits' Gram is the values' or not) and the default (paper map, VJP)
    "pre-ln": dict(sigma=1.1, alpha=0.7, attention="exact", softmax_correction=True),
    "rms-swiglu": dict(sigma=0.9, alpha=0.5, qk_norm=True, attention="exact", softmax_correction=True),
    "post-ln": dict(sigma=0.8, alpha=0.6, **_PLAIN),
}


@jax.jit
def _step_and_maps(block, c, x, g, ctx):
    return block.gram_step(c, x, ctx), block.gram_forward(c, ctx), block.gram_backward(c, g, ctx)


@pytest.mark.parametrize("name", list(_ADJOINT_BLOCKS))
def test_gram_step_is_the_forward_map_and_the_backward_maps_adjoint(name):
    """A causal block's ``gram_step(c, x)``: its output Gram is ``gram_forward(c)``, and
    ``<x, B(g)> = <B^T(x), g>`` for the backward map B at ``c``, on random symmetric x and g
    (both maps average the same fields: float32's rounding, 1e-6 relative); ``B^T(x)`` is
    symmetric to that rounding."""
    block = gram.prepare_kernels(masked(spec.build(name, _ADJOINT_BLOCKS[name]), True), Context(N))
    c = gram.cosines(paper_gram.two_group_gram(N, 1.3, 0.7, 0.1))
    rng = np.random.default_rng(3)
    x, g = (jnp.asarray(m @ m.T / N) for m in rng.standard_normal((2, N, N)))
    (c1, x1), fwd, bwd = _step_and_maps(block, c, x, g, Context(jnp.asarray(float(N))))
    assert np.all(np.isfinite(np.asarray(c1)))  # assert_allclose takes NaN == NaN
    np.testing.assert_allclose(np.asarray(c1), np.asarray(fwd), rtol=1e-6, atol=1e-9)
    lhs, rhs = float(jnp.sum(x * bwd)), float(jnp.sum(x1 * g))
    assert np.isfinite(lhs) and abs(lhs - rhs) < 1e-6 * abs(lhs), (lhs, rhs)
    assert np.allclose(np.asarray(x1), np.asarray(x1).T, rtol=0, atol=1e-6 * float(jnp.max(jnp.abs(x1))))


def test_forward_adjoint_is_the_backward_route():
    """The last token's gradient rate carried forward (gram.forward_adjoint, what
    causal_rates reads) against the gradient Gram backpropagated from the output
    (gram.gram_gradient): equal to 1e-8 on a causal pre-LN stack with the exact map."""
    block = spec.build("pre-ln", dict(_ADJOINT_BLOCKS["pre-ln"], causal=True))
    depth = 6
    c0 = gram.symmetric_gram(N, 1.0, 0.4)
    lam, gs = gram.gram_gradient(block, c0, depth=depth)
    backward = float(lam + jnp.log(gs[0][-1, -1]) / depth)
    forward = float(layers.causal_rates(block, n_tokens=N, depth=depth, q0=1.0, rho0=0.4)["lambda_g_last"])
    assert abs(forward - backward) < 1e-8, (forward, backward)
