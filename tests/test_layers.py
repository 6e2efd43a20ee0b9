"""The layer algebra (phasefield.layers): the paper's block written as a composition of
layers gives today's numbers, and the generic fixed-point / exponent machinery built on
any block's maps agrees with the paper's closed forms (an independent route: closed forms
and a mesh search written for the paper block alone)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phasefield import HParams, layers, theory
from phasefield._runtime import optimized_jit
from phasefield.layers import Grad, Kernel, paper

TOL = 1e-12
BISTABLE = dict(sigma_w=8.175, sigma_a=6.875, alpha_a=0.705, alpha_m=0.41, n_tokens=128)

# points spanning both phases, small and large sigma_A, several activations and options
POINTS = [
    dict(sigma_w=2.0, sigma_a=1.0, alpha_a=0.5, alpha_m=0.5),
    dict(sigma_w=0.7, sigma_a=0.4, alpha_a=0.3, alpha_m=0.8, n_tokens=8),
    dict(sigma_w=3.5, sigma_a=2.5, alpha_a=0.9, alpha_m=0.2, n_tokens=64),
    dict(sigma_w=1.3, sigma_a=1.7, alpha_a=0.2, alpha_m=0.95, activation="gelu"),
    dict(sigma_w=1.1, sigma_a=0.8, alpha_a=0.6, alpha_m=0.6, activation="relu", mlp_layers=2),
    dict(sigma_w=2.5, sigma_a=1.2, alpha_a=0.4, alpha_m=0.7, activation="erf", n_tokens=2),
    dict(sigma_w=1.6, sigma_a=2.0, alpha_a=0.5, alpha_m=0.5, softmax_correction=True),
    dict(sigma_w=2.2, sigma_a=1.5, alpha_a=0.45, alpha_m=0.6, attention="exact", n_tokens=16),
    BISTABLE,
]
KEYS = (
    "lambda_a",
    "lambda_g_collapse",
    "lambda_g_inf",
    "q_star",
    "rho_star",
    "n_stable",
    "rho_star_min",
    "rho_star_max",
)


def _close(a, b, tol=TOL):
    """``a`` equals ``b`` within ``tol`` relative (an infinity: the same one); a NaN on either
    side never agrees (the points here have every quantity)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    same_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    return bool(np.all(same_inf | (np.abs(a - b) <= tol * np.maximum(1.0, np.abs(b)))))


@pytest.mark.parametrize("pt", POINTS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_generic_exponents_of_the_paper_preset_equal_the_closed_forms(pt):
    hp = HParams(depth=16, **pt)
    got = layers.fixed_point_exponents(layers.presets.get("paper", hp), n_tokens=hp.n_tokens, depth=16)
    ref = paper.exponents(hp)
    for k in KEYS:
        assert _close(got[k], ref[k]), (k, float(got[k]), float(ref[k]))


@pytest.mark.parametrize("pt", POINTS[:4] + POINTS[6:8])
def test_paper_preset_trajectory_and_lambda_g_from_any_input(pt):
    hp = HParams(depth=12, **pt)
    block = layers.presets.get("paper", hp)
    for q0, rho0 in [(1.0, 0.3), (2.5, -0.02), (0.4, 0.97)]:
        q, p = layers.trajectory(block, q0, rho0, n_tokens=hp.n_tokens, depth=12)
        q_ref, p_ref = paper.trajectory(hp, q0, rho0 * q0)
        assert _close(q, q_ref) and _close(p, p_ref)
        lg = layers.gradient_exponent(block, q0, rho0, n_tokens=hp.n_tokens, depth=12)
        assert _close(lg, paper.gradient_exponent(hp, q0, rho0 * q0))


def test_lambda_a_three_ways():
    """Forward transverse multiplier (autodiff) = backward token-difference mode = closed form."""
    hp = HParams(sigma_w=2.7, sigma_a=1.3, alpha_a=0.35, alpha_m=0.75)
    block, ctx = layers.prepare(layers.presets.get("paper", hp), hp.n_tokens)

    def three(block, ctx):  # one compiled program, not operation by operation
        q_star = layers.depth.norm_fixed_point(block, ctx, 1.0)
        fwd = jnp.log(layers.depth.transverse_multiplier(block, ctx, q_star))
        return fwd, layers.depth.gradient_matrix(block, ctx, Kernel(q_star, q_star))

    with jax.enable_x64(True):
        fwd, m = jax.jit(three)(block, ctx)
    ref = paper.exponents(hp)["lambda_a"]
    assert _close(fwd, ref) and _close(jnp.log(m[0, 0]), ref)
    assert abs(float(m[0, 1])) < 1e-15  # triangular at collapse: a' ignores b
    assert _close(m[1, 1], paper.mean_mode(hp))


def test_block_pytree_vmaps_over_every_leaf():
    hps = [HParams(sigma_w=s, sigma_a=a, alpha_a=0.5, alpha_m=0.5) for s, a in [(1.5, 0.5), (2.5, 1.5)]]
    with jax.enable_x64(True):
        prepared = [layers.prepare(layers.presets.get("paper", hp), 32) for hp in hps]
        stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *[b for b, _ in prepared])
        ctx = prepared[0][1]
        lam = jax.jit(jax.vmap(lambda b: layers.depth.angle_exponent(b, ctx)))(stacked)
    for hp, val in zip(hps, lam):
        assert _close(val, paper.exponents(hp)["lambda_a"])


def test_stale_mlp_table_gives_nan_not_another_answer():
    """An MLP layer whose tables were built for another sigma_w answers NaN, never silently."""
    ctx = layers.Context(jnp.asarray(32.0))
    with jax.enable_x64(True):
        good = layers.MLP(sigma_w=2.0).prepare(ctx)
        stale = good.replace(sigma_w=3.0)  # says sigma_w = 3, carries sigma_w = 2's tables
        k = Kernel(1.0, 0.4)
        assert np.isfinite(float(good.forward(k, ctx).p))
        assert np.isnan(float(stale.forward(k, ctx).p))
        assert np.isnan(float(stale.backward(k, Grad(1.0, 0.0), ctx).a))


def test_mlp_needs_a_normalized_input():
    block = layers.Serial((layers.MLP(sigma_w=1.5),))
    b, ctx = layers.prepare(block)
    with jax.enable_x64(True):
        assert np.isnan(float(b.forward(Kernel(2.0, 1.0), ctx).q))
        assert np.isfinite(float(b.forward(Kernel(1.0, 0.5), ctx).q))


def test_multi_head_map_equals_single_head():
    one = layers.Attention(sigma_a=1.3, heads=1)
    many = layers.Attention(sigma_a=1.3, heads=12)
    ctx = layers.Context(jnp.asarray(16.0))
    with jax.enable_x64(True):
        for k in [Kernel(1.0, 0.3), Kernel(2.0, -0.1)]:
            a, b = one.forward(k, ctx), many.forward(k, ctx)
            assert float(a.q) == float(b.q) and float(a.p) == float(b.p)


@pytest.mark.parametrize(
    "bad",
    [
        dict(kind="batch"),
    ],
)
def test_bad_layer_options_raise_one_line(bad):
    with pytest.raises(ValueError, match="unknown norm"):
        layers.Norm(**bad)
    with pytest.raises(ValueError, match="heads"):
        layers.Attention(heads=0)
    with pytest.raises(ValueError, match="needs the width"):
        layers.Attention(scale="inv")
    with pytest.raises(ValueError, match="unknown residual"):
        layers.Residual(layers.Norm(), kind="half")
    with pytest.raises(ValueError, match="unknown block"):
        layers.presets.get("gpt-5")


# ---- two hazards: a kernel built for another sigma_w, a traced sigma beyond the tables ----


def test_stale_kernel_is_refused():
    """paper.exponents(hp, kernel built for another sigma_w) raises (concrete) or is NaN
    (traced), instead of answering for the other sigma_w."""
    hp = HParams(sigma_w=2.0)
    stale = theory.kernel(HParams(sigma_w=3.0))
    with pytest.raises(ValueError, match="built for sigma_w"):
        paper.exponents(hp, stale)
    with pytest.raises(ValueError, match="activation"):
        paper.exponents(hp, theory.kernel(HParams(sigma_w=2.0, activation="erf")))
    assert _close(paper.exponents(hp, theory.kernel(hp))["lambda_a"], paper.exponents(hp)["lambda_a"])
    with jax.enable_x64(True):
        sw = jnp.asarray([2.0, 3.0])
        lam = jax.vmap(lambda s: paper.exponents(hp.replace(sigma_w=s), stale)["lambda_a"])(sw)
    assert np.isnan(float(lam[0])) and _close(lam[1], paper.exponents(HParams(sigma_w=3.0))["lambda_a"])


def test_traced_sigma_beyond_the_tables_is_nan_not_silent():
    """A traced sigma_w gets tables for sigma <= 10 by default: beyond, NaN; with
    sigma_max=20 the value of the concrete (exactly sized) kernel."""
    hp = HParams(sigma_w=15.0)
    ref = float(paper.exponents(hp)["lambda_a"])
    with jax.enable_x64(True):
        f = lambda s, **kw: paper.exponents(hp.replace(sigma_w=s), theory.kernel(hp.replace(sigma_w=s), **kw))[
            "lambda_a"
        ]
        assert np.isnan(float(jax.jit(f)(15.0)))
        assert _close(jax.jit(f)(5.0), paper.exponents(HParams(sigma_w=5.0))["lambda_a"], 1e-9)
        assert _close(jax.jit(lambda s: f(s, sigma_max=20.0))(15.0), ref, 1e-9)


# ---- the standard blocks (presets) -----------------------------------------------------------


@pytest.mark.parametrize("s", [0.55, 2.0])
def test_silu_tables_within_1e9_of_dense_reference(s):
    """SwiGLU's gate: the numeric silu tables against the dense NumPy reference."""
    from phasefield import activations
    from phasefield.theory import mlp, quadrature

    rhos = [-0.9, -0.3, 0.0, 0.4, 0.8, 0.99]
    kern = mlp.kernel(HParams(sigma_w=s, activation="silu"))
    f = lambda fn: lambda x: np.asarray(jax.jit(fn)(jnp.asarray(x)))  # one program per grid shape
    g, dg = f(activations.get("silu")), f(activations.derivative("silu"))
    with jax.enable_x64(True):
        pp, dd = (np.asarray(v) for v in jax.jit(mlp._pair, static_argnums=1)(kern, 0, jnp.asarray(rhos)))
    np.testing.assert_allclose(pp, [quadrature.reference_2d(g, g, s, r) for r in rhos], atol=1e-9)
    np.testing.assert_allclose(dd, [quadrature.reference_2d(dg, dg, s, r) for r in rhos], atol=1e-9)


def test_glu_maps_against_monte_carlo():
    """SwiGLU forward (q', p') and backward (a, b) at a normalized input: the closed maps of
    layers.GLU against a float64 Monte Carlo of the network itself (dense weights, one draw
    per sample, d = 128, 300 draws; tolerance 4 standard errors of the draw mean)."""
    d, n, draws = 128, 2, 300
    glu = layers.GLU(sigma_g=1.3, sigma_v=0.8, sigma_out=1.1, mult=2.0)
    rho = 0.35
    with jax.enable_x64(True):
        # the tables built outside the trace, as for every block (layers.prepare: a cached
        # table program; built inside the test's -O0 program they cost ~4 CPU-s), then both
        # maps in one program, not op by op
        prepared, ctx = layers.prepare(glu, n)

        @jax.jit
        def maps(b, ctx):
            k_in = Kernel(jnp.asarray(1.0), jnp.asarray(rho))
            return b.forward(k_in, ctx), b.backward(k_in, Grad(jnp.asarray(1.0), jnp.asarray(0.0)), ctx)

        fwd, bwd = maps(prepared, ctx)
        mod = glu.module("dense")
        c = np.linalg.cholesky(np.array([[1.0, rho], [rho, 1.0]]))

        def one(key):
            kx, kw, ku = jax.random.split(key, 3)
            x = c @ jax.random.normal(kx, (n, d), jnp.float64)
            params = mod.init(kw, x)
            y, vjp = jax.vjp(lambda z: mod.apply(params, z), x)
            u = jax.random.normal(ku, y.shape, y.dtype)
            (gx,) = vjp(u)
            gram, ggram = y @ y.T / d, gx @ gx.T / d
            return jnp.array([gram[0, 0], gram[0, 1], ggram[0, 0], ggram[0, 1]])

        # compiled with run-time optimisation (optimized_jit: at the suite's -O0 the draws dominate)
        vals = np.asarray(optimized_jit(jax.vmap(one))(jax.random.split(jax.random.PRNGKey(7), draws)))
    mean, se = vals.mean(0), vals.std(0, ddof=1) / np.sqrt(draws)
    want = [float(fwd.q), float(fwd.p), float(bwd.a + bwd.b), float(bwd.b)]
    # the input's realized cosine fluctuates around rho by O(1/sqrt(d)): part of the draw noise
    assert np.all(np.abs(mean - want) <= 4 * se), (mean, se, want)


def test_angle_rate_is_the_limit_of_nearby_tokens():
    """finite_depth's angle rate (rho_0 -> 1 along the collapsed trajectory, from the
    transverse multipliers) equals (1/L) log[(1 - rho_L)/(1 - rho_0)] of the trajectory from
    rho_0 = 1 - 1e-7, for a block whose norm grows (identity residual: the norm's growth
    enters, 1 - rho = (q - p)/q)."""
    # 16 tokens, depth 4: the finite-depth program of test_preset_theory_against_its_own_network
    block = layers.presets.get("pre-ln", sigma=1.0, alpha=0.7, heads=4)
    fd = layers.finite_depth(block, q0=1.0, rho0=1.0, n_tokens=16, depth=4)
    q, p = layers.trajectory(block, 1.0, 1.0 - 1e-7, n_tokens=16, depth=4)
    rate = np.log((1.0 - float(p[-1] / q[-1])) / 1e-7) / 4
    assert abs(float(fd["angle_rate"]) - rate) < 1e-5, (float(fd["angle_rate"]), rate)
    spread = np.sum(np.log(np.asarray(fd["angle_multipliers"]))) / 4
    assert abs(float(fd["angle_rate"]) - spread) > 0.05  # the norm's growth is not negligible here


# pre-LN (LayerNorm, 4 heads with W_O, GELU 4x, identity residual) and rms-swiglu (RMSNorm,
# the GLU layer): every layer kind of the presets; post-ln and deepscalelm are the same
# layers composed otherwise, checked at widths 256..4096 by scripts/validate_blocks.py
@pytest.mark.parametrize(
    "name,kw", [("pre-ln", dict(sigma=1.0, alpha=1.0)), ("rms-swiglu", dict(sigma=1.0, alpha=1.0))]
)
def test_preset_theory_against_its_own_network(name, kw):
    """Each preset's maps against random stacks of its own Flax module (lazy weights) at
    d = 512, 4 heads, 24 draws, 4 blocks: per-layer rho and lambda_g(4) within 4 standard
    errors plus the O(1/d) bias bound 2/d (scripts/validate_blocks.py extrapolates the
    same measurements to d -> inf at widths up to 4096: docs/blocks.md)."""
    from phasefield.layers import measure

    block = layers.presets.get(name, heads=4, **kw)
    n, d, depth, draws = 16, 512, 4, 24
    fd = layers.finite_depth(block, q0=1.0, rho0=0.5, n_tokens=n, depth=depth)

    def one(key):  # a draw's per-layer geometry (measure.transient's) and |J^T u|^2 from one stack
        out = measure.gradient_draw(block, key, n, d, depth, 1.0, 0.5)
        return out["p"] / out["q"], out["g"]

    rho, g = jax.jit(jax.vmap(one))(jax.random.split(jax.random.PRNGKey(3), draws))
    rho, g = np.asarray(rho, float), np.asarray(g, float)
    se = rho.std(0, ddof=1) / np.sqrt(draws)
    assert np.all(np.abs(rho.mean(0) - np.asarray(fd["rho"])) <= 4 * se + 2.0 / d), name
    lg, lg_se = np.log(g.mean()) / depth, g.std(ddof=1) / g.mean() / np.sqrt(draws) / depth
    assert abs(lg - float(fd["lambda_g_input"])) <= 4 * lg_se + 2.0 / d, (name, lg, lg_se, float(fd["lambda_g_input"]))


def test_presets_are_pytrees_of_their_numbers():
    """vmap over a preset's init scale: the same numbers as one point at a time."""
    sig = [0.5, 1.0, 1.5]
    with jax.enable_x64(True):
        raw = [layers.presets.pre_ln(sigma=s, alpha=0.5, heads=4) for s in sig]
        scales = layers.sweep.block_scales(raw)
        blocks = [layers.prepare(b, 16, scales=scales)[0] for b in raw]
        stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *blocks)
        ctx = layers.Context(jnp.asarray(16.0))
        k0 = Kernel(jnp.asarray(1.0), jnp.asarray(0.5))
        lg = jax.jit(jax.vmap(lambda b: layers.depth.gradient_exponent(b, ctx, k0, 5)))(stacked)
    for s, v in zip(sig, lg):
        one = layers.gradient_exponent(
            layers.presets.pre_ln(sigma=s, alpha=0.5, heads=4), 1.0, 0.5, n_tokens=16, depth=5
        )
        assert _close(v, one, 1e-12)
