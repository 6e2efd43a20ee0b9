"""Exact-softmax attention map (phasefield.theory.attention.exact): against brute-force Monte-Carlo of
the n x n Gaussian logit field, its limits, lambda_a, and the docs/theory.md §3 case."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phasefield import HParams, theory
from phasefield.layers import paper
from phasefield.layers.paper import block
from phasefield.theory import attention
from phasefield.theory.attention import exact
from phasefield.theory.attention import paper as paper_map  # Eq. 10 (the block: paper)

pytestmark = pytest.mark.usefixtures("float64")


def _jit(fn, *args):
    """``fn(*args)`` as one compiled program (its arguments closed over: concrete, so the
    grid sizes are the ones a direct call picks), not op by op (dozens of tiny programs)."""
    return jax.jit(lambda: fn(*args))()


@functools.cache
def _brute_force(sigma_a, rho, n):
    """Brute-force S_1, S_rho and their standard errors (60,000 logit fields, seed 7), once
    per process for the tests that read the same point."""
    return exact.monte_carlo_s(sigma_a, rho, n, samples=60_000, seed=7)


@pytest.mark.parametrize("sigma_a,rho,n", [(1.0, 0.3, 8), (3.0, 0.3, 8), (4.0, -0.1, 4), (2.0, 0.9, 6), (4.0, 0.6, 5)])
def test_s_values_match_brute_force(sigma_a, rho, n):
    s1, sr = (float(v) for v in _jit(exact.s_values, sigma_a, n, rho))
    m1, e1, mr, er = _brute_force(sigma_a, rho, n)
    assert abs(s1 - m1) < 4 * e1 + 1e-6
    assert abs(sr - mr) < 4 * er + 1e-6


def test_paper_map_is_wrong_at_large_sigma_a():
    # the brute-force value differs from the paper's 1 - w by many standard errors
    w1, wr = paper_map.weights(3.0, 8, 0.3)
    m1, e1, mr, er = _brute_force(3.0, 0.3, 8)  # test_s_values_match_brute_force's draws
    assert abs((1 - float(w1)) - m1) > 50 * e1
    assert abs((1 - float(wr)) - mr) > 50 * er


def test_normalization_and_convergence_large_n():
    rm = _jit(exact.row_moments, 4.0, 4096, 0.3)
    assert abs(float(rm["a1"]) * 4096 - 1.0) < 1e-9  # E[A_1] = 1/n
    base = np.array([float(v) for v in _jit(exact.s_values, 4.0, 4096, 0.3)])
    fine = np.array([float(v) for v in _jit(exact.s_values, 4.0, 4096, 0.3, 400, 201)])
    np.testing.assert_allclose(base, fine, rtol=1e-7)


def test_collapsed_and_small_sigma_limits():
    s1, sr = _jit(exact.s_values, 2.0, 16, 1.0)
    assert abs(float(s1) - 1 / 16) < 1e-10 and abs(float(sr) - 1 / 16) < 1e-10
    q_a, p_a = _jit(exact.forward, 1e-3, 16, 1.0, 0.4)
    np.testing.assert_allclose([float(q_a), float(p_a)], [(1 + 15 * 0.4) / 16] * 2, atol=1e-6)


def test_backward_consistent_with_forward_identities():
    # rows of A sum to one: sum over m' of the backward map applied to G = 11^T (a=0, b=1)
    diag, off = _jit(attention.backward, 2.5, 12, 1.0, 1.0, 0.2, 0.0, 1.0, "exact")
    assert abs(float(diag + 11 * off) - 12.0) < 1e-8  # 1^T A^T 1 1^T A 1 / n = n


def test_lambda_a_exact_equals_paper_and_jit_vmap():
    for sa in (2.0,):
        hp = HParams(sigma_w=2.0, sigma_a=sa, alpha_a=0.5, alpha_m=0.7)
        la_p = float(paper.angle_exponent(hp))
        la_e = float(paper.angle_exponent(hp.replace(attention="exact"), method="autodiff"))
        assert abs(la_p - la_e) < 1e-9
    f = jax.jit(jax.vmap(lambda s: attention.forward(s, 32, 1.0, 0.3, "exact")[0]))
    out = np.asarray(f(jnp.array([1.0, 2.0])))
    assert np.all(np.isfinite(out)) and out[1] > out[0]


def test_theory_md_case_and_simulation():
    """docs/theory.md §3: n=32, sigma_w=2, sigma_A=3, alpha_A=.5, alpha_M=.7, rho0=.3, 16 blocks:
    paper 0.19, exact 0.30, d=512 simulation 0.27."""
    hp = HParams(sigma_w=2.0, sigma_a=3.0, alpha_a=0.5, alpha_m=0.7, n_tokens=32, depth=16)
    qs, ps = block.trajectory(hp, 1.0, 0.3, 16)
    rho_paper = float(ps[-1] / qs[-1])
    qs, ps = block.trajectory(hp.replace(attention="exact"), 1.0, 0.3, 16)
    rho_exact = float(ps[-1] / qs[-1])
    assert abs(rho_paper - 0.19) < 0.005
    assert abs(rho_exact - 0.30) < 0.005
    from phasefield.layers import presets
    from phasefield.simulate import measure

    sim = measure.transients(presets.paper(hp), 1.0, 0.3, n_tokens=32, width=512, draws=4, depth=16, seed=0)
    r, se = sim["rho"][-1], sim["rho_se"][-1]
    assert abs(r - rho_exact) < 0.05 + 3 * se
    assert abs(r - rho_exact) < abs(r - rho_paper)


# ---- grid sizes from the concrete sigma_A, n; mesh values shared; polish ---------------------


@pytest.mark.parametrize("sigma_a,n", [(4.5, 32), (1.0, 1024)])
def test_concrete_sizes_resolve_s_to_1e12(sigma_a, n):
    # the sizes chosen from a concrete sigma_A, n (what theory functions now use) against
    # grids 1.6x finer in both directions
    n_a, n_z = exact.sizes(sigma_a, n)
    rhos = jnp.array([-1.0 / (n - 1), 0.2, 0.7, 0.99])
    at = lambda n_a, n_z: jax.jit(jax.vmap(lambda r: jnp.stack(exact.s_values(sigma_a, n, r, n_a, n_z))))(rhos)
    base, fine = np.asarray(at(n_a, n_z)), np.asarray(at(int(1.6 * n_a), int(1.6 * n_z) | 1))
    assert base.shape == (4, 2) and np.all(np.isfinite(base))
    np.testing.assert_allclose(base, fine, rtol=0, atol=1e-12)


def test_public_functions_key_on_concrete_sizes():
    from phasefield.theory.attention import exact_table

    hp = HParams(sigma_a=1.0, n_tokens=32, attention="exact")
    kern = theory.kernel(hp)
    att = exact_table.kernel(hp.sigma_a, hp.n_tokens)
    assert (att.n_a, att.n_z) == exact.sizes(hp.sigma_a, hp.n_tokens) != exact.sizes()
    q_a, p_a = _jit(attention.forward, hp.sigma_a, hp.n_tokens, hp.sigma_v, 0.3, "exact", att)
    ref = _jit(exact.forward, hp.sigma_a, hp.n_tokens, hp.sigma_v, 0.3)  # concrete sizes as well
    np.testing.assert_allclose([float(q_a), float(p_a)], [float(ref[0]), float(ref[1])], rtol=1e-14)
    # a traced hp inside the user's own jit gets the default sizes (and still works)
    with jax.enable_x64(True):
        f = jax.jit(lambda s: paper.exponents(hp.replace(sigma_a=s), kern)["rho_star"])
        assert np.isfinite(float(f(1.0)))


@pytest.mark.parametrize("sigma_a,n,corr", [(3.0, 8, True)])
def test_table_search_equals_direct_search(sigma_a, n, corr):
    """Stable points from the shared mesh values (bisection on their interpolant, Newton
    polish on the exact map) against the direct search (the exact map on the mesh,
    bisection and Newton on it), same grid sizes, at a (sigma_w, alpha) point."""
    from phasefield.layers.paper import fixed_points
    from phasefield.theory import mlp
    from phasefield.theory.attention import exact_table

    base = HParams(sigma_a=sigma_a, n_tokens=n, attention="exact", softmax_correction=corr)
    att = exact_table.point_kernel(sigma_a, n)  # its cap's sizes; (S, T) on the full mesh
    pts = [(8.0, 0.7, 0.4)]  # (2.0, .5, .5) too when measured; one for suite time
    with jax.enable_x64(True):
        fns = {t: jax.jit(lambda hp, k, t=t: fixed_points.stable_points_of(hp, k, t)) for t in (True, False)}
        for sw, aa, am in pts:
            hp = base.replace(sigma_w=sw, alpha_a=aa, alpha_m=am)
            kern = mlp.kernel(hp).replace(att=att)
            new, old = fns[True](hp, kern), fns[False](hp, kern.replace(att=att.replace(s=None, interp=False)))
            assert bool(jnp.all(new["stable"] == old["stable"])) and int(new["n_stable"]) == int(old["n_stable"])
            np.testing.assert_allclose(np.asarray(new["rho"]), np.asarray(old["rho"]), rtol=0, atol=1e-12)
            np.testing.assert_allclose(float(new["rho_star"]), float(old["rho_star"]), rtol=0, atol=1e-12)


def test_gradient_matrix_columns_in_one_call_equal_two_calls():
    hp = HParams(sigma_w=2.0, sigma_a=2.0, n_tokens=16, attention="exact", softmax_correction=True)
    kern = theory.kernel(hp)
    x = (1.3, 0.4, 1.1, 0.5)
    m = np.asarray(jax.jit(paper.gradient_matrix)(hp, kern, *x))  # jitted: one program each
    backward = jax.jit(block.backward_block)
    cols = [backward(hp, kern, *x, 1.0, 0.0), backward(hp, kern, *x, 0.0, 1.0)]
    np.testing.assert_allclose(
        m, np.array([[float(cols[0][0]), float(cols[1][0])], [float(cols[0][1]), float(cols[1][1])]]), rtol=1e-14
    )


def test_exact_sweep_shares_mesh_values_and_matches_points():
    import phasefield

    ds = phasefield.sweep(sigma_w=[5.0], sigma_a=[0.5, 1.0], alpha=0.5, n_tokens=8, attention="exact")
    for sw in (5.0,):
        for sa in (0.5, 1.0):
            e = paper.exponents(HParams(sigma_w=sw, sigma_a=sa, n_tokens=8, attention="exact"))
            for k in ("lambda_a", "lambda_g_collapse", "lambda_g_inf", "q_star", "rho_star"):
                assert float(ds[k].sel(sigma_w=sw, sigma_a=sa)) == pytest.approx(float(e[k]), rel=0, abs=1e-11)


def test_mesh_interpolant_stands_for_the_map_only_where_exact():
    """Where the Chebyshev tail of the mesh values is <= INTERP_TAIL (sigma_A = 1, n = 32)
    the theory reads S_1, S_rho from their interpolant (no quadrature per point): it equals
    the quadrature at random cosines to 1e-14 (the exponents of both paths agreed to 2e-16 at
    9 points when measured; not repeated here for suite time). A kink of 1e-10 at one mesh node (what a map the mesh does
    not resolve looks like; sigma_A = 3, n = 8 has a tail of 3e-9) turns the flag off."""
    from phasefield.theory.attention import exact_table

    hp = HParams(sigma_w=8.0, sigma_a=1.0, n_tokens=32, alpha_a=0.7, alpha_m=0.4, attention="exact")
    att = exact_table.point_kernel(hp.sigma_a, hp.n_tokens)
    assert att.interp
    kinked = np.asarray(att.s).copy()
    kinked[0, (kinked.shape[-1] - 1) // 2] += 1e-10
    assert not exact_table.interpolant_exact(kinked)
    rho = np.random.default_rng(0).uniform(-1 / 31, 1, 12)
    with jax.enable_x64(True):
        quad = jax.jit(jax.vmap(lambda r: jnp.stack(exact.s_values(1.0, 32, r, att.n_a, att.n_z))))(jnp.asarray(rho))
        fast = jax.jit(jax.vmap(lambda r: jnp.stack(att.s_at(32, r))))(jnp.asarray(rho))
    np.testing.assert_allclose(np.asarray(fast), np.asarray(quad), rtol=0, atol=1e-14)
    # through the theory's attention map: interpolant vs quadrature. p_A = sigma_V^2 (rho +
    # (1 - rho) S_rho) cancels where rho ~ -1/(n - 1) (terms ~0.03, p_A ~0.002): there a
    # relative 1e-14 asks for ~100 ulp of the result, so the bound also allows 1e-15 absolute
    # (~30 ulp of the terms). Measured: 4.2e-17 absolute, 2.2e-14 relative at
    # p_A = 0.0019 with the suite's XLA flags, the other 23 values within 1e-14 relative
    with jax.enable_x64(True):
        f = jax.jit(jax.vmap(lambda r, a: jnp.stack(attention.forward(1.0, 32, 1.0, r, "exact", a)), in_axes=(0, None)))
        fast, quad = f(jnp.asarray(rho), att), f(jnp.asarray(rho), att.replace(interp=False))
    np.testing.assert_allclose(np.asarray(fast), np.asarray(quad), rtol=1e-14, atol=1e-15)
