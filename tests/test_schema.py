"""One name per quantity: every block's theory, the paper block's, and the deprecated
aliases that say which quantity they are."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import xarray as xr

from phasefield import HParams, layers, schema
from phasefield.layers import paper, spec


def test_block_and_paper_results_share_the_names():
    block = layers.rates(spec.build("post-ln", dict(sigma=0.8, alpha=0.4, attention="paper")), n_tokens=8, depth=4)
    for k in (
        "lambda_a",
        "angle_rate",
        "lambda_g_input",
        "lambda_g_collapse",
        "lambda_g_inf",
        "q_L",
        "rho_L",
        "q_star",
        "rho_star",
    ):
        assert k in block, k
    ex = paper.exponents(HParams(sigma_w=1.5, n_tokens=8, depth=4))
    assert {"lambda_a", "lambda_g_collapse", "lambda_g_inf", "q_star", "rho_star"} <= set(ex)
    assert "lambda_g" not in ex and "lambda_g_collapsed" not in block
    assert float(block["q_L"]) == float(block["q"][-1]) and float(block["rho_L"]) == float(block["rho"][-1])


@pytest.mark.parametrize(
    "aliases, old, new",
    [
        (schema.COLLAPSE, "lambda_g", "lambda_g_collapse"),
        (schema.INPUT, "lambda_g", "lambda_g_input"),
        (schema.INPUT, "lambda_g_collapsed", "lambda_g_collapse"),
    ],
)
def test_a_deprecated_name_reads_its_quantity_and_says_which(aliases, old, new):
    r = schema.results({new: 1.25, "lambda_a": -0.5}, aliases)
    with pytest.warns(schema.PhasefieldDeprecationWarning, match=f"'{old}' is the deprecated name of '{new}'"):
        assert r[old] == 1.25
    with pytest.warns(schema.PhasefieldDeprecationWarning):
        assert r.get(old) == 1.25
    assert old not in r and list(r) == [new, "lambda_a"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert r[new] == 1.25 and r.get("nothing", 3) == 3
    with pytest.raises(KeyError):
        r["nothing"]


def test_alias_variables_and_canonical_round_trip():
    ds = xr.Dataset({"lambda_g_collapse": ("x", np.arange(3.0)), "lambda_g_collapse_se": ("x", np.ones(3))})
    ds = schema.alias_variables(ds, schema.SIMULATION)
    assert "deprecated" in ds["lambda_g"].attrs and np.array_equal(ds["lambda_g"], ds["lambda_g_collapse"])
    old = xr.Dataset({"lambda_g": ("x", np.arange(3.0)), "lambda_g_se": ("x", np.ones(3))})
    new = schema.canonical(old, schema.SIMULATION)
    assert set(new.data_vars) == {"lambda_g_collapse", "lambda_g_collapse_se"}
    assert schema.with_aliases({"lambda_g_collapse": 2.0}, schema.PAPER) == {
        "lambda_g_collapse": 2.0,
        "lambda_g": 2.0,
    }


def test_phasefield_exponents_is_one_function_for_every_block():
    import phasefield

    assert callable(phasefield.exponents) and phasefield.exponents.__module__ == "phasefield.layers.point"
    got = phasefield.exponents("post-ln:attention=paper", sigma=0.8, alpha=0.4, n_tokens=8, depth=4)
    want = layers.rates(spec.build("post-ln", dict(sigma=0.8, alpha=0.4, attention="paper")), n_tokens=8, depth=4)
    for k in ("angle_rate", "lambda_g_input", "lambda_g_collapse", "lambda_a", "q_L", "rho_L"):
        assert float(got[k]) == float(want[k]), k
    paper_pt = phasefield.exponents("paper", sigma_w=1.5, n_tokens=8, depth=4)
    assert np.isclose(
        float(paper_pt["lambda_a"]),
        float(paper.exponents(HParams(sigma_w=1.5, n_tokens=8, depth=4))["lambda_a"]),
        rtol=0,
        atol=1e-12,
    )
    with pytest.raises(ValueError, match="no 'bogus'"):
        phasefield.exponents("pre-ln", bogus=1.0)
