"""The simulator's per-position measurements of causal stacks
(:func:`phasefield.simulate.causal_positions`) against an independent route (position 0 of a
causal stack is a one-token stack) and against the theory
(:func:`phasefield.layers.causal_rates`), with tolerances from the standard errors."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phasefield import layers, schema
from phasefield.layers import measure as M
from phasefield.layers import spec
from phasefield.simulate import causal_positions, measure, stack
from phasefield.simulate.positions import POSITION_QUANTITIES

N, DEPTH, WIDTH, DRAWS, Q0, RHO0 = 5, 3, 128, 256, 1.0, 0.3
POINT = dict(sigma=1.2, alpha=0.9, heads=2, attention="exact")  # the softmax path on (default)


@pytest.fixture(scope="module")
def block():
    return spec.build("pre-ln", POINT)


@pytest.fixture(scope="module")
def sim(block):
    return causal_positions(block, n_tokens=N, width=WIDTH, depth=DEPTH, draws=DRAWS, seed=3, q0=Q0, rho0=RHO0)


def test_shapes_names_and_standard_errors(sim):
    assert set(POSITION_QUANTITIES) <= set(schema.NAMES)
    assert set(sim) == {k + s for k in POSITION_QUANTITIES for s in ("", "_se")}
    for k in ("q_L_pos", "rho_L_pos"):
        assert sim[k].shape == sim[k + "_se"].shape == (N,)
    for k in ("angle_rate_last", "lambda_g_last"):
        assert np.shape(sim[k]) == np.shape(sim[k + "_se"]) == ()
    assert sim["rho_L_pos"][0] == 0.0 and sim["rho_L_pos_se"][0] == 0.0  # no earlier token
    se = np.concatenate(
        [sim["q_L_pos_se"], sim["rho_L_pos_se"][1:], [sim["angle_rate_last_se"], sim["lambda_g_last_se"]]]
    )
    assert np.all(np.isfinite(se)) and np.all(se > 0)
    with pytest.raises(ValueError):
        causal_positions("pre-ln:sigma=1", n_tokens=N, width=WIDTH, depth=DEPTH, draws=1)


def test_position_zero_is_a_one_token_stack(block, sim):
    """Under the mask token 0 attends only to itself at every block, so its squared norm is
    that of a one-token stack without a mask (the same distribution, independent draws):
    the two means agree within 4 combined standard errors, which the acausal theory's
    position 0 misses."""

    @jax.jit
    def one_token(keys):
        def one(key):
            kx, kw = jax.random.split(key)
            x = M.tokens(kx, 1, WIDTH, Q0, RHO0)
            return jnp.sum(jnp.square(stack.stack_forward(block, kw, x, DEPTH, causal=False)[0])) / WIDTH

        return jax.vmap(one)(keys)

    m, se = measure.mean_se(one_token(measure.draw_keys(11, DRAWS)))
    gap, tol = abs(sim["q_L_pos"][0] - m), 4 * np.hypot(se, sim["q_L_pos_se"][0])
    acausal = float(layers.causal_rates(block, N, DEPTH, Q0, RHO0, causal=False)["q_L_pos"][0])
    print(
        f"q at position 0: causal stack {sim['q_L_pos'][0]:.4f}, one token {m:.4f} +- {se:.4f}; acausal {acausal:.4f}"
    )
    assert np.isfinite(gap) and gap < tol
    assert abs(acausal - m) > tol


def _flat(d):
    return np.concatenate([np.asarray(d[k], np.float64).ravel() for k in POSITION_QUANTITIES])


def test_causal_pre_ln_against_the_theory(block, sim):
    """Every per-position quantity within 4 standard errors plus an O(1/d) allowance
    (|theory|/d for q and rho, 1/d for the two rates) of the theory; the acausal theory and
    the theory without the softmax path (the wrong maps) lie outside."""
    th = {c: layers.causal_rates(block, N, DEPTH, Q0, RHO0, causal=c) for c in (True, False)}
    mean, se = _flat(sim), _flat({k: sim[k + "_se"] for k in POSITION_QUANTITIES})
    want = _flat(th[True])
    allowance = np.concatenate([np.abs(want[: 2 * N]), [1.0, 1.0]]) / WIDTH
    tol = 4 * se + allowance
    keep = np.arange(mean.size) != N  # rho at position 0: 0 in both by definition
    z = (mean - want)[keep] / se[keep]
    print("causal pre-ln z (q_L_pos, rho_L_pos[1:], angle_rate_last, lambda_g_last):", np.round(z, 2))
    assert np.all(np.isfinite(mean)) and np.all(np.isfinite(want))
    assert np.all(np.abs(mean - want) <= tol)

    wrong = _flat(th[False])
    miss = np.abs(mean - wrong) > tol
    print("acausal theory outside the tolerance:", miss.astype(int))
    assert miss[N + 2 :].all()  # rho from position 2 on, the angle and gradient rates
    no_path = spec.build("pre-ln", dict(POINT, softmax_correction=False))
    lg = float(layers.causal_rates(no_path, N, DEPTH, Q0, RHO0, causal=True)["lambda_g_last"])
    print(f"lambda_g_last: measured {mean[-1]:.4f} +- {se[-1]:.4f}, theory {want[-1]:.4f}, without the path {lg:.4f}")
    assert abs(mean[-1] - lg) > tol[-1]


def test_new_numbers_compile_nothing(sim, compiles):
    """The kernels are keyed by structure: another sigma, alpha, q0 and rho0 reuse them."""
    before = compiles.count
    other = spec.build("pre-ln", dict(POINT, sigma=0.7, alpha=0.4))
    out = causal_positions(other, n_tokens=N, width=WIDTH, depth=DEPTH, draws=DRAWS, seed=3, q0=0.8, rho0=0.5)
    assert compiles.count == before
    assert np.isfinite(out["lambda_g_last"]) and out["lambda_g_last"] != sim["lambda_g_last"]


def test_the_command_line_measures_per_position(sim, capsys):
    """``simulate exponents --block NAME:causal=true --theory``: the same draws as the library
    (same seed and sizes) and the causal theory beside them, z per position."""
    from phasefield.cli import main

    spec_text = "pre-ln:causal=true," + ",".join(f"{k}={v}" for k, v in POINT.items())
    size = ["--n-tokens", str(N), "--depth", str(DEPTH), "--width", str(WIDTH), "--seeds", str(DRAWS)]
    argv = ["simulate", "exponents", "--block", spec_text, *size, "--seed", "3", "--q0", str(Q0), "--rho0", str(RHO0)]
    assert main([*argv, "--theory", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for k in POSITION_QUANTITIES:
        np.testing.assert_array_equal(out[k], sim[k])
        np.testing.assert_array_equal(out[k + "_se"], sim[k + "_se"])
    th = layers.causal_rates(spec.build("pre-ln", dict(POINT, causal=True)), N, DEPTH, Q0, RHO0)
    np.testing.assert_array_equal(out["theory"]["q_L_pos"], np.asarray(th["q_L_pos"]))
    assert out["z"]["rho_L_pos"][0] is None  # position 0: no earlier token, no z
    want = (np.asarray(sim["q_L_pos"]) - np.asarray(th["q_L_pos"])) / np.asarray(sim["q_L_pos_se"])
    np.testing.assert_allclose(out["z"]["q_L_pos"], want, rtol=1e-12)
    assert out["z"]["lambda_g_last"] == pytest.approx(
        (float(sim["lambda_g_last"]) - float(th["lambda_g_last"])) / float(sim["lambda_g_last_se"]), rel=1e-12
    )


def test_a_simulated_causal_grid_and_its_comparison(sim, tmp_path, capsys):
    """``simulate sweep --block NAME:causal=true``: a value per position on the grid (the
    point at the fixture's numbers is the fixture, draw for draw), and ``compare`` reads it
    beside the theory's causal sweep, position by position."""
    import xarray as xr

    from phasefield.cli import main

    spec_text = "pre-ln:causal=true," + ",".join(f"{k}={v}" for k, v in POINT.items() if k != "sigma")
    size = ["--n-tokens", str(N), "--depth", str(DEPTH)]
    sim_nc, th_nc = tmp_path / "sim.nc", tmp_path / "theory.nc"
    argv = ["simulate", "sweep", "--block", spec_text, "--axis", "sigma=0.9,1.2", *size, "--width", str(WIDTH)]
    assert (
        main([*argv, "--seeds", str(DRAWS), "--seed", "3", "--q0", str(Q0), "--rho0", str(RHO0), "-o", str(sim_nc)])
        == 0
    )
    ds = xr.open_dataset(sim_nc, engine="h5netcdf").load()
    assert ds["q_L_pos"].dims == ("sigma", "position") and ds.sizes["position"] == N
    for k in POSITION_QUANTITIES:
        np.testing.assert_array_equal(ds[k].sel(sigma=1.2).values, sim[k])
        np.testing.assert_array_equal(ds[k + "_se"].sel(sigma=1.2).values, sim[k + "_se"])
    argv = ["sweep", "--block", spec_text, "--axis", "sigma=0.9,1.2", *size, "--q0", str(Q0), "--rho0", str(RHO0)]
    assert main([*argv, "--out", str(th_nc)]) == 0
    capsys.readouterr()
    assert main(["compare", str(th_nc), str(sim_nc), "--json"]) == 0
    rows = {(r["quantity"], r["phase"]): r for r in json.loads(capsys.readouterr().out)}
    assert rows[("q_L_pos", "all")]["points"] == 2 * N and rows[("lambda_g_last", "all")]["points"] == 2
    assert np.isfinite(rows[("rho_L_pos", "all")]["max_z"])
