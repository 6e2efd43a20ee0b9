"""The (q, p) mean-field engine (docs/theory.md §2–7) against closed forms, limits, autodiff and
the independent dense reference of ``phasefield.theory.reference``."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import phasefield
from phasefield import HParams
from phasefield.layers import paper
from phasefield.theory import attention, mlp, quadrature
from phasefield.theory.reference import ReferencePoint

pytestmark = pytest.mark.usefixtures("float64")  # the tests' own jit/vmap/grad of theory

# points on both sides of both boundaries (sigma_w, sigma_a, alpha_a, alpha_m)
POINTS = [
    (1.0, 1.0, 0.5, 0.5),
    (2.0, 1.0, 0.5, 0.5),
    (3.0, 1.0, 0.5, 0.5),
    (2.5, 2.0, 0.3, 0.8),
    (6.0, 0.5, 0.9, 0.9),
    (1.5, 3.0, 0.2, 0.95),
]


def hp_of(pt, **kw):
    sw, sa, aa, am = pt
    return HParams(sigma_w=sw, sigma_a=sa, alpha_a=aa, alpha_m=am, **kw)


# ---- attention ------------------------------------------------------------------------------


@pytest.mark.parametrize("rho", [-1 / 31, 0.0, 0.3, 0.9, 1.0])
def test_attention_small_sigma_a_is_rank_one(rho):
    q_a, p_a = attention.forward(1e-4, 32, 1.3, jnp.asarray(rho))
    mean = 1.3**2 * (1 + 31 * rho) / 32
    assert float(q_a) == pytest.approx(mean, abs=1e-7)
    assert float(p_a) == pytest.approx(mean, abs=1e-7)


def test_attention_large_sigma_a_at_zero_cosine_attends_to_self():
    for n in (2, 32, 4096):
        q_a, p_a = attention.forward(20.0, n, 1.0, jnp.asarray(0.0))
        assert float(q_a) == pytest.approx(1.0, abs=1e-12)
        assert float(p_a) == pytest.approx(1.0 / n, rel=1e-9)


def test_attention_matches_eq10_as_written_and_never_overflows():
    ref = ReferencePoint(1.0, 1.7, 0.5, 0.5, n_tokens=7)
    for rho in (-1 / 6, 0.1, 0.5, 0.99):
        q_a, p_a = attention.forward(1.7, 7, 1.0, jnp.asarray(rho))
        np.testing.assert_allclose([float(q_a), float(p_a)], ref.attention(rho), rtol=1e-13)
    rho = jnp.linspace(-1.0, 1.0, 101)
    for sa in (0.05, 20.0, 200.0):
        for n in (2, 4096):
            out = attention.forward(sa, n, 1.0, rho)
            assert all(bool(jnp.all(jnp.isfinite(o))) for o in out)


# ---- MLP integrals --------------------------------------------------------------------------

# the tables' pair integrals in one program per kernel structure (not one per operation)
_pair = jax.jit(mlp._pair, static_argnums=1)

RHOS = np.array([-1.0, -0.93, -0.4, 0.0, 0.27, 0.71, 0.98, 1 - 1e-4, 1 - 1e-8, 1.0])


@pytest.mark.parametrize("s", [0.05, 0.7, 2.0, 4.5, 10.0])
def test_tanh_tables_within_1e9_of_dense_reference(s):
    kern = mlp.kernel(s, "tanh")
    pp, dd = (np.asarray(v) for v in _pair(kern, 0, jnp.asarray(RHOS)))
    t, dt = np.tanh, lambda x: 1 - np.tanh(x) ** 2
    ref_pp = np.array([quadrature.reference_2d(t, t, s, r) for r in RHOS])
    ref_dd = np.array([quadrature.reference_2d(dt, dt, s, r) for r in RHOS])
    np.testing.assert_allclose(pp, ref_pp, atol=1e-9, rtol=0)
    np.testing.assert_allclose(dd, ref_dd, atol=1e-9, rtol=0)
    assert float(kern.q_m) == pytest.approx(s * s * quadrature.reference_1d(lambda x: t(x) ** 2, s), abs=1e-9 * s * s)


@pytest.mark.parametrize("n_v", [47, 64])
def test_folded_trapezoid_equals_the_full_rule(n_v):
    """The symmetry folds of expect_2d sum the same nodes as the unfolded rule."""
    t = jnp.tanh
    t_copy = lambda x: jnp.tanh(x)  # not ``is t``: disables the v fold
    dt = lambda x: 1 - jnp.tanh(x) ** 2
    # one program per rule (theta traced), not one per operation and theta
    folded_at = jax.jit(lambda theta: quadrature.expect_2d(((t, t), (dt, dt)), 2.3, theta, 96, n_v, parity=True))
    full_at = jax.jit(lambda theta: quadrature.expect_2d(((t, t_copy), (dt, lambda x: dt(x))), 2.3, theta, 96, n_v))
    for theta in (0.0, 0.4, 1.9, math.pi):
        np.testing.assert_allclose(folded_at(theta), full_at(theta), rtol=1e-13, atol=1e-15)


def test_gelu_tables_not_odd_within_1e9():
    s = 1.7
    kern = mlp.kernel(s, "gelu")
    from phasefield import activations

    g, dg = (  # jitted: one program per grid shape, not one per operation
        (lambda f: lambda x: np.asarray(f(jnp.asarray(x))))(jax.jit(activations.get("gelu"))),
        (lambda f: lambda x: np.asarray(f(jnp.asarray(x))))(jax.jit(activations.derivative("gelu"))),
    )
    pp, dd = (np.asarray(v) for v in _pair(kern, 0, jnp.asarray(RHOS)))
    np.testing.assert_allclose(pp, [quadrature.reference_2d(g, g, s, r) for r in RHOS], atol=1e-9)
    np.testing.assert_allclose(dd, [quadrature.reference_2d(dg, dg, s, r) for r in RHOS], atol=1e-9)


@pytest.mark.parametrize("s", [0.3, 1.0, 3.0])
def test_erf_and_relu_closed_forms_match_quadrature(s):
    from scipy.special import erf

    derf = lambda x: 2 / math.sqrt(math.pi) * np.exp(-x * x)
    rhos = np.array([-0.9, -0.2, 0.3, 0.8, 0.999])
    k_erf = mlp.kernel(s, "erf")
    pp, dd = (np.asarray(v) for v in _pair(k_erf, 0, jnp.asarray(rhos)))
    np.testing.assert_allclose(pp, [quadrature.reference_2d(erf, erf, s, r) for r in rhos], atol=1e-10)
    np.testing.assert_allclose(dd, [quadrature.reference_2d(derf, derf, s, r) for r in rhos], atol=1e-10)
    k_relu = mlp.kernel(s, "relu")
    pp, dd = (np.asarray(v) for v in _pair(k_relu, 0, jnp.asarray(rhos)))
    # relu has a kink (the trapezoid rule converges slowly): condition on h1 = s z instead,
    # E[relu(h2) | z] = m Phi(m/v) + v phi(m/v) with m = s rho z, v = s sqrt(1 - rho^2)
    from scipy.integrate import quad
    from scipy.stats import norm

    for r, got_pp, got_dd in zip(rhos, pp, dd):
        v = s * math.sqrt(1 - r * r)
        e_relu = lambda z: (s * r * z) * norm.cdf(s * r * z / v) + v * norm.pdf(s * r * z / v)
        want_pp = quad(lambda z: s * z * e_relu(z) * norm.pdf(z), 0, np.inf, epsabs=1e-13)[0]
        want_dd = quad(lambda z: norm.cdf(s * r * z / v) * norm.pdf(z), 0, np.inf, epsabs=1e-13)[0]
        assert got_pp == pytest.approx(want_pp, abs=1e-10)
        assert got_dd == pytest.approx(want_dd, abs=1e-10)


def test_price_theorem_derivative():
    """D = d p_M / d rho: the table of E[phi'phi'] against central differences of p_M."""
    # jitted (one program per activation each, rho traced), not evaluated operation by operation
    p_m, d_m = jax.jit(mlp.p_m), jax.jit(mlp.d_m)
    grad_p_m = jax.jit(jax.grad(mlp.p_m, argnums=1))
    for act in ("tanh", "erf", "gelu"):
        kern = mlp.kernel(2.2, act)
        for r in (-0.5, 0.2, 0.9):
            h = 1e-5
            fd = (p_m(kern, jnp.asarray(r + h)) - p_m(kern, jnp.asarray(r - h))) / (2 * h)
            assert float(d_m(kern, jnp.asarray(r))) == pytest.approx(float(fd), rel=1e-7)
            grad = grad_p_m(kern, jnp.asarray(r))
            assert float(grad) == float(d_m(kern, jnp.asarray(r)))


def test_two_layer_mlp_composes_poole_maps():
    hp = HParams(sigma_w=1.8, mlp_layers=2)
    kern = mlp.kernel(hp)
    s, t = 1.8, np.tanh
    q2 = s * s * quadrature.reference_1d(lambda x: t(x) ** 2, s)
    for r in (0.1, 0.6):
        p1 = s * s * quadrature.reference_2d(t, t, s, r)
        p2 = s * s * quadrature.reference_2d(t, t, math.sqrt(q2), p1 / q2)
        assert float(mlp.p_m(kern, jnp.asarray(r))) == pytest.approx(p2, abs=1e-9)
    assert float(kern.q_m) == pytest.approx(
        s * s * quadrature.reference_1d(lambda x: t(x) ** 2, math.sqrt(q2)), abs=1e-9
    )


def _bits(tree):
    return [np.asarray(x).view(np.int64).tolist() for x in jax.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize("act, k, s", [("tanh", 2, 1.8), ("tanh", 2, 6.0), ("silu", 2, 1.0)])
def test_mlp_kernel_per_layer_tables_equal_one_program_bitwise(act, k, s):
    """mlp.kernel builds the tables with one program per layer (shared by every mlp_layers
    and, for the tanh split rule, every grid size): the same numbers, bit for bit, as
    the whole construction in one program (at the sizes of the scale's size class, padded
    to one series length)."""
    kern = mlp.kernel(s, act, k)
    n_grid, n_cheb = mlp.table_sizes(mlp.size_class(float(np.sqrt(np.asarray(kern.q_layers).max()))))
    whole = jax.jit(lambda sw: mlp.pad(mlp._build(sw, act, k, n_grid, n_cheb), mlp.PAD_CHEB))
    assert _bits(kern) == _bits(whole(jnp.asarray(s)))


# ---- block map and fixed points -------------------------------------------------------------


@pytest.mark.parametrize("pt", POINTS)
def test_rho_one_is_invariant_and_collapsed_point_is_fixed(pt):
    hp = hp_of(pt)
    q1, p1 = paper.block_map(hp, 2.7, 2.7)
    assert float(p1) == pytest.approx(float(q1), rel=1e-12)
    q_star, qz_star = paper.collapsed_fixed_point(hp)
    q1, p1 = paper.block_map(hp, q_star, q_star)
    assert float(q1) == pytest.approx(float(q_star), rel=1e-12)
    assert float(p1) == pytest.approx(float(q_star), rel=1e-12)
    assert float(qz_star) == pytest.approx(float(paper.attention_step(hp, q_star, q_star)[0]), rel=1e-12)


@pytest.mark.parametrize("pt", POINTS)
def test_stable_fixed_point_is_fixed_and_attracting(pt):
    hp = hp_of(pt)
    q, rho, _, _ = paper.stable_fixed_point(hp)
    q1, p1 = paper.block_map(hp, q, rho * q)
    assert float(q1) == pytest.approx(float(q), rel=1e-10)
    assert float(p1 / q1) == pytest.approx(float(rho), abs=1e-10)
    qs, ps = paper.trajectory(hp, 1.0, 0.5, 400)
    assert float(ps[-1] / qs[-1]) == pytest.approx(float(rho), abs=2e-3)


def test_identity_residual_collapsed_point_is_at_infinity():
    """beta = 1: the norm grows by a constant per block, so the collapsed point is q* = +inf
    (not NaN). The closed forms and their checks are in tests/test_edges.py."""
    hp = HParams(sigma_w=1.0, residual="identity")
    q_star, qz_star = paper.collapsed_fixed_point(hp)
    assert float(q_star) == math.inf and float(qz_star) == math.inf
    qs, ps = paper.trajectory(hp, 1.0, 0.5, 8)  # the map itself is fine (norm grows)
    assert np.all(np.diff(np.asarray(qs)) > 0)


# ---- exponents ------------------------------------------------------------------------------


@pytest.mark.parametrize("pt", POINTS)
@pytest.mark.parametrize("kw", [{}, {"activation": "erf"}, {"mlp_layers": 2}])
def test_closed_form_lambda_a_equals_autodiff(pt, kw):
    hp = hp_of(pt, **kw)
    closed = float(paper.angle_exponent(hp, method="closed"))
    auto = float(paper.angle_exponent(hp, method="autodiff"))
    assert auto == pytest.approx(closed, abs=1e-8)


@pytest.mark.parametrize("pt", POINTS)
def test_gradient_modes_at_collapse(pt):
    hp = hp_of(pt)
    q_star, qz_star = paper.collapsed_fixed_point(hp)
    m = np.asarray(jax.jit(paper.gradient_matrix)(hp, mlp.kernel(hp), q_star, 1.0, qz_star, 1.0))
    eig = np.sort(np.linalg.eigvals(m).real)
    expect = np.sort([math.exp(float(paper.angle_exponent(hp))), float(paper.mean_mode(hp))])
    np.testing.assert_allclose(eig, expect, rtol=1e-10)


@pytest.mark.parametrize("pt", POINTS)
def test_against_the_dense_reference(pt):
    hp = hp_of(pt)
    got = {k: float(v) for k, v in paper.exponents(hp).items()}
    ref = ReferencePoint(*pt).exponents()
    for k, v in ref.items():
        assert got[k] == pytest.approx(v, abs=1e-8), k
    # finite depth from a general input geometry: scan vs explicit loops
    lg = float(paper.gradient_exponent(hp, 1.3, 0.4, 16))
    assert lg == pytest.approx(ReferencePoint(*pt).lambda_g(1.3, 0.4, 16), abs=1e-8)


def test_collapsed_lambda_g_closed_form_equals_the_scan():
    for pt in POINTS:
        hp = hp_of(pt, depth=16)
        assert float(paper.gradient_exponent(hp)) == pytest.approx(
            float(paper.exponents(hp)["lambda_g_collapse"]), abs=1e-10
        )


def test_theory_md_check_values():
    la = float(paper.angle_exponent(HParams(sigma_w=3.0, sigma_a=1.0, alpha_a=0.5, alpha_m=0.5)))
    assert la == pytest.approx(0.2855, abs=5e-5)
    lg = float(
        paper.exponents(HParams(sigma_w=1.0, sigma_a=1.0, alpha_a=0.5, alpha_m=0.5, n_tokens=32, depth=16))[
            "lambda_g_collapse"
        ]
    )
    assert lg == pytest.approx(-0.188, abs=5e-4)


def test_scalar_vmap_jit_agree():
    pts = np.array(POINTS)
    kw = dict(sigma_w=pts[:, 0], sigma_a=pts[:, 1], alpha_a=pts[:, 2], alpha_m=pts[:, 3])
    hps = HParams(
        **{k: jnp.asarray(v) for k, v in kw.items()},
        n_tokens=jnp.full(len(pts), 32.0),
        depth=jnp.full(len(pts), 16.0),
        sigma_v=jnp.ones(len(pts)),
    )
    kern = jax.jit(jax.vmap(lambda s: mlp.kernel(s, "tanh", n_grid=768, n_cheb=257)))(hps.sigma_w)
    # vmap of the jitted map (one batched program) and jit of the vmapped map
    vm = jax.vmap(jax.jit(paper.exponents))(hps, kern)
    jt = jax.jit(jax.vmap(paper.exponents))(hps, kern)
    for i, pt in enumerate(POINTS):
        one = paper.exponents(hp_of(pt))
        for k in one:
            assert float(vm[k][i]) == pytest.approx(float(one[k]), abs=1e-9), k
            assert float(jt[k][i]) == pytest.approx(float(vm[k][i]), abs=1e-12), k


def test_grad_in_every_numeric_field():
    hp = HParams(sigma_w=2.4, sigma_a=1.3, alpha_a=0.6, alpha_m=0.4, n_tokens=32.0, depth=16.0)
    f = jax.jit(
        lambda h: paper.exponents(h, mlp.kernel(h.sigma_w, h.activation, h.mlp_layers, n_grid=192, n_cheb=65))[
            "lambda_g_collapse"
        ]
    )
    g = jax.jit(jax.grad(f))(hp)
    for name in ("sigma_w", "alpha_a", "alpha_m", "sigma_v", "n_tokens", "depth"):
        eps = 1e-5
        fd = (f(hp.replace(**{name: getattr(hp, name) + eps})) - f(hp.replace(**{name: getattr(hp, name) - eps}))) / (
            2 * eps
        )
        assert float(getattr(g, name)) == pytest.approx(float(fd), rel=1e-5, abs=1e-9), name
    # lambda_g_inf's gradient (through the root search) on smaller MLP tables: its compile
    # time grows with the table sizes (60 s at 192 x 65, 20 s at 32 x 17 on 2 cores)
    kern_of = lambda h: mlp.kernel(h.sigma_w, h.activation, h.mlp_layers, n_grid=32, n_cheb=17)
    gi = jax.jit(jax.grad(lambda h: paper.exponents(h, kern_of(h))["lambda_g_inf"]))(hp)
    assert all(bool(jnp.isfinite(x)) for x in jax.tree.leaves(gi))


def test_no_nan_over_an_extreme_grid():
    ds = phasefield.sweep(
        sigma_w=[0.05, 1.0, 20.0],
        sigma_a=[0.05, 1.0, 20.0],
        alpha=[0.01, 0.5, 0.999],
        n_tokens=[2, 32, 4096],
        depth=[1, 16, 64],
    )
    for k in ds.data_vars:
        assert bool(np.isfinite(ds[k]).all()), k
    assert float(ds.rho_star.min()) >= -1.0 and float(ds.rho_star.max()) <= 1.0
