"""``phasefield recommend --block pre-ln|post-ln|rms-swiglu``: the points nearest to criticality
of a standard block, checked point by point against the block's library rates, the paragraph
where no point meets both criteria, and bad input (one line, exit 2)."""

import json
import math

import pytest

from phasefield import layers
from phasefield.cli import main

SMALL = [
    "--depth",
    "4",
    "--n-tokens",
    "4",
    "--axis",
    "sigma=0.5,1",
    "--axis",
    "alpha_attn=0.3,0.6",
    "--axis",
    "alpha_mlp=0.3,0.6",
]


def _run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("block", ["pre-ln", "post-ln"])
def test_recommend_a_standard_block(capsys, block):
    rc, out, err = _run(
        capsys,
        "recommend",
        "--block",
        f"{block}:heads=2",
        *SMALL,
        "--max-gradient-factor",
        "10",
        "--max-angle-rate",
        "0.5",
        "--json",
    )
    assert rc == 0, err
    res = json.loads(out)
    assert res["block"] == block and res["found"] and res["points"]
    dists = [p["distance"] for p in res["points"]]
    assert all(math.isfinite(d) for d in dists), dists  # sorted() leaves a NaN anywhere
    assert dists == sorted(dists) and dists[0] <= 1.0
    p = res["points"][0]
    blk = layers.presets.get(block, sigma=p["sigma"], alpha_attn=p["alpha_attn"], alpha_mlp=p["alpha_mlp"], heads=2)
    fd = layers.finite_depth(blk, q0=1.0, rho0=0.5, n_tokens=4, depth=4)
    assert p["lambda_g_input"] == pytest.approx(float(fd["lambda_g_input"]), abs=1e-12)
    assert p["angle_rate"] == pytest.approx(float(fd["angle_rate"]), abs=1e-12)
    assert p["distance"] == pytest.approx(
        max(abs(p["lambda_g_input"]) * 4 / math.log(10), abs(p["angle_rate"]) / 0.5), abs=1e-12
    )


def test_recommend_says_when_no_point_meets_both(capsys):
    rc, out, err = _run(
        capsys,
        "recommend",
        "--block",
        "pre-ln:heads=2",
        *SMALL,
        "--max-gradient-factor",
        "1.000001",
        "--max-angle-rate",
        "1e-9",
    )
    assert rc == 0, err
    assert "No point of the box keeps the gradient within a factor 1 over 4 blocks" in out
    assert "The trade-off" in out and "nearest points" in out


def test_recommend_a_causal_block_by_its_last_token(capsys):
    """``NAME:causal=true``: the criteria read the last token's rates, each point the causal
    theory's (:func:`phasefield.layers.causal_rates`) at that point."""
    rc, out, err = _run(
        capsys, "recommend", "--block", "pre-ln:heads=2,causal=true", *SMALL, "--max-angle-rate", "0.5", "--json"
    )
    assert rc == 0, err
    res = json.loads(out)
    assert res["rates"] == ["lambda_g_last", "angle_rate_last"] and res["fixed"]["causal"] is True
    for p in res["points"][:2]:
        assert "lambda_g_input" not in p and math.isfinite(p["distance"])
        blk = layers.presets.get(
            "pre-ln", sigma=p["sigma"], alpha_attn=p["alpha_attn"], alpha_mlp=p["alpha_mlp"], heads=2, causal=True
        )
        th = layers.causal_rates(blk, n_tokens=4, depth=4, q0=1.0, rho0=0.5)
        # the same fields, the one-point program against recommend's batched (vmapped) one:
        # the exact map's sampled part sums in float32 (full_gram.SAMPLE_DTYPE, ~1e-7 relative
        # per sum), and XLA's batched kernels order those sums differently (docs/theory.md,
        # "The exact map's sampling error": up to 7e-10 relative measured in lambda_g_last);
        # the angle rate reads no samples
        assert p["lambda_g_last"] == pytest.approx(float(th["lambda_g_last"]), rel=1e-6, abs=1e-12)
        assert p["angle_rate_last"] == pytest.approx(float(th["angle_rate_last"]), rel=0, abs=1e-15)
        want = max(abs(p["lambda_g_last"]) * 4 / math.log(10), abs(p["angle_rate_last"]) / 0.5)
        assert p["distance"] == pytest.approx(want, abs=1e-12)
    rc, out, err = _run(capsys, "recommend", "--block", "pre-ln:heads=2,causal=true", *SMALL)
    assert rc == 0 and "lambda_g_last" in out and "angle_rate_last" in out, err


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--block", "deepscalelm"], "recommend --block takes paper, pre-ln"),
        (["--block", "pre-ln", "--axis", "heads=1,2"], "not a number of the block"),
        (["--block", "pre-ln", "--axis", "alpha=0.2,0.4"], "alpha sets both"),
        (["--block", "pre-ln", "--axis", "sigma=0:1:3"], "outside"),
        (["--block", "pre-ln", "--axis", "sigma=0.1:2:17"], "at most 16"),
        (["--block", "pre-ln", "--sigma-w", "1"], "block pre-ln has no number for --sigma-w"),
        (["--block", "pre-ln", "--no-loss"], "--no-loss is for the paper block"),
        (["--block", "post-ln", "--max-angle-rate", "0"], "--max-angle-rate"),
        (["--block", "post-ln", "--max-gradient-factor", "1"], "--max-gradient-factor"),
        (["--max-angle-rate", "0.1"], "is for a standard block"),
        (["--axis", "sigma_w=1,2"], "--axis sets the box of a standard block"),
        (["--block", "paper:mlp_layers=2"], "cannot fix mlp_layers"),
        (["--block", "paper:causal=true"], "per-position"),
    ],
)
def test_recommend_block_bad_input(capsys, argv, msg):
    rc, out, err = _run(capsys, "recommend", *argv)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1 and not out, err
