"""The block sweeps' tables built once per distinct scale, outside the trace
(:func:`phasefield.layers.sweep.plan`), and read per point by an index
(:func:`phasefield.layers.sweep.evaluate_chunk`): the same numbers as every point building its
own tables and integrating the exact map (``mesh=False``, the reference path), to 1e-12."""

import numpy as np
import pytest

from phasefield.layers import spec, sweep


def _compare(name, fixed, axes, n_tokens=8, depth=2, seed=0):
    fixed = spec.check(name, fixed)
    fast = sweep.plan(name, fixed, axes, n_tokens, [depth])
    slow = sweep.plan(name, fixed, axes, n_tokens, [depth], mesh=False)
    keys = list(axes)
    flat = [m.ravel() for m in np.meshgrid(*[np.asarray(axes[k], float) for k in keys], indexing="ij")]
    order = np.random.default_rng(seed).permutation(len(flat[0]))  # random points, any order
    values = {k: f[order] for k, f in zip(keys, flat)}
    a = sweep.evaluate_chunk(fast, values, depth)
    b = sweep.evaluate_chunk(slow, values, depth)
    assert set(a) == set(sweep.OUTPUTS)
    for v in a:
        assert np.array_equal(np.isnan(a[v]), np.isnan(b[v])), v
        ok = np.isfinite(b[v])
        np.testing.assert_allclose(a[v][ok], b[v][ok], rtol=1e-12, atol=1e-14, err_msg=v)
    return fast


@pytest.mark.parametrize(
    "name,attention", [("post-ln", "paper"), pytest.param("rms-swiglu", "exact", marks=pytest.mark.slow)]
)
def test_table_gathered_points_equal_the_per_point_path(name, attention):
    """post-LN (paper map: only the softmax term's tables; GELU MLP kernels per sigma),
    RMS-SwiGLU (exact map and softmax term from the mesh tables, SiLU gate's Chebyshev
    tables once per sigma). pre-LN with the exact map: test_blocks_cli's
    test_block_sweep_from_mesh_values_equals_the_integrated_maps (up to logit scale 4)."""
    axes = {"sigma": np.array([0.8, 0.35, 0.6]), "alpha": np.array([0.3, 0.9])}
    p = _compare(name, {"heads": 2, "attention": attention}, axes)
    assert p.att is not None and len(p.att[0]) == 3  # one mesh table per logit scale
    assert len(p.mlp) == 1 and len(p.mlp[0][1]) == 3  # one MLP/GLU kernel per sigma


def test_a_value_off_the_plan_is_refused():
    p = sweep.plan("pre-ln", {"attention": "exact"}, {"sigma": np.array([0.5, 0.6])}, 8, [2])
    with pytest.raises(ValueError, match="not on the plan's grid"):
        sweep.evaluate_chunk(p, {"sigma": np.array([0.55])}, 2)


def test_scale_tables_equal_one_grid_for_all():
    """Per-scale grid sizes and the shorter first mesh (resampled onto the full one) give the
    tables of the largest scale's grid on the full mesh: S to 1e-12 relative, T (a sum of
    four moments that cancel, n a2 - 2n a3 + n a4 + n(n-1) a2a2: its values on two valid
    grids differ by ~1e-13) to 1e-12."""
    import jax
    import jax.numpy as jnp

    from phasefield.theory.attention import exact, exact_table

    sa, n = np.array([0.2, 1.5]), 8.0
    assert list(exact_table.bucket_caps(sa)) == [0.25, 1.5]
    assert [exact_table.first_mesh(c) for c in (0.25, 1.5)] == [33, 49]
    s, t, interp, interp_t = exact_table.scale_tables(sa, n)
    assert interp and interp_t and s.shape == t.shape == (2, 2, exact_table.MESH_FULL + 1)
    n_a, n_z = exact.sizes(sigma_max=1.5, n_max=n)
    with jax.enable_x64(True):
        s0, t0 = exact_table.tables_fn(n_a, n_z, exact_table.MESH_FULL)(jnp.asarray(sa), jnp.full(2, n))
    for i in range(2):
        np.testing.assert_allclose(s[i], np.asarray(s0)[i], rtol=1e-12, atol=0)
        np.testing.assert_allclose(t[i], np.asarray(t0)[i], rtol=0, atol=1e-12)


@pytest.mark.usefixtures("optimized_tables")
def test_many_scales_read_the_interpolant_in_the_scale(monkeypatch):
    """More scales than nodes: the tables at Chebyshev nodes of the scale range, their
    interpolant read where the tail is below SCALE_TAIL, the range halved where it is not,
    a range with no more scales than nodes integrated scale by scale: equal to every scale
    integrated on its own (the tolerances of test_scale_tables_equal_one_grid_for_all).
    Small node counts force every path: (9, 17) fails on [0.05, 1.5] and on its upper half,
    passes on the quarters, and integrates the lone scale of the lower half."""
    from phasefield.theory.attention import exact, exact_table
    from phasefield.theory.precision import float64

    sa, n = np.append(0.05, np.linspace(0.8, 1.5, 40)), 8.0
    n_a, n_z = exact.sizes(sigma_max=1.5, n_max=n)
    s0, t0 = float64(exact_table._direct_tables)(sa, n, n_a, n_z, 1.5)  # every scale integrated
    assert np.isfinite(s0).all() and np.isfinite(t0).all()  # so a NaN in s or t fails the comparisons
    # node tables that are not finite: no interpolant, every scale taken on its own (the
    # process's tables of s0, first: a scale read from an interpolant would not be bitwise)
    targets, st_values = set(map(float, sa)), exact_table._st_values

    def nan_at_nodes(sigma_a, *args):
        s_, t_ = st_values(sigma_a, *args)
        return (s_, t_) if sigma_a in targets else (s_ * np.nan, t_)

    with monkeypatch.context() as mp:
        mp.setattr(exact_table, "_st_values", nan_at_nodes)
        s, t, _, _ = exact_table.scale_tables(sa, n, nodes=(9, 17))
    np.testing.assert_array_equal(s, s0)
    np.testing.assert_array_equal(t, t0)
    exact_table._st_values.cache_clear()  # to count the integrations of (17, 33) below
    for nodes in [(17, 33), (9, 17)]:
        # (9, 17) then reads its 9 and 17 nodes on [0.05, 1.5] (nested in the 33, bitwise)
        # and the lone scale from the process's tables: the same numbers, not integrated again
        s, t, interp, interp_t = exact_table.scale_tables(sa, n, nodes=nodes)
        assert interp and interp_t
        if nodes == (17, 33):
            assert exact_table._st_values.cache_info().misses == 33 < len(sa)  # the 33 nodes only
        else:
            np.testing.assert_array_equal(s[0], s0[0])  # integrated: bitwise
        assert not np.array_equal(s[1:], s0[1:])  # read from an interpolant
        np.testing.assert_allclose(s, s0, rtol=1e-12, atol=0)
        np.testing.assert_allclose(t, t0, rtol=0, atol=1e-12)
