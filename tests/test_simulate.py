"""Finite-width simulator: construction from the shared Block, token statistics, and the
exponents against closed forms (docs/theory.md §6-7) with tolerances from standard errors.
The construction and token tests use the dense reference weights (``weights="dense"``, the
numbers measured before the lazy sampler); the exponents against the closed forms use the
lazy default (~4x cheaper here, the tolerances unchanged): tests/test_lazy.py shows it is the
same distribution, lambda_a and lambda_g included."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import q_star_reference

from phasefield import HParams
from phasefield.block import Block
from phasefield.layers.presets import paper
from phasefield.simulate import measure, stack
from phasefield.theory.reference import closed_form_exponents


def test_q_star_reference_matches_closed_form():
    for sw in (0.7, 1.0, 3.0):
        hp = HParams(sigma_w=sw, alpha_a=0.3, alpha_m=0.8)
        assert q_star_reference(hp) == pytest.approx(closed_form_exponents(hp)[0], rel=1e-9)


def test_stack_is_the_shared_block():
    """Each layer of the stack is Block(hp) initialised from its layer key: the stack's output
    equals Block.apply with Block.init's parameters, layer by layer."""
    hp = HParams(sigma_w=1.7, sigma_a=1.3, alpha_a=0.4, alpha_m=0.6)
    n, d, depth = 6, 32, 3
    key = jax.random.key(5)
    x = stack.simplex_tokens(jax.random.key(1), n, d, 1.0, 0.4)
    y, ys = stack.stack_forward(paper(hp), key, x, depth, return_all=True, weights="dense")
    layer = jax.jit(lambda h, k: Block(hp).apply(Block(hp).init({"params": k}, jnp.zeros((n, d), jnp.float32)), h))
    h = x
    for l, k in enumerate(stack.layer_keys(key, depth)):
        h = layer(h, k)  # one program for the three layers, not eager ops
        np.testing.assert_allclose(ys[l + 1], h, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(y, h, rtol=2e-5, atol=2e-5)
    assert y.dtype == jnp.float32


def test_block_weight_variances():
    """W_Q, W_K ~ N(0, sigma_A/d), W_V ~ N(0, sigma_V^2/d), MLP ~ N(0, sigma_w^2/fan_in)."""
    hp = HParams(sigma_w=2.0, sigma_a=3.0, sigma_v=0.5)
    d = 256
    p = jax.jit(lambda k: stack.block_params(paper(hp), k, 4, d))(jax.random.key(0))["params"]
    var = lambda w: float(jnp.var(w))
    se = np.sqrt(2.0 / d**2)  # relative standard error of a variance from d^2 samples
    for name, expect in (("query", 3.0 / d), ("key", 3.0 / d), ("value", 0.25 / d)):
        assert var(p["attention"][name]["kernel"]) == pytest.approx(expect, rel=5 * se)
    for name in ("dense_0", "dense_1"):
        assert var(p["mlp"][name]["kernel"]) == pytest.approx(4.0 / d, rel=5 * se)


def test_simplex_and_group_tokens_moments():
    keys = jax.random.split(jax.random.key(0), 64)
    n, d = 8, 128
    x = jax.jit(jax.vmap(lambda k: stack.simplex_tokens(k, n, d, 1.5, 0.6)))(keys)
    q, p, u = jax.jit(jax.vmap(measure.token_stats))(x)
    for arr, expect in ((q, 1.5), (p, 0.6), (u, 0.9)):
        m, se = measure.mean_se(arr)
        assert abs(m - expect) < 4 * se
    xg = jax.jit(jax.vmap(lambda k: stack.two_group_tokens(k, n, d, 1.0, 0.7, 0.2)))(keys)
    intra, inter = jax.jit(jax.vmap(measure.group_stats))(xg)
    m, se = measure.mean_se(intra)
    assert abs(m - 0.7) < 4 * se + 0.01  # cosine = ratio of means up to O(1/d)
    m, se = measure.mean_se(inter)
    assert abs(m - 0.2) < 4 * se + 0.01
    xe = stack.simplex_tokens(jax.random.key(4), n, d, 1.5, 0.6, exact=True)
    np.testing.assert_allclose(np.asarray(xe @ xe.T) / d, 0.9 * np.eye(n) + 0.6, atol=1e-5)
    xc = stack.collapsed_tokens(jax.random.key(3), n, d, 0.8)
    np.testing.assert_allclose(jnp.sum(xc**2, -1) / d, 0.8, rtol=1e-5)
    assert float(measure.token_stats(xc)[2]) == pytest.approx(0.0, abs=1e-6)


def test_causal_mask_in_stack():
    """With the causal mask, output token i does not depend on inputs j > i."""
    hp = HParams(sigma_w=1.5)
    n, d = 5, 16
    x = stack.simplex_tokens(jax.random.key(0), n, d, 1.0, 0.3)
    jacobian = lambda causal: jax.jit(  # one program each, not eager ops
        jax.jacrev(lambda x: stack.stack_forward(paper(hp), jax.random.key(2), x, 2, causal=causal, weights="dense"))
    )(x)
    jac = jacobian(True)
    norms = jnp.sqrt(jnp.sum(jac**2, axis=(1, 3)))  # [i, j]
    assert float(jnp.max(jnp.triu(norms, 1))) == 0.0
    assert float(jnp.min(jnp.diag(norms))) > 0.1
    jac_full = jacobian(False)
    assert float(jnp.max(jnp.triu(jnp.sqrt(jnp.sum(jac_full**2, axis=(1, 3))), 1))) > 1e-3


# points on both sides of lambda_a = 0 (sigma_w ~ 1.95) and lambda_g(16) = 0 (~ 1.8)
POINTS = [(1.0, 0.5), (1.5, 0.5), (2.0, 0.5), (3.0, 0.5)]


@pytest.mark.parametrize("sigma_w,alpha", POINTS)
def test_angle_exponent_against_closed_form(sigma_w, alpha):
    hp = HParams(sigma_w=sigma_w, sigma_a=1.0, alpha_a=alpha, alpha_m=alpha)
    q_star, lam_a, _ = closed_form_exponents(hp)
    m, se = measure.angle_exponent(paper(hp), width=256, draws=16, q_star=q_star, seed=11, weights="lazy")
    assert 0 < se < 0.05
    assert abs(m - lam_a) < 3 * se, (m, se, lam_a)


@pytest.mark.parametrize("sigma_w,alpha", POINTS)
def test_gradient_exponent_against_closed_form(sigma_w, alpha):
    hp = HParams(sigma_w=sigma_w, sigma_a=1.0, alpha_a=alpha, alpha_m=alpha)
    q_star, _, lam_g = closed_form_exponents(hp, depth=16)
    m, se = measure.gradient_exponent(paper(hp), width=256, draws=16, q_star=q_star, seed=11, weights="lazy")
    assert 0 < se < 0.01  # so that the 0.03 tolerance is >= 3 standard errors
    assert abs(m - lam_g) < 0.03, (m, se, lam_g)


@pytest.mark.usefixtures("float64")
def test_gradient_exponent_vjp_matches_frobenius_norm():
    """E_u |J^T u|^2 = ||J||_F^2: check the VJP estimator against the full Jacobian."""
    hp = HParams(sigma_w=1.5, alpha_a=0.5, alpha_m=0.5)
    n, d, depth = 4, 16, 3
    key = jax.random.key(0)
    ka, kg = measure.exponent_keys(0, 2)
    a, b = jax.jit(
        lambda k: measure.gradient_draws(paper(hp), k, 1.0, n=n, d=d, depth=depth, dtype=jnp.float64, weights="dense")
    )(kg)
    # the same draw's Jacobian, rebuilt from the same key split
    kx, kw, ku = jax.random.split(kg[0], 3)
    x = stack.collapsed_tokens(kx, n, d, 1.0, jnp.float64)
    f = lambda x0: stack.stack_forward(paper(hp.astype(jnp.float64)), kw, x0, depth, weights="dense")
    u = jax.random.normal(ku, (n, d), jnp.float64)
    jac = jax.jit(jax.jacrev(f))(x).reshape(n * d, n * d)
    np.testing.assert_allclose(float(a[0]), float(jnp.sum((jac.T @ u.ravel()) ** 2)), rtol=1e-9)
    np.testing.assert_allclose(float(b[0]), float(jnp.sum(u**2)), rtol=1e-12)
    del key


def test_symmetry_restoration_ordered_phase():
    """Paper Fig. 3: the inter/intra cosine ratio starts at p_inter/p_intra and tends to 1."""
    hp = HParams(sigma_w=1.0, sigma_a=1.0, alpha_a=0.5, alpha_m=0.5, n_tokens=16, depth=12)
    r = measure.group_cosines(
        paper(hp), 1.0, 0.6, 0.2, n_tokens=16, depth=12, width=128, draws=8, seed=3, weights="dense"
    )
    assert r["ratio"].shape == (13,)
    assert abs(r["ratio"][0] - 0.2 / 0.6) < 4 * r["ratio_se"][0] + 0.02
    assert r["ratio"][-1] > 0.97
    assert np.all(np.diff(r["ratio"]) > -3 * (r["ratio_se"][1:] + r["ratio_se"][:-1]))


def test_token_geometry_shapes_and_consistency():
    hp = HParams(sigma_w=2.0, n_tokens=8, depth=4)
    opts = dict(n_tokens=8, depth=4, width=64, draws=3, seed=1, weights="dense")
    g = measure.token_geometry(paper(hp), 1.0, 0.3, **opts)
    assert g["norms"].shape == (5, 3 * 8) and g["cosines"].shape == (5, 3 * 28)
    t = measure.transients(paper(hp), 1.0, 0.3, exact_input=False, **opts)
    # same draws: the mean squared norm is the transients' q
    np.testing.assert_allclose(g["norms"].mean(1), t["q"], rtol=1e-5)
    assert np.all(np.abs(g["cosines"]) <= 1 + 1e-6)


# The paper block's fixed-point exponents and transient at one small point (width 32, 3 draws,
# n = 6, L = 3, seed 7, lazy weights), as the simulator gave them when it took an HParams (the
# last release): the one simulator must reproduce them. A process that compiles the same
# programs the same way (the command line, a script) reproduces them bit for bit; the suite
# compiles for speed and another platform has other float32 kernels, which reorder float32
# roundings (1.2e-7 relative), and lambda_a reads 1 - rho = u/q ~ eps = 1e-3 through a
# cancellation that multiplies them by up to 1/eps: hence 1e-4 relative or 1.2e-4 absolute
# (float32 epsilon / eps; measured here: 6e-7 on lambda_a), far below one standard error (0.05 to 0.19: any change of draws, keys or
# inputs moves them by O(se)).
FROZEN_POINT = "paper:sigma_w=2,sigma_a=1,alpha_a=0.5,alpha_m=0.5"
FROZEN_OPTS = dict(n_tokens=6, depth=3, width=32, draws=3, seed=7, weights="lazy")
FROZEN = {
    "lambda_a": -0.09859164555867513,
    "lambda_a_se": 0.18985264784969194,
    "lambda_g_collapse": 0.06411096408115241,
    "lambda_g_collapse_se": 0.04995779113349892,
    "q_star": 1.8805971068730059,
}
FROZEN_RHO = [0.29999999205270883, 0.383676021894249, 0.373956426090799, 0.3852513490336644]


def test_paper_block_simulation_is_frozen():
    """The paper block through the one simulator, as a spec and as ``presets.paper(hp)``,
    equals the frozen numbers of the HParams route (and the two spellings each other, bit for
    bit: the same block, the same draws)."""
    hp = HParams(sigma_w=2.0, sigma_a=1.0, alpha_a=0.5, alpha_m=0.5)
    res = measure.fixed_point_exponents(FROZEN_POINT, **FROZEN_OPTS)
    assert res == measure.fixed_point_exponents(paper(hp), **FROZEN_OPTS)
    assert set(res) == set(FROZEN)
    for k, v in FROZEN.items():
        assert res[k] == pytest.approx(v, rel=1e-4, abs=1.2e-4), (k, res[k], v)
    rho = measure.transients(FROZEN_POINT, 1.0, 0.3, **FROZEN_OPTS)["rho"]
    np.testing.assert_allclose(rho, FROZEN_RHO, rtol=1e-4, atol=0)
