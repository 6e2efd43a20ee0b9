"""Attention's mean-field maps at any input norm (phasefield/layers/attention.py): the tables
of the logit scale sigma_A serve q = 1; elsewhere a point's map integrates at sigma_A q
within its grid's reach (NaN beyond), a sweep's unit-norm tables give NaN, and an attention
reading unnormalized tokens (``any_norm``, DyT's) reads no tables. Checked against the
grid sizes, the finite-width simulator (post-LN from q0 = 1.2) and point-by-point values
(sweeps)."""

import jax
import numpy as np
import pytest

from phasefield import layers
from phasefield.layers import Context, Kernel, spec
from phasefield.layers import sweep as layers_sweep
from phasefield.layers.attention import Attention
from phasefield.simulate import compare, measure
from phasefield.theory.attention import exact, exact_table

pytestmark = pytest.mark.usefixtures("float64")


@pytest.mark.parametrize("n", [2, 3, 5, 8, 64, 4096])
def test_reach_reads_the_grid_sizes_backwards(n):
    """The scale the sizes of sigma_A resolve is at least sigma_A, and not much more once
    the sizes' floors (49 z-nodes, 96 a-nodes) no longer hold."""
    for sigma in (0.1, 0.25, 0.7, 1.3, 2.0, 3.3) + ((4.5, 6.0) if n >= 6 else ()):
        r = float(exact.reach(*exact.sizes(sigma, n), n))
        assert r >= sigma * (1.0 - 1e-12), (sigma, n, r)
        if sigma >= 2.0:
            assert r <= 1.1 * sigma, (sigma, n, r)


def _unit_tables(sigma_a, n):
    s, t, interp, interp_t = exact_table.scale_tables(np.asarray([sigma_a]), float(n))
    assert interp and interp_t
    return s[0], t[0]


def test_a_sweeps_tables_give_nan_off_unit_norm_and_a_points_integrate():
    """The same attention with a sweep's (unit-norm) tables: its value at q = 1 and NaN at
    q = 1.2; with a point's tables (prepare): the value at q = 1.2 equals the map integrated
    at sigma_A q (no tables), and NaN past the grid's reach."""
    n, ctx = 8, Context(8.0)
    lay = Attention(sigma_a=1.1, sigma_v=0.9, map="exact", softmax_correction=True)
    swept = lay.prepare_for(ctx, 1.1, 0.0).with_logit_tables(*_unit_tables(1.1, n), True, True)
    point = lay.prepare(ctx)
    plain = lay.prepare(Context(8.0), sigma_max=4.5)  # sizes only: integrates at sigma_A q
    g = layers.Grad(0.7, 0.2)
    # one compiled forward and backward per layer, run at every q (a fresh jax.jit per call
    # would trace and compile the same program again)
    fwd = [jax.jit(x.forward) for x in (swept, point, plain)]
    bwd = [jax.jit(x.backward) for x in (swept, point, plain)]
    for q in (1.0, 1.2):
        k = Kernel(q, 0.4 * q)
        f_sw, f_pt, f_in = (f(k, ctx) for f in fwd)
        b_sw, b_pt, b_in = (b(k, g, ctx) for b in bwd)
        for got, ref in ((f_pt, f_in), (b_pt, b_in)):
            np.testing.assert_allclose(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(ref), rtol=1e-11)
        if q == 1.0:
            np.testing.assert_allclose([f_sw.q, f_sw.p, b_sw.a, b_sw.b], [f_pt.q, f_pt.p, b_pt.a, b_pt.b], rtol=1e-11)
        else:
            assert np.all(np.isnan([f_sw.q, f_sw.p, b_sw.a, b_sw.b]))
            assert np.all(np.isfinite([f_pt.q, f_pt.p, b_pt.a, b_pt.b]))
    # sigma_A q = 1.1 * 4.5 beyond the point cap's grid (4.5): NaN, never a silent number
    k = Kernel(4.5, 0.4 * 4.5)
    assert np.all(np.isnan(jax.tree_util.tree_leaves(fwd[1](k, ctx))))
    assert np.all(np.isnan(jax.tree_util.tree_leaves(bwd[1](k, g, ctx))))


POST = dict(sigma=0.55, alpha=1.0, heads=2)


def test_post_ln_from_a_non_unit_input_is_finite_and_new_sigmas_compile_nothing():
    """post-LN's first attention reads the raw input (norm q0): its exact map answers at
    sigma_A q0 (finite), and a new sigma runs the first point's program."""
    events = []

    def listen(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            events.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        counts = []
        for sigma in (0.55, 0.7, 0.9):
            before = len(events)
            q, p = layers.trajectory(spec.build("post-ln", dict(POST, sigma=sigma)), 1.2, 0.5, n_tokens=8, depth=3)
            counts.append(len(events) - before)
            assert np.all(np.isfinite(np.asarray(p))) and float(q[0]) == 1.2 and float(q[1]) == 1.0
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert counts[1:] == [0, 0], counts


@pytest.mark.slow
def test_post_ln_from_q0_above_one_against_the_network():
    """The theory from q0 = 1.2 within 3 se of the block simulator (d 512, 32 draws)."""
    text = "post-ln:sigma=0.55,alpha=1,heads=2"
    sim = measure.rates(text, n_tokens=8, depth=3, width=512, draws=32, seed=0, q0=1.2)
    th = compare.theory(text, n_tokens=8, depth=3, q0=1.2)
    z = compare.z_scores(sim, th)
    for q in ("q_L", "rho_L", "angle_rate", "lambda_g_input", "lambda_g_collapse"):
        assert np.isfinite(th[q]) and abs(z[q]) <= 3.0, (q, th[q], sim[q], sim[q + "_se"], z[q])


# DyT's grid is tests/test_sweep_generic.py's (sigma, alpha at 0.35 and 0.7 of [0, 2], 4
# heads, 8 tokens, depth 3): one compiled sweep program for both. post-LN's grid is sized for
# its largest sigma_A q0, which the two sigmas set; alpha changes no size and no path of the
# sweep (a number of the points), so one value of it
@pytest.mark.parametrize(
    "name,fixed,axes,q0",
    [
        ("dyt", dict(heads=4), dict(sigma=[0.7, 1.4], alpha=[0.7, 1.4]), 1.0),
        ("post-ln", dict(heads=2), dict(sigma=[0.55, 0.8], alpha=[1.0]), 1.2),
    ],
    ids=["dyt-softmax-path", "post-ln-q0"],
)
def test_sweep_off_unit_norm_equals_the_points(name, fixed, axes, q0):
    """A sweep whose attention reads tokens of norm != 1 (DyT with the softmax path; post-LN
    from q0 = 1.2, its grids sized for sigma_A q0) equals ``layers.finite_depth`` point by point
    (the sizes of this module's other points: one program per preset; DyT's finite-depth
    numbers from ``layers.rates``, which computes them by ``finite_depth`` in the program
    tests/test_dyt.py and tests/test_sweep_generic.py compile at these sizes)."""
    n_tokens, depth = 8, 3
    ds = layers_sweep.sweep_grid(name, axes, fixed=fixed, n_tokens=n_tokens, depth=depth, q0=q0)
    point = layers.rates if name == "dyt" else layers.finite_depth  # post-LN: the network test's
    (ka, va), (kb, vb) = axes.items()
    for a in va:
        for b in vb:
            block = spec.build(name, dict(fixed, **{ka: a, kb: b}))
            fd = point(block, q0=q0, n_tokens=n_tokens, depth=depth)
            got = ds.sel({ka: a, kb: b})
            for key in ("lambda_g_input", "lambda_g_collapse", "angle_rate", "rho_L", "q_L"):
                ref = float(fd[key])
                assert np.isfinite(ref) and float(got[key]) == pytest.approx(ref, rel=1e-9, abs=1e-12), (a, b, key)


def test_an_any_norm_point_reads_the_scale_table_as_it_would_integrate(monkeypatch):
    """DyT's attention (tokens of norm q < 1) reads the softmax path's values at sigma_A q from
    the interpolants in the scale (:mod:`phasefield.theory.attention.scale_table`): the
    table at random scales against the integrated values (1e-12), and a DyT point's finite-depth rates
    (``layers.rates``: the program of the DyT points of test_sweep_off_unit_norm_equals_the_points)
    against the same point with no table (``layers.finite_depth``: it integrates at every layer)."""
    from phasefield.theory.attention import scale_table

    n = 8.0
    table = scale_table.for_point(1.44, n)
    assert table is not None and table.interp and table.interp_t
    n_a, n_z = exact.sizes(sigma_max=exact_table.POINT_CAP, n_max=n)
    rng = np.random.default_rng(3)
    read = jax.jit(lambda sa: (table.holds(sa), *table.at(sa)))  # one program, not op by op
    for sa in [*rng.uniform(0.05, 1.44, 3), 1.0]:
        holds, s, t = (np.asarray(v) for v in read(np.float64(sa)))
        assert bool(holds)
        s_ref, t_ref = exact_table._st_values(float(sa), n, n_a, n_z, exact_table.MESH_FULL, adaptive=False)
        np.testing.assert_allclose(s, s_ref, rtol=0, atol=1e-12)
        np.testing.assert_allclose(t, t_ref, rtol=0, atol=1e-12)
    assert not bool(read(np.float64(2.5))[0])  # beyond the ranges built for sigma_A = 1.44

    block = spec.build("dyt", dict(sigma=1.2, alpha=0.6, a=0.8, heads=4))
    got = layers.rates(block, n_tokens=8, depth=3)
    monkeypatch.setattr(scale_table, "for_point", lambda *a: None)
    ref = layers.finite_depth(block, n_tokens=8, depth=3)
    for key in ("lambda_g_input", "lambda_g_collapse", "angle_rate", "q_L", "rho_L"):
        assert np.isfinite(float(ref[key])), key
        np.testing.assert_allclose(float(got[key]), float(ref[key]), rtol=1e-11, atol=1e-13, err_msg=key)
