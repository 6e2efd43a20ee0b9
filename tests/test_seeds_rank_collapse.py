"""Noci et al. 2022 formulas against autodiff on random attention blocks (seeds 000/003)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import phasefield  # noqa: F401  (x64)
from phasefield.seeds import rank_collapse as rc

# these tests transform the seed formulas with their own jit/vmap: JAX's scoped x64 switch
# (the library's functions enter it themselves; tests/test_isolation.py checks that)
pytestmark = pytest.mark.usefixtures("float64")

K = jax.random.PRNGKey
D = 800  # draws of every fixed-X check (one compilation per shape)


def _within(mc, key, value, z=4.0):
    assert abs(mc[key] - float(value)) < z * mc[key + "_se"], (key, mc[key], mc[key + "_se"], float(value))


@pytest.fixture(scope="module")
def X48():
    return rc.gaussian_tokens(K(1), 4, 8, 1.0, 0.3)


@pytest.fixture(scope="module")
def mc48(X48):
    return rc.mc_gradient_norms(K(0), X=X48, draws=D, mode="uniform")


def test_value_gradient_eq6_exact(X48, mc48):
    # uniform attention: ||dS/dW_V||^2 = d n |x_bar|^2 for every weight draw
    assert mc48["value_se"] < 1e-9 * mc48["value"]
    assert mc48["value"] == pytest.approx(float(rc.value_grad_sq(X48)), rel=1e-10)


def test_query_key_gradient_eq7(X48, mc48):
    _within(mc48, "query", rc.query_grad_sq(X48))
    _within(mc48, "key", rc.query_grad_sq(X48))


def test_input_gradient_exact_and_eq8(X48, mc48):
    _within(mc48, "input", rc.input_grad_sq_exact(X48))
    t = rc.input_grad_terms(X48)
    for k in ("A1", "A2", "A3", "cross"):
        _within(mc48, "input_" + k, t[k])
    assert float(rc.input_grad_sq_bound_corrected(X48)) >= mc48["input"]


def test_eq8_bound_fails_for_correlated_tokens_with_large_mean():
    n, d = 4, 8
    X = 5.0 * jnp.ones((n, 1)) * jax.random.normal(K(3), (1, d)) + jax.random.normal(K(4), (n, d))
    mc = rc.mc_gradient_norms(K(5), X=X, draws=D, mode="uniform")
    _within(mc, "input", rc.input_grad_sq_exact(X))
    _within(mc, "input_A2", rc.input_grad_terms(X)["A2"])
    assert float(rc.input_grad_sq_bound(X)) < mc["input"] - 4 * mc["input_se"]
    # the appendix's Eq. 36 claims E||A2||^2 = E||A1||^2; here A2 is many times A1
    assert mc["input_A2"] > 5 * mc["input_A1"]


def test_eq8_prefactor_dk_ne_dv():
    n, d = 4, 8
    X = rc.gaussian_tokens(K(6), n, d, 1.0, 0.3)
    B = rc.centered_gram(X)
    b2 = float(jnp.sum(B * B))
    for dk in (2, 32):
        mc = rc.mc_gradient_norms(K(7), X=X, draws=D, mode="uniform", d_k=dk)
        derived = float(rc.input_grad_terms(X, d_k=dk)["A1"])  # s_q^2 s_k^2 s_v^2 d_v^2 |B|^2 / n
        printed = (1 / dk) * (1 / dk) * (1 / d) * dk * d / n * b2  # ... d_k d_v |B|^2 / n
        _within(mc, "input_A1", derived)
        assert abs(mc["input_A1"] - printed) > 10 * mc["input_A1_se"]


def test_gaussian_tokens_eq17_eq18():
    n, d = 2, 4  # Eq. 18 misses the factor 1 + 4(1-rho)/(nd) = 1.5 here
    for i, rho in enumerate((0.0, 0.6)):
        mc = rc.mc_gradient_norms(K(10 + i), n=n, d=d, rho=rho, draws=3000, mode="uniform")
        _within(mc, "value", rc.value_grad_gaussian(1.0, rho, n, d))
        _within(mc, "query", rc.query_grad_gaussian(1.0, rho, n, d, exact=True))
        if rho == 0.0:
            assert abs(mc["query"] - float(rc.query_grad_gaussian(1.0, rho, n, d))) > 4 * mc["query_se"]


def test_sigma_x_scaling_cubic_vs_linear():
    n, d = 2, 4
    a = rc.mc_gradient_norms(K(20), n=n, d=d, sigma_x=1.0, draws=3000)
    b = rc.mc_gradient_norms(K(20), n=n, d=d, sigma_x=2.0, draws=3000)  # same draws, scaled
    assert b["value"] / a["value"] == pytest.approx(4.0, rel=1e-10)
    assert b["query"] / a["query"] == pytest.approx(64.0, rel=1e-10)


def test_temperature_eq46_eq47():
    n, d, rho = 4, 8, 0.3
    tau = float(rc.temperature(1.3, rho, n, d))
    assert float(rc.query_grad_gaussian(1.3, rho, n, d, tau=tau)) == pytest.approx(
        float(rc.value_grad_gaussian(1.3, rho, n, d)), rel=1e-12
    )
    X = rc.gaussian_tokens(K(2), n, d, 1.0, rho)
    W = rc.draw_weights(K(3), d, d)
    gn = jax.jit(rc.gradient_norms, static_argnames="mode")
    g1 = gn(X, W, 1.0, mode="uniform")
    gt = gn(X, W, tau, mode="uniform")
    assert float(gt["query"]) == pytest.approx(tau**2 * float(g1["query"]), rel=1e-10)
    assert float(gt["value"]) == pytest.approx(float(g1["value"]), rel=1e-12)


@pytest.mark.parametrize("mode", rc.MODES)
def test_theorem_3_2_vanishing_query_key_gradients(mode):
    d = 8
    x = jax.random.normal(K(30), (1, d))
    X = jnp.ones((5, 1)) * x
    g = rc.query_grad_through_loss(X, K(31), depth=2, mode=mode)
    assert g["value"] > 1e-3
    assert g["query"] < 1e-24 * g["value"] and g["key"] < 1e-24 * g["value"]
    Xr = X + 0.1 * jax.random.normal(K(32), X.shape)
    gr = rc.query_grad_through_loss(Xr, K(31), depth=2, mode=mode)
    assert gr["query"] > 1e-8 * gr["value"]


def test_forward_recursion_closed_form_and_limits():
    C0, F0, n = 3.0, 10.0, 6
    for a1, a2, L in ((0.3, 0.7, 7), (0.0, 0.5, 5), (1.0, 1.0, 12)):
        C, F = rc.forward_moments(C0, F0, n, a1, a2, L)
        Cc, Fc = rc.forward_closed_form(C0, F0, n, a1, a2, L)
        assert float(C[-1]) == pytest.approx(float(Cc), rel=1e-12)
        assert float(F[-1]) == pytest.approx(float(Fc), rel=1e-12)
    L = 200000
    C, F = rc.forward_moments(C0, F0, n, np.sqrt(0.8 / L), np.sqrt(1.5 / L), L)
    Cl, Fl, rl = rc.depth_limit(C0, F0, n, 0.8, 1.5)
    assert float(C[-1]) == pytest.approx(float(Cl), rel=1e-4)
    assert float(F[-1]) == pytest.approx(float(Fl), rel=1e-4)
    assert float(rc.correlation(C[-1], F[-1], n)) == pytest.approx(float(rl), rel=1e-4)
    C, F = rc.forward_moments(C0, F0, n, 1.0, 1.0, 60)  # Eq. 16: alpha fixed -> rho -> 1
    assert float(rc.correlation(C[-1], F[-1], n)) > 1 - 1e-12


def test_forward_recursion_against_simulation():
    n, d, L = 4, 8, 4
    X = rc.gaussian_tokens(K(40), n, d, 1.0, 0.2)
    a1 = jnp.array([1.0, 0.5, 0.8, 0.3])
    a2 = jnp.array([0.4, 1.0, 0.2, 0.6])
    sim = rc.mc_stack_forward(K(41), X, L, a1, a2, draws=1500)
    C, F = rc.forward_moments(float(rc.C_of(X)), float(rc.frob2(X)), n, a1, a2)
    for l in range(1, L + 1):
        assert abs(sim["C"][l] - float(C[l])) < 4 * sim["C_se"][l]
        assert abs(sim["F"][l] - float(F[l])) < 4 * sim["F_se"][l]
