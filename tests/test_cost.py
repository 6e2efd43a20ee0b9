"""The cost-cliff fixes hold the numbers: closed-form Gaussian smoothings and
the 1-D conditional rule against the dense references, the table and attention code
paths against the plain rules they stand in for. (No timings here: ``scripts/bench_cost.py`` measures them.)"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phasefield import HParams, activations
from phasefield.theory import mlp, quadrature, smoothed
from phasefield.theory.attention import exact

pytestmark = pytest.mark.usefixtures("float64")

_gelu = activations.get("gelu")
_dgelu = activations.derivative("gelu")
_gelu_jit, _dgelu_jit = jax.jit(_gelu), jax.jit(_dgelu)  # one program per shape, not one per op
np_gelu = lambda x: np.asarray(_gelu_jit(jnp.asarray(x)))
np_dgelu = lambda x: np.asarray(_dgelu_jit(jnp.asarray(x)))

# the rules under test, jitted: one program per static shape instead of dozens of eager ops
sm_gelu, sm_dgelu, gelu_pair = jax.jit(smoothed.gelu), jax.jit(smoothed.dgelu), jax.jit(smoothed.gelu_pair)
expect_2d_conditional = jax.jit(quadrature.expect_2d_conditional, static_argnums=(0, 3))
e_sq = jax.jit(mlp._e_sq, static_argnums=(0, 2, 3))
tables = jax.jit(mlp._tables, static_argnums=(0, 2, 3), static_argnames=("split",))
clenshaw = jax.jit(mlp.clenshaw)


@pytest.mark.parametrize("c", [0.0, 0.3, 1.0, 4.0, 17.0])
def test_gelu_smoothing_closed_form_matches_quadrature(c):
    for m in (-7.0, -1.3, 0.0, 0.4, 3.0, 25.0):
        if c == 0.0:
            want, want_d = float(np_gelu(m)), float(np_dgelu(m))
        else:
            want = quadrature.reference_1d(lambda w: np_gelu(m + w), c)
            want_d = quadrature.reference_1d(lambda w: np_dgelu(m + w), c)
        assert float(sm_gelu(jnp.asarray(m), jnp.asarray(c))) == pytest.approx(want, abs=1e-12 * max(1, abs(want)))
        assert float(sm_dgelu(jnp.asarray(m), jnp.asarray(c))) == pytest.approx(want_d, abs=1e-12)


@pytest.mark.parametrize("s", [0.3, 5.0, 17.65])
def test_conditional_rule_matches_dense_2d_reference(s):
    n = quadrature.grid_size(s)
    pairs = ((_gelu, smoothed.gelu), (_dgelu, smoothed.dgelu))
    for rho in (-1.0, -0.6, 0.0, 0.5, 0.98, 1 - 1e-6, 1.0):
        pp, dd = expect_2d_conditional(pairs, s, rho, n)
        ref_pp = quadrature.reference_2d(np_gelu, np_gelu, s, rho)
        ref_dd = quadrature.reference_2d(np_dgelu, np_dgelu, s, rho)
        assert float(pp) == pytest.approx(ref_pp, abs=1e-10 * max(1.0, abs(ref_pp)))
        assert float(dd) == pytest.approx(ref_dd, abs=1e-10)


@pytest.mark.parametrize("s", [0.05, 1.7, 17.65, 60.0, 7000.0])
def test_gelu_pair_closed_form_matches_conditional_rule(s):
    """gelu_pair (the kernel the MLP map uses) against the 1-D conditional rule (itself
    checked against the dense 2-D reference above), up to s = 7000 (mlp_layers 2 at
    sigma_w = 100), rho = +-1 included."""
    n = quadrature.grid_size(min(s, 60.0)) if s <= 60 else 1 << 20
    pairs = ((_gelu, smoothed.gelu), (_dgelu, smoothed.dgelu))
    for rho in (-1.0, -0.6, 0.0, 0.5, 0.98, 1 - 1e-6, 1.0):
        want_pp, want_dd = expect_2d_conditional(pairs, s, rho, n)
        pp, dd = gelu_pair(s * s, rho)
        assert float(pp) == pytest.approx(float(want_pp), abs=1e-12 * max(1.0, s * s))
        assert float(dd) == pytest.approx(float(want_dd), abs=1e-12)


@pytest.mark.parametrize("s", [5.0])
def test_gelu_closed_form_equals_the_old_2d_tables(s):
    n_grid, n_cheb = mlp.table_sizes(s)
    e2 = quadrature.expect_1d(lambda x: _gelu(x) ** 2, s)
    d2 = quadrature.expect_1d(lambda x: _dgelu(x) ** 2, s)
    np.testing.assert_allclose([e2, d2], smoothed.gelu_pair(s * s, 1.0), rtol=1e-13)
    old = tables("gelu", jnp.asarray(s), n_grid, n_cheb, e2, d2)
    kern = mlp.kernel(HParams(sigma_w=s, activation="gelu"))
    rho = jnp.linspace(-1.0, 1.0, 41)
    new = mlp._pair(kern, 0, rho)
    for c_old, v_new in zip(old, new):
        np.testing.assert_allclose(v_new, clenshaw(c_old, rho), rtol=0, atol=1e-10 * s * s)


def test_two_layer_gelu_at_sigma_w_5_matches_dense_composition():
    """The slow point: mlp_layers 2 at sigma_w 5 (second layer at scale ~17.7)."""
    sw = 5.0
    kern = mlp.kernel(HParams(sigma_w=sw, activation="gelu", mlp_layers=2))
    q2 = sw * sw * quadrature.reference_1d(lambda x: np_gelu(x) ** 2, sw)
    s2 = math.sqrt(q2)
    assert float(kern.q_layers[1]) == pytest.approx(q2, rel=1e-12)
    for r in (0.2, 0.9):
        p1 = sw * sw * quadrature.reference_2d(np_gelu, np_gelu, sw, r)
        r2 = p1 / q2
        p2 = sw * sw * quadrature.reference_2d(np_gelu, np_gelu, s2, r2)
        assert float(mlp.p_m(kern, jnp.asarray(r))) == pytest.approx(p2, rel=1e-10)


# ---- tanh: erf part in closed form, localized remainder on fixed-size rules ------------------

_dtanh = activations.derivative("tanh")
np_dtanh = lambda x: 1 - np.tanh(x) ** 2


def test_tanh_split_pieces():
    from scipy.special import erf

    k = smoothed.KAPPA
    x = np.array([quadrature.R_LOCAL, 25.0, 300.0])
    # XLA's float64 tanh is a few ulp off 1 there (exact: 4e-17): rounding level either way
    assert np.all(np.abs(np.asarray(smoothed.tanh_rest(jnp.asarray(np.r_[x, -x])))) < 1e-15)
    assert np.all(np.abs(np.asarray(_dtanh(jnp.asarray(x)))) < 2e-15)
    for s in (0.4, 3.0, 40.0):
        for r in (-0.7, 0.2, 0.95, 1.0):
            want = quadrature.reference_2d(lambda h: erf(k * h), lambda h: erf(k * h), s, r)
            assert float(smoothed.erf_pair(s * s, r)) == pytest.approx(want, abs=1e-12)
    for m in (-3.0, 0.0, 0.8, 12.0):
        for c in (0.5, 2.0, 30.0):
            want = quadrature.reference_1d(lambda w: erf(k * (m + w)), c)
            assert float(smoothed.erf_given(jnp.asarray(m), jnp.asarray(c))) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("s", [0.05, 0.7, 10.0, 100.0])
def test_tanh_one_dimensional_integrals_at_any_scale(s):
    """E[tanh^2], E[tanh'^2] by the split: the old 2049-node rule was 0.8 % off at s = 100."""
    e2, d2 = e_sq("tanh", jnp.asarray(s), jnp.tanh, _dtanh)
    assert float(e2) == pytest.approx(quadrature.reference_1d(lambda x: np.tanh(x) ** 2, s), abs=1e-13)
    assert float(d2) == pytest.approx(quadrature.reference_1d(lambda x: np_dtanh(x) ** 2, s), abs=1e-13)


@pytest.mark.parametrize("s", [1.3, 4.5, 30.0])  # 1.3: the plain rule (grid <= PLAIN_GRID_MAX)
def test_tanh_split_tables_match_dense_2d_reference(s):
    n_grid, n_cheb = mlp.table_sizes(s)
    e2, d2 = e_sq("tanh", jnp.asarray(s), jnp.tanh, _dtanh)
    c_pp, c_dd = tables("tanh", jnp.asarray(s), n_grid, n_cheb, e2, d2)
    # at the Chebyshev nodes the series reproduces the node values (no truncation error)
    theta = np.pi * np.array([3, 40, 100, 200]) / (n_cheb - 1)
    rho = np.cos(theta)
    pp, dd = (np.asarray(clenshaw(c, jnp.asarray(rho))) for c in (c_pp, c_dd))
    for r, got_pp, got_dd in zip(rho, pp, dd):
        assert got_pp == pytest.approx(quadrature.reference_2d(np.tanh, np.tanh, s, r), abs=1e-10)
        assert got_dd == pytest.approx(quadrature.reference_2d(np_dtanh, np_dtanh, s, r), abs=1e-10)


@pytest.mark.parametrize("s", [1.3, 4.5])
def test_tanh_split_tables_equal_the_2d_rule(s):
    n_grid, n_cheb = mlp.table_sizes(s)
    e2, d2 = e_sq("tanh", jnp.asarray(s), jnp.tanh, _dtanh)
    new = tables("tanh", jnp.asarray(s), n_grid, n_cheb, e2, d2, split=True)
    old = tables("tanh", jnp.asarray(s), n_grid, n_cheb, e2, d2, split=False)
    rho = jnp.linspace(-1.0, 1.0, 41)
    for c_new, c_old in zip(new, old):
        np.testing.assert_allclose(clenshaw(c_new, rho), clenshaw(c_old, rho), rtol=0, atol=1e-10)


def _g(p, v):
    return np.exp(p * v - np.exp(np.minimum(v, 60.0)))


def _pair_dense(grid, p, r):
    """H_pr(a, b) = E g_p(a + x) g_r(b + y) by the direct two-dimensional rule (the
    reference of the shared/own split): y = rho x + tau sqrt(1 - rho^2) w, both on the z-grid (n_a x n_z^2)."""
    a, z, wz = (np.asarray(v) for v in (grid.a, grid.z, grid.wz))
    rho, tau = float(grid.rho), float(grid.tau)
    x = tau * z
    noise = tau * np.sqrt(max(1 - rho * rho, 0.0)) * z
    gam = _g(r, a[:, None, None] + rho * x[None, :, None] + noise[None, None, :]) @ wz  # [b, m]
    return (_g(p, a[:, None] + x[None, :]) * wz) @ gam.T


@pytest.mark.parametrize("sigma_a,n,rho", [(2.3, 32, -0.03), (2.3, 32, 0.004), (2.3, 32, 0.97), (1.0, 2, -1.0)])
def test_exact_attention_pair_rule_equals_direct_rules(sigma_a, n, rho):
    """The shared-logit pair rule (lattice or Gauss-Hermite in c, exact._pair_tables: both
    branches, both signs of rho, n = 2 at rho = -1) against the direct rule on the same
    a-grid with a z-grid twice as fine (n_a x (2 n_z)^2 values; converged: within 2e-15 of
    4x finer). Where c is wide (the lattice rule) to 1e-13 of max |H|; where it is narrow
    (sigma_c < SIGMA_C_LATTICE, here rho = 0.004) the z-grid's own resolution of the
    double-exponential edge of g_p (spacing <= H_X logits, no averaging over c) limits
    both rules: there the pair rule must be no less accurate than the direct rule on the
    same grids, or within 1e-13 (measured at rho = 0.004: 3e-9 against 3e-8 of max |H_22|; the S values stay within 1e-12,
    test_exact.py)."""
    n_a, n_z = exact.sizes(sigma_a, n)
    gr = exact.Grid(sigma_a, n, jnp.asarray(rho), n_a, n_z)
    fine = exact.Grid(sigma_a, n, jnp.asarray(rho), n_a, 2 * n_z + 1)
    pairs = [(0, 0), (1, 1), (2, 1), (2, 2), (2, 0), (0, 2)]
    new = {k: np.asarray(v) for k, v in exact._pair_tables(gr, pairs).items()}
    wide = float(gr.sigma_c) >= exact.SIGMA_C_LATTICE
    for p, r in pairs:
        ref = _pair_dense(fine, p, r)
        scale = np.abs(ref).max()
        err = np.abs(new[p, r] - ref).max() / scale
        allowed = 1e-13 if wide else max(1e-13, np.abs(_pair_dense(gr, p, r) - ref).max() / scale)
        assert err < allowed, (p, r, err, allowed)
