"""One name per quantity: every block's theory, the paper block's and the probe's results
carry the names of phasefield.schema and no earlier one; files of earlier releases read
under today's names."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from phasefield import HParams, layers, schema
from phasefield.layers import paper, spec
from phasefield.theory.reference import ReferencePoint


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


def test_results_are_plain_dicts_without_the_earlier_names():
    """lambda_g (two quantities, by result), lambda_g_collapsed and the probe's lambda_a (an
    angle rate) are gone: every result is a plain dict under the names of schema.NAMES."""
    blk = spec.build("post-ln", dict(sigma=0.8, alpha=0.4, attention="paper"))
    hp = HParams(sigma_w=1.5, n_tokens=8, depth=4)
    results = (
        layers.rates(blk, n_tokens=8, depth=4),
        layers.finite_depth(blk, n_tokens=8, depth=4),
        layers.fixed_point_exponents(blk, n_tokens=8, depth=4),
        paper.exponents(hp),
        ReferencePoint(1.5, 1.0, 0.5, 0.5, n_tokens=8, depth=4).exponents(),
    )
    for r in results:
        assert type(r) is dict
        for old in ("lambda_g", "lambda_g_collapsed", "lambda_g_se"):
            assert old not in r and r.get(old) is None
            with pytest.raises(KeyError):
                r[old]
    for gone in ("COLLAPSE", "PAPER", "PROBE", "with_aliases"):
        assert not hasattr(schema, gone), gone
    from phasefield.probing.result import ProbeResult

    assert not hasattr(ProbeResult, "lambda_a") and not hasattr(ProbeResult, "lambda_g")


def test_canonical_reads_the_files_of_earlier_releases():
    """0.1 files carry only the earlier name; 0.2 files carry it beside the canonical one as a
    copy marked ``deprecated``: both read under the names of today, nothing else renamed."""
    v01 = xr.Dataset(
        {"lambda_g": ("x", np.arange(3.0)), "lambda_g_se": ("x", np.ones(3)), "lambda_a": ("x", -np.ones(3))}
    )
    new = schema.canonical(v01, schema.EARLIER_COLLAPSE)
    assert set(new.data_vars) == {"lambda_g_collapse", "lambda_g_collapse_se", "lambda_a"}
    assert np.array_equal(new["lambda_g_collapse"], np.arange(3.0))
    v02 = xr.Dataset({"lambda_g_collapse": ("x", np.arange(3.0))})
    v02["lambda_g"] = v02["lambda_g_collapse"].copy()
    v02["lambda_g"].attrs["deprecated"] = "the earlier name of lambda_g_collapse"
    assert set(schema.canonical(v02, schema.EARLIER_COLLAPSE).data_vars) == {"lambda_g_collapse"}
    block = {"lambda_g": 0.2, "lambda_g_se": 0.01, "lambda_g_collapsed": 0.3, "angle_rate": -0.1}
    assert schema.canonical(block, schema.EARLIER_INPUT) == {
        "lambda_g_input": 0.2,
        "lambda_g_input_se": 0.01,
        "lambda_g_collapse": 0.3,
        "angle_rate": -0.1,
    }
    today = {"lambda_g_input": 0.2}
    assert schema.canonical(today, schema.EARLIER_INPUT) is today


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
