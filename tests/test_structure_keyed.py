"""Compiled programs are keyed by a block's structure, never by its numbers: a new point of a
block compiles nothing once one point of it ran, and the tables that make this so (MLP
kernels padded to one size, attention tables of one grid per cap, read from the
interpolant in the logit scale) give the numbers of the routes they replace."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phasefield import layers
from phasefield.layers import spec
from phasefield.theory import mlp as mlp_maps
from phasefield.theory.attention import exact_table


@pytest.mark.parametrize(
    "name, points",
    [
        (
            "paper",
            [
                dict(sigma_w=0.7, alpha_a=0.3, alpha_m=0.6),
                dict(sigma_w=1.3, sigma_a=1.7, alpha_a=0.8),
                dict(sigma_w=2.6, alpha_a=0.1, alpha_m=0.2),
            ],
        ),
        (
            "rms-swiglu",
            [
                dict(sigma=0.4, alpha=0.2, attention="paper", softmax_correction=False),
                dict(sigma=1.1, alpha=0.7, attention="paper", softmax_correction=False),
                dict(sigma=1.9, alpha=0.05, attention="paper", softmax_correction=False),
            ],
        ),
        ("pre-ln", [dict(sigma=0.5, alpha=0.3), dict(sigma=0.9, alpha=0.9), dict(sigma=1.4, alpha=0.2)]),
    ],
)
def test_a_new_point_compiles_nothing(name, points, compiles):
    first, *rest = points
    layers.rates(spec.build(name, first), n_tokens=16, depth=16)
    before = compiles.count
    for kw in rest:
        r = layers.rates(spec.build(name, kw), n_tokens=16, depth=16, q0=1.0, rho0=0.3)
        assert np.isfinite(float(r["angle_rate"]))
    assert compiles.count == before


def test_an_attention_behind_a_norm_compiles_no_branch_for_another_norm():
    """Pre-LN's attention reads a normalization's output (``unit_input``): its point program
    holds no ``cond`` for a token norm other than 1, and gives the numbers of the same block
    whose attention keeps that branch, bit for bit (the depth and n of the test above)."""
    from phasefield.layers.attention import Attention

    block = spec.build("pre-ln", dict(sigma=0.9, alpha=0.9))
    atts = [
        x
        for x in jax.tree_util.tree_leaves(block, is_leaf=lambda x: isinstance(x, Attention))
        if isinstance(x, Attention)
    ]
    assert atts and all(a.unit_input for a in atts)
    keep = jax.tree_util.tree_map(
        lambda x: x.replace(unit_input=False) if isinstance(x, Attention) else x,
        block,
        is_leaf=lambda x: isinstance(x, Attention),
    )
    kw = dict(n_tokens=16, depth=16, q0=1.3, rho0=0.3)
    got, ref = layers.rates(block, **kw), layers.rates(keep, **kw)
    for key in ("angle_rate", "lambda_g_input", "lambda_g_collapse", "q_L", "rho_L"):
        assert np.isfinite(float(ref[key])) and float(got[key]) == float(ref[key]), key


def test_a_new_logit_scale_of_the_paper_engine_with_the_exact_map_compiles_nothing(compiles):
    """The paper block's own engine with ``attention="exact"``: its attention tables are sized
    by the logit scale's cap (not its value), so a new sigma_A compiles nothing."""
    from phasefield import HParams
    from phasefield.layers import paper

    kw = dict(sigma_w=2.2, alpha_a=0.45, alpha_m=0.6, n_tokens=16, depth=16, attention="exact")
    paper.exponents(HParams(sigma_a=1.5, **kw))
    before = compiles.count
    for sa in (1.1, 1.9):
        assert 0.0 < float(paper.exponents(HParams(sigma_a=sa, **kw))["rho_star"]) < 1.0
    assert compiles.count == before


@pytest.mark.parametrize("act", ["tanh", "silu"])
def test_padded_kernel_is_the_same_function(act):
    """A kernel sized by its size class and padded with zero Chebyshev coefficients gives
    the series of its own class's sizes bit for bit."""
    with jax.enable_x64(True):
        kern = mlp_maps.kernel(1.7, act, 2)
        assert kern.c_pp.shape[-1] == mlp_maps.PAD_CHEB
        n_grid, n_cheb = mlp_maps.table_sizes(mlp_maps.size_class(1.7 * 1.0))
        own = mlp_maps.kernel(1.7, act, 2, n_grid=n_grid, n_cheb=n_cheb)
        rho = jnp.linspace(-1.0, 1.0, 41)
        assert own.c_pp.shape[-1] < kern.c_pp.shape[-1]
        np.testing.assert_array_equal(mlp_maps.p_m(kern, rho), mlp_maps.p_m(own, rho))
        np.testing.assert_array_equal(mlp_maps.d_m(kern, rho), mlp_maps.d_m(own, rho))


def test_scale_interpolant_equals_the_integrated_tables():
    """A point reads (S, T) from the interpolant in the logit scale: equal to the tables
    integrated at that scale (S to 1e-12 relative, T to 1e-12)."""
    n = 8.0
    n_a, n_z = exact_table.exact.sizes(sigma_max=exact_table.POINT_CAP, n_max=n)
    with jax.enable_x64(True):  # as point_kernel (float64) calls them
        for sa in (0.37, 2.9):
            s, t = exact_table._point_values(sa, n, n_a, n_z, exact_table.POINT_CAP)
            s0, t0 = exact_table._direct_tables(np.asarray([sa]), n, n_a, n_z, exact_table.POINT_CAP)
            assert s.dtype == s0.dtype == np.float64
            np.testing.assert_allclose(s, s0[0], rtol=1e-12, atol=0)
            np.testing.assert_allclose(t, t0[0], rtol=0, atol=1e-12)
