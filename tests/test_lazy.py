"""The lazy sampler (``Block(weights="lazy")``, :func:`phasefield.layers.weights.random_linear`)
against dense weights.

Exact, deterministic checks (float64 inside JAX's scoped x64 switch -- the ``float64``
fixture of tests/conftest.py, since importing phasefield leaves x64 off --, tiny d): the lazy forward is ``X W`` and the lazy VJP
is autodiff of the dense block when the lazy draws are assembled into explicit weights
``W = s Q S + (I - QQ^T) W_c`` (``W_c`` any draw of the untouched part, the noise G set to
``(sum_j W_c,j U_j^T) B^{-T}``, the draw of G that ``W_c`` implies, B the sampler's
``cotangent_root``).

Statistical checks: lazy and dense stacks are the same distribution -- per-layer q and p,
per-draw cosine histograms, lambda_a and lambda_g(L) agree within two-sample tolerances
``|z| < 4``, ``z = (m_lazy - m_dense) / sqrt(se_lazy^2 + se_dense^2)`` (independent fixed
seeds, 512 draws per sampler, standard errors over draws; 4 keeps the family-wise
false-alarm rate of the 14 z-scores -- q, p at 4 layers, 4 cosine bins, lambda_a,
lambda_g -- near 0.1 %), on a causal stack with two MLP layers. A negative control (the VJP
without its noise term) shows the lambda_g comparison has the power to see a wrong sampler.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phasefield import HParams
from phasefield.block import Block
from phasefield.layers import weights as block  # the lazy sampler behind every block's network
from phasefield.layers.presets import paper
from phasefield.layers.weights import random_linear
from phasefield.simulate import measure, stack

Z_MAX = 4.0


def _assemble(x, scales, draws, rng):
    """Explicit weights consistent with the lazy draws: s Q S + (I - QQ^T) W_c, Q the
    sampler's basis of the token span (zero columns for dropped directions)."""
    normals = [jnp.asarray(rng.normal(size=(x.shape[1], w.shape[1])), x.dtype) for w in draws]
    return _assembled(x, tuple(scales), tuple(draws), normals)


@jax.jit  # one program per structure, not op by op (inlined where the caller traces)
def _assembled(x, scales, draws, normals):
    q = block.token_basis(x)
    proj = jnp.eye(x.shape[1], dtype=x.dtype) - q @ q.T
    wc = [s * c for s, c in zip(scales, normals)]
    return [s * q @ w + proj @ c for s, w, c in zip(scales, draws, wc)], wc


@jax.jit  # one program per structure, not op by op (inlined where the caller traces)
def _implied_noise(wc, cts, scales):
    """The G for which the VJP's noise term (I - QQ^T) G B^T is (I - QQ^T) sum_j W_c,j U_j^T."""
    b = block.cotangent_root(cts, scales)
    return sum(w @ u.T for w, u in zip(wc, cts)) @ jnp.linalg.inv(b.T)


@jax.jit  # one program per structure (the ranks share them) instead of ~100 eager ops
def _lazy_and_dense(x, scales, draws, noise, w, cts):
    """The lazy map's outputs, VJP and scales' gradient; the dense maps' outputs and VJP."""
    ys, vjp = jax.vjp(lambda x: random_linear(x, scales, draws, noise), x)
    yd, vjpd = jax.vjp(lambda x: tuple(x @ wj for wj in w), x)
    gs = jax.grad(lambda sc: sum(jnp.sum(u * y) for u, y in zip(cts, random_linear(x, sc, draws, noise))))(scales)
    return ys, yd, vjp(cts)[0], vjpd(cts)[0], gs


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("rank", [4, 2, 1])
def test_random_linear_is_dense_autodiff(rank):
    """Three maps sharing one basis (W_Q, W_K, W_V) and a rectangular one; full-rank and
    rank-deficient tokens (rank 2: tokens a, b, a, b -- a dependent token before an
    independent one; rank 1: collapsed)."""
    rng = np.random.default_rng(rank)
    n, d_in = 4, 9
    x = jnp.asarray(rng.normal(size=(rank, d_in))[np.arange(n) % rank])
    for outs in ((7, 7, 7), (11,)):
        scales = tuple(float(s) for s in rng.uniform(0.3, 2.0, len(outs)))
        draws = tuple(jnp.asarray(rng.normal(size=(n, f))) for f in outs)
        cts = tuple(jnp.asarray(rng.normal(size=(n, f))) for f in outs)
        w, wc = _assemble(x, scales, draws, rng)
        noise = _implied_noise(wc, cts, scales)
        ys, yd, g, gd, gs = _lazy_and_dense(x, scales, draws, noise, w, cts)
        for a, b in zip(ys, yd):
            np.testing.assert_allclose(a, b, atol=1e-12)
        np.testing.assert_allclose(g, gd, atol=1e-11)
        # the scales' cotangent is exact too: d/ds_j of <U_j, Y_j> = <U_j, Y_j> / s_j
        np.testing.assert_allclose(gs, [np.sum(np.asarray(u) * y) / s for u, y, s in zip(cts, ys, scales)], rtol=1e-12)


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("causal,mlp_layers", [(False, 1), (True, 2)])
def test_lazy_block_is_dense_block_with_assembled_weights(monkeypatch, causal, mlp_layers):
    """The whole lazy block (forward and VJP) equals autodiff of the dense Block with the
    lazy draws assembled into explicit kernels (every map; the MLP's later layers act on
    phi(h), so their QR is of phi(h))."""
    hp = HParams(sigma_w=1.7, sigma_a=2.0, sigma_v=0.8, alpha_a=0.6, alpha_m=0.7, mlp_layers=mlp_layers).astype(
        jnp.float64
    )
    n, d, mlp_hidden = 4, 8, 6
    rng = np.random.default_rng(7)
    kernels = []  # explicit weights, in call order: (q, k, v), dense_0, ..., dense_k
    real = block.random_linear

    def recording(x, scales, draws, noise):
        @jax.custom_vjp
        def f(x):
            return real(x, scales, draws, noise)

        def fwd(x):  # runs on primal values: the assembled kernels are constants of the VJP
            w, wc = _assemble(x, scales, draws, rng)
            kernels.append(w)
            return real(x, scales, draws, noise), (x, wc)

        def bwd(res, cts):
            x, wc = res
            g = _implied_noise(wc, cts, scales)
            return jax.vjp(lambda x: real(x, scales, draws, g), x)[1](cts)

        f.defvjp(fwd, bwd)
        return f(x)

    monkeypatch.setattr(block, "random_linear", recording)
    x = jnp.asarray(rng.normal(size=(n, d)))
    u = jnp.asarray(rng.normal(size=(n, d)))
    lazy = Block(hp, causal=causal, mlp_hidden=mlp_hidden, weights="lazy")
    dense = Block(hp, causal=causal, mlp_hidden=mlp_hidden)

    @jax.jit  # one compilation instead of hundreds of eager ops
    def both(x, u):
        y, vjp = jax.vjp(lambda x: lazy.apply({}, x, rngs={"lazy": jax.random.key(3)}), x)
        params = {
            "attention": dict(zip(("query", "key", "value"), ({"kernel": w} for w in kernels[0]))),
            "mlp": {f"dense_{i}": {"kernel": w[0]} for i, w in enumerate(kernels[1:])},
        }
        yd, vjpd = jax.vjp(lambda x: dense.apply({"params": params}, x), x)
        return y, vjp(u)[0], yd, vjpd(u)[0], params

    y, g, yd, gd, params = both(x, u)
    assert len(kernels) == 2 + mlp_layers
    shape = lambda a: a.shape
    shapes = jax.tree_util.tree_map(shape, jax.eval_shape(dense.init, jax.random.key(0), x)["params"])  # no compile
    assert jax.tree_util.tree_map(shape, params) == shapes
    np.testing.assert_allclose(y, yd, atol=1e-12)
    np.testing.assert_allclose(g, gd, atol=1e-10)


def test_token_basis_is_stable_at_collapse():
    """Identical tokens (float32, the lambda_g input): one direction is kept, the others
    are dropped rather than completed by rounding noise, and the lazy block keeps the
    tokens identical, so the draw is the same whether or not it is vmapped over points."""
    hp = HParams(sigma_w=2.0, sigma_a=3.0, alpha_a=0.7, alpha_m=0.6)
    n, d = 8, 256
    f = lambda h, x: stack.stack_forward(paper(h), jax.random.key(4), x, 4)
    h32 = hp.astype(jnp.float32)

    @jax.jit  # the tokens, their basis, the stack's output y and the VJP of y: one program
    def alone(h):
        x = stack.collapsed_tokens(jax.random.key(2), n, d, 1.3)
        y, vjp = jax.vjp(lambda x: f(h, x), x)
        return x, block.token_basis(x), y, vjp(y)[0]

    x, q, y, g_alone = (np.asarray(v) for v in alone(h32))
    assert [bool(np.any(q[:, i] != 0)) for i in range(n)] == [True] + [False] * (n - 1)
    np.testing.assert_allclose(q.T @ q, np.diag([1.0] + [0.0] * (n - 1)), atol=1e-6)
    assert np.max(np.abs(y - y[:1])) <= 1e-5 * np.max(np.abs(y))
    hps = jax.tree_util.tree_map(lambda v: jnp.stack([v, 0.5 * v]), h32)
    g = lambda h: jax.vjp(lambda x: f(h, x), x)[1](y)[0]
    np.testing.assert_allclose(jax.jit(jax.vmap(g))(hps)[0], g_alone, rtol=1e-4, atol=1e-4 * np.max(np.abs(g_alone)))


def test_lazy_stack_layers_and_causality():
    """The lazy stack is Block(weights="lazy") applied with each layer key; with the causal
    mask, the (one-draw) VJP of a cotangent on token i has no rows j > i."""
    hp = HParams(sigma_w=1.5, sigma_a=1.3)
    n, d, depth = 5, 16, 3
    key = jax.random.key(5)
    f = lambda x: stack.stack_forward(paper(hp), key, x, depth, causal=True)

    @jax.jit  # the tokens, every layer's output and the n VJPs: one program, not eager ops
    def stack_and_vjps():
        x = stack.simplex_tokens(jax.random.key(1), n, d, 1.0, 0.4)
        _, ys = stack.stack_forward(paper(hp), key, x, depth, return_all=True, causal=True)
        rows = jnp.zeros((n, n, d)).at[jnp.arange(n), jnp.arange(n)].set(1.0)  # a cotangent on token i
        return x, ys, jax.vmap(jax.vjp(f, x)[1])(rows)[0]

    x, ys, grads = (np.asarray(v) for v in stack_and_vjps())
    layer = jax.jit(lambda h, k: Block(hp, causal=True, weights="lazy").apply({}, h, rngs={"lazy": k}))
    h = x
    for l, k in enumerate(stack.layer_keys(key, depth)):
        h = layer(h, k)
        np.testing.assert_allclose(ys[l + 1], h, rtol=1e-5, atol=1e-5)
    for i, g in enumerate(np.asarray(grads)):
        assert np.max(np.abs(g[i + 1 :]), initial=0.0) == 0.0
        assert np.linalg.norm(g[i]) > 0.1


# ------------------------------------------------------------------ same distribution
def _z(m1, s1, m2, s2):
    return (np.asarray(m1) - np.asarray(m2)) / np.sqrt(np.square(s1) + np.square(s2))


# the stack of the same-distribution test (and of its negative control): 8 tokens, d = 16,
# depth 4, 512 draws per sampler, independent fixed seeds for the two samplers
POINT = dict(sigma_w=2.0, sigma_a=3.0, alpha_a=0.7, alpha_m=0.6, n_tokens=8, depth=4)
N, D, DEPTH, DRAWS = 8, 16, 4, 512
SEEDS = {"dense": 101, "lazy": 202}


def _block(mlp_layers, mlp_hidden):
    hp = HParams(**POINT, mlp_layers=mlp_layers)
    return paper(hp, mult=1.0 if mlp_hidden is None else mlp_hidden / D)


@functools.cache
def _sampler_draws(weights, causal, mlp_layers, mlp_hidden):
    """One sampler's draws of the stack (seed SEEDS[weights]), once per process: per draw
    and layer q, p; the last layer's pairwise cosines; lambda_a's log ratio; lambda_g's
    (|J^T u|^2, |u|^2). The negative control below reads the dense sampler's."""
    keys = jax.random.split(jax.random.key(SEEDS[weights]), DRAWS)
    opts = dict(n=N, d=D, causal=causal, weights=weights)
    blk = _block(mlp_layers, mlp_hidden)

    def forward(key):
        kx, kw = jax.random.split(key)
        x = stack.simplex_tokens(kx, N, D, 1.0, 0.4, exact=True)
        reduce = lambda x: (*measure.token_stats(x)[:2], measure.cosines(x))
        return stack.stack_forward(blk, kw, x, DEPTH, causal=causal, reduce=reduce, weights=weights)[1]

    @jax.jit  # one program per sampler (a fresh function: nothing cached from another test)
    def draws_of(keys):
        la = measure.angle_draws(blk, keys, 1.2, eps=1e-2, **opts)
        return (
            jax.vmap(forward)(keys),
            la,
            measure.gradient_draws(blk, keys, 1.2, depth=DEPTH, draw_batch=128, **opts),
        )

    (q, p, cos), la, (a, b) = draws_of(keys)
    return np.asarray(q), np.asarray(p), np.asarray(cos)[:, -1], np.asarray(la), np.asarray(a), np.asarray(b)


def _compare(causal, mlp_layers, mlp_hidden):
    """Two-sample z-scores of lazy vs dense: per-layer q, p; per-draw cosine histogram
    fractions (4 bins) at the last layer; lambda_a; lambda_g(depth)."""
    out = {}
    (qd, pd, cd, lad, ad, bd), (ql, pl, cl, lal, al, bl) = (
        _sampler_draws(w, causal, mlp_layers, mlp_hidden) for w in ("dense", "lazy")
    )
    for name, xd, xl in (("q", qd[:, 1:], ql[:, 1:]), ("p", pd[:, 1:], pl[:, 1:]), ("lambda_a", lad, lal)):
        out[name] = _z(*measure.mean_se(xl), *measure.mean_se(xd))
    edges = np.quantile(cd, [0.25, 0.5, 0.75])
    frac = lambda c: np.stack([np.mean(np.digitize(c, edges) == k, axis=1) for k in range(4)], 1)
    out["cosine_bins"] = _z(*measure.mean_se(frac(cl)), *measure.mean_se(frac(cd)))
    lg = lambda a, b: measure.log_ratio_of_means(a, b, 1 / DEPTH)
    out["lambda_g"] = _z(*lg(al, bl), *lg(ad, bd))
    return out


# the max |z| of each quantity is printed (pytest -s) and shown in a failure message.
# One configuration (compiles dominate): causal masks and k = 2 hidden layers of width
# 24 != d. The sampler (random_linear: the token basis, the slabs, the VJP's noise) does not
# branch on the mask or on the shape of a map, so this stack runs every path of it that the
# non-causal block with one square MLP layer runs; that block's lazy forward and VJP equal the
# dense ones with the draws assembled into weights
# (test_lazy_block_is_dense_block_with_assembled_weights[False-1]), and a non-causal block's
# lazy and dense networks agree in tests/test_simulate_blocks.py::test_lazy_and_dense_weights_agree.
SAME_DISTRIBUTION = [(True, 2, 24)]


@pytest.mark.parametrize("causal,mlp_layers,mlp_hidden", SAME_DISTRIBUTION)
def test_lazy_and_dense_are_the_same_distribution(causal, mlp_layers, mlp_hidden):
    z = _compare(causal, mlp_layers, mlp_hidden)
    summary = {k: round(float(np.max(np.abs(v))), 2) for k, v in z.items()}
    print("max |z|:", summary)
    for v in summary.values():
        assert v < Z_MAX, summary


def test_lambda_g_comparison_detects_a_missing_noise_term(monkeypatch):
    """Negative control: without the untouched part's draw the VJP is too small, and the
    same comparison as above (its stack, keys and dense draws) flags it (|z| far above
    Z_MAX)."""
    real_bwd = block._random_linear_bwd

    def no_noise(res, cts):
        q, r, scales, draws, noise = res
        return real_bwd((q, r, scales, draws, jnp.zeros_like(noise)), cts)

    monkeypatch.setattr(block.random_linear, "bwd", no_noise)
    causal, mlp_layers, mlp_hidden = SAME_DISTRIBUTION[0]
    blk = _block(mlp_layers, mlp_hidden)
    keys = jax.random.split(jax.random.key(SEEDS["lazy"]), DRAWS)
    opts = dict(n=N, d=D, depth=DEPTH, causal=causal, draw_batch=128, weights="lazy")
    # a fresh jitted function: traced with the patched VJP
    a, b = jax.jit(lambda k: measure.gradient_draws(blk, k, 1.2, **opts))(keys)
    *_, ad, bd = _sampler_draws("dense", causal, mlp_layers, mlp_hidden)
    lg = lambda a, b: measure.log_ratio_of_means(np.asarray(a), np.asarray(b), 1 / DEPTH)
    z = _z(*lg(a, b), *lg(ad, bd))
    assert abs(z) > 3 * Z_MAX, z
