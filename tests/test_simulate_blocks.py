"""``simulate`` for every block (phasefield.simulate.measure.rates, ``simulate exponents|sweep
--block``): the theory's quantities under its names, measured on the block's own network.

All tests share one shape (n = 8 tokens, L = 3 blocks, 2 heads, width 256, 16 draws, seed 0)
so one compilation per block structure serves the library, the CLI and the sweep. The
agreement tolerance is 4 standard errors plus the O(1/d) finite-width bias bound 2/d of
tests/test_layers.py::test_preset_theory_against_its_own_network (scripts/
validate_simulate_blocks.py checks 3 se at width 4096, without the bias term).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from phasefield.cli import main
from phasefield.simulate import compare, measure
from phasefield.simulate import sweep as simsweep

N, L, D, DRAWS = 8, 3, 256, 16
SHAPE = dict(n_tokens=N, depth=L, width=D, draws=DRAWS, seed=0)
CLI_SHAPE = ["--n-tokens", str(N), "--depth", str(L), "--width", str(D), "--draws", str(DRAWS)]
PRE = "pre-ln:sigma=1,alpha=0.5,heads=2"
POST = "post-ln:sigma=1,alpha=0.5,heads=2"


@pytest.fixture(scope="module")
def measured():
    """(simulation, theory) of the two test blocks, once per module."""
    return {s: (measure.rates(s, **SHAPE), compare.theory(s, n_tokens=N, depth=L)) for s in (PRE, POST)}


@pytest.mark.parametrize("spec", [PRE, POST])
def test_block_agrees_with_theory(measured, spec):
    """Every quantity the theory gives (post-LN: with lambda_a, its fixed point q* = 1;
    pre-LN: none, NaN on both sides) within 4 se + 2/d; the se floored as in z_scores."""
    sim, th = measured[spec]
    assert np.isfinite(th["q_star"]) == spec.startswith("post-ln")
    for q in measure.QUANTITIES:
        if not np.isfinite(th[q]):
            assert q == "lambda_a" and np.isnan(sim[q]), (spec, q)
            continue
        se = max(sim[q + "_se"], compare.RESOLUTION * max(1.0, abs(th[q])))
        assert sim[q + "_se"] > 0, (spec, q)
        assert abs(sim[q] - th[q]) <= 4 * se + 2.0 / D, (spec, q, sim[q], sim[q + "_se"], th[q])
    z = compare.z_scores(sim, th)
    print(spec, {k: round(v, 2) for k, v in z.items()})


def test_library_entry_dispatches(measured):
    """phasefield.simulate.rates: a spec -> the block's measurement (the same numbers as
    simulate.measure.rates for the same seed)."""
    from phasefield import simulate

    res = simulate.rates(PRE, **SHAPE)
    sim, _ = measured[PRE]
    for q in measure.QUANTITIES:
        np.testing.assert_equal(res[q], sim[q])


def test_cli_exponents_block_json_and_text(measured, capsys):
    """``simulate exponents --block`` prints the library's numbers (one compilation whether
    JAX's x64 switch is on, as in the CLI, or off), the theory and z with --theory."""
    sim, th = measured[POST]
    assert main(["simulate", "exponents", "--block", POST, *CLI_SHAPE, "--theory", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for q in measure.QUANTITIES:
        assert out[q] == pytest.approx(sim[q], rel=1e-12, abs=1e-15) and q + "_se" in out
        assert out["theory"][q] == pytest.approx(th[q], rel=1e-12)
    assert set(out["z"]) == set(measure.QUANTITIES) and out["block"] == "post-ln" and out["spec"]["heads"] == 2
    assert len(out["rho"]) == L + 1
    assert main(["simulate", "exponents", "--block", PRE, *CLI_SHAPE]) == 0
    text = capsys.readouterr().out
    assert "lambda_g_input" in text and "no finite collapsed fixed point" in text


def test_cli_sweep_block_and_compare(measured, tmp_path, capsys):
    """``simulate sweep --block --axis`` writes the block sweep's variable names plus _se;
    its point equals the single-point measurement; ``compare`` against ``block sweep``
    matches the variables by name (lambda_g -> lambda_g_input ...) and reports z-scores."""
    import xarray as xr

    sim_nc, th_nc = tmp_path / "sim.nc", tmp_path / "th.nc"
    assert (
        main(
            [
                "simulate",
                "sweep",
                "--block",
                "pre-ln:alpha=0.5,heads=2",
                "--axis",
                "sigma=0.5,1",
                *CLI_SHAPE,
                "-o",
                str(sim_nc),
            ]
        )
        == 0
    )
    assert not (tmp_path / "sim.nc.parts").exists()
    ds = xr.open_dataset(sim_nc, engine="h5netcdf").load()
    assert ds["angle_rate"].dims == ("sigma",) and ds.attrs["block"] == "pre-ln"
    sim, _ = measured[PRE]
    for q in measure.QUANTITIES:
        assert q + "_se" in ds
        np.testing.assert_allclose(float(ds[q].sel(sigma=1.0)), sim[q], rtol=1e-12, atol=0)
    assert (
        main(
            [
                "block",
                "sweep",
                "--block",
                "pre-ln:alpha=0.5,heads=2",
                "--axis",
                "sigma=0.5,1",
                "--n-tokens",
                str(N),
                "--depth",
                str(L),
                "--out",
                str(th_nc),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["compare", str(th_nc), str(sim_nc), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    got = {r["quantity"] for r in rows}
    assert got == {"angle_rate", "lambda_g_input", "lambda_g_collapse", "rho_L", "q_L"}  # no lambda_a: NaN
    for r in rows:
        if r["phase"] == "all":
            assert r["points"] == 2 and np.isfinite(r["max_z"]) and np.isfinite(r["mean_z"]), r
    assert main(["compare", str(th_nc), str(sim_nc)]) == 0
    assert "mean z" in capsys.readouterr().out


def test_sweep_resumes_from_its_parts(tmp_path, monkeypatch):
    """A rerun reads the finished points from the parts folder instead of measuring them."""
    parts = tmp_path / "parts"
    axes = {"sigma": np.array([1.0])}
    fixed = {"alpha": 0.5, "heads": 2}
    opts = dict(n_tokens=N, depth=L, width=D, draws=DRAWS, seed=0)
    first = simsweep.rates_grid("pre-ln", axes, fixed, parts_dir=str(parts), **opts)

    def fail(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(measure, "rates", fail)
    again = simsweep.rates_grid("pre-ln", axes, fixed, parts_dir=str(parts), **opts)
    for q in measure.QUANTITIES:
        np.testing.assert_array_equal(first[q].values, again[q].values)


def test_lazy_and_dense_weights_agree(measured):
    """The block's lazily sampled network (the default) and its dense reference give
    statistically equal quantities: |difference| <= 4 combined se (post-LN: LayerNorm,
    multi-head attention with W_O, the GELU MLP; the paper block's own check is
    tests/test_lazy.py)."""
    lazy, _ = measured[POST]
    dense = measure.rates(POST, weights="dense", **SHAPE)
    for q in measure.QUANTITIES:
        se = max(np.hypot(lazy[q + "_se"], dense[q + "_se"]), compare.RESOLUTION)
        assert abs(lazy[q] - dense[q]) <= 4 * se, (q, lazy[q], dense[q], se)


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "exponents", "--block", PRE, "--sigma-w", "2"],
        ["simulate", "exponents", "--block", "nope"],
        ["simulate", "exponents", "--block", "pre-ln:sigma=-1"],
        ["simulate", "exponents", "--block", PRE, "--rho0", "2"],
        ["simulate", "exponents", "--block", PRE, "--draws", "1"],
        ["simulate", "exponents", "--q0", "2"],
        ["simulate", "exponents", "--theory"],
        ["simulate", "sweep", "--block", PRE, "-o", "x.nc"],
        ["simulate", "sweep", "--block", PRE, "--axis", "heads=1,2", "-o", "x.nc"],
        ["simulate", "sweep", "--block", PRE, "--axis", "sigma=1:2", "-o", "x.nc"],
        ["simulate", "sweep", "--block", PRE, "--axis", "sigma=1,2", "--chunk", "2", "-o", "x.nc"],
        ["simulate", "sweep", "--block", PRE, "--axis", "alpha=1,2", "-o", "x.nc"],
        ["simulate", "sweep", "--block", PRE, "--axis", "depth=1,2", "--n-tokens", "2,3", "-o", "x.nc"],
        ["simulate", "sweep", "--axis", "sigma=1,2", "-o", "x.nc"],
    ],
)
def test_bad_block_input_one_line_exit_2(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("phasefield: error:") and "\n" not in err, err
    assert not (tmp_path / "x.nc").exists() and not (tmp_path / "x.nc.parts").exists()
