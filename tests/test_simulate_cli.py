"""CLI of the simulator: ``phasefield simulate exponents|sweep`` and ``phasefield compare``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

from phasefield.cli import main

SMALL = ["--width", "32", "--seeds", "2", "--n-tokens", "4", "--depth", "2"]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """``simulate sweep`` over 2 x 2 points at SMALL's shape, chunks of 3 (once per module)."""
    out = tmp_path_factory.mktemp("sweep") / "sim.nc"
    argv = ["simulate", "sweep", "--sigma-w", "1,2.5", "--alpha", ".3:.7:2", *SMALL, "--chunk", "3", "-o", str(out)]
    assert main(argv) == 0
    assert not out.with_name("sim.nc.parts").exists()
    return out


def test_exponents_json(capsys):
    assert (
        main(
            [
                "simulate",
                "exponents",
                "--sigma-w",
                "2",
                "--sigma-a",
                "1",
                "--alpha-a",
                ".5",
                "--alpha-m",
                ".5",
                *SMALL,
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    for k in ("lambda_a", "lambda_a_se", "lambda_g_collapse", "lambda_g_collapse_se"):
        assert np.isfinite(out[k])
    assert out["lambda_a_se"] > 0 and out["lambda_g_collapse_se"] > 0


def test_exponents_causal_text(capsys):
    assert main(["simulate", "exponents", "--causal", *SMALL]) == 0
    assert "lambda_g" in capsys.readouterr().out


def test_bad_input_one_line_exit_2(capsys):
    for argv in (
        ["simulate", "exponents", "--sigma-w", "-1", *SMALL],
        ["simulate", "exponents", "--seeds", "1"],
        ["simulate", "exponents", "--activation", "nope", *SMALL],
        ["simulate", "exponents", "--residual", "identity", *SMALL],
        ["simulate", "sweep", "--sigma-w", "1:2", "-o", "x.nc"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("phasefield: error:") and "\n" not in err


def test_sweep_and_compare(swept, tmp_path, capsys):
    out = swept
    ds = xr.open_dataset(out, engine="h5netcdf").load()
    assert ds.lambda_a.dims == ("sigma_w", "alpha")
    for v in ("lambda_a", "lambda_a_se", "lambda_g_collapse", "lambda_g_collapse_se"):
        assert np.all(np.isfinite(ds[v].values))
    capsys.readouterr()
    # a "theory" grid: same coordinates, a shifted lambda_a -> the table reports the shift
    th = ds[["lambda_a", "lambda_g_collapse"]].copy()
    th["lambda_a"] = th["lambda_a"] + 0.25
    th.to_netcdf(tmp_path / "th.nc", engine="h5netcdf")
    assert main(["compare", str(tmp_path / "th.nc"), str(out), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    row = next(r for r in rows if r["quantity"] == "lambda_a" and r["phase"] == "all")
    assert row["points"] == 4
    assert abs(row["median"] - 0.25) < 1e-9 and abs(row["max"] - 0.25) < 1e-9
    assert main(["compare", str(tmp_path / "th.nc"), str(out)]) == 0
    assert "lambda_g" in capsys.readouterr().out
    assert main(["compare", str(tmp_path / "missing.nc"), str(out)]) == 2


def test_sweep_matches_single_point(swept, capsys):
    """A sweep point (vmapped over points, shared draws) equals the single-point measurement
    (the same shape as the sweep and test_exponents_json: their compiled programs)."""
    argv = ["simulate", "exponents", "--sigma-w", "2.5", "--alpha-a", ".7", "--alpha-m", ".7", *SMALL, "--json"]
    capsys.readouterr()
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    got = xr.open_dataset(swept, engine="h5netcdf").load().sel(sigma_w=2.5, alpha=0.7)
    for k in ("lambda_a", "lambda_a_se", "lambda_g_collapse", "lambda_g_collapse_se"):
        np.testing.assert_allclose(float(got[k]), res[k], rtol=1e-4, atol=1e-6)
