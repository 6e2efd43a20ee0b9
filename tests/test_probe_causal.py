"""phasefield.probe on causal models: a causal preset probed per position against
:func:`phasefield.layers.causal_rates` with tolerances from the standard errors (and the
acausal theory rejected), the command line's causal path (its JSON keys and text),
the fix's search and check reading the last token's rates, and the errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

import phasefield
from phasefield import layers, schema
from phasefield.layers import spec
from phasefield.layers.causal import masked
from phasefield.probing import fix, models, positions, result, search

# the point of tests/test_simulate_positions.py (where the mask moves rho, the angle and the
# gradient rate by many standard errors), on the probe's network: dense weights, 4 sequences
# per init
N, DEPTH, WIDTH, BATCH, INITS, RHO0 = 8, 3, 128, 4, 16, 0.3
POINT = dict(sigma=1.2, alpha=0.9, heads=2)
SPEC = "pre-ln:causal=true," + ",".join(f"{k}={v}" for k, v in POINT.items())
SIZE = ["--width", str(WIDTH), "--depth", str(DEPTH), "--n-tokens", str(N), "--set", f"batch={BATCH}"]
SIZE += ["--set", f"rho0={RHO0}", "--inits", str(INITS)]


@pytest.fixture(scope="module")
def res():
    m = models.preset("pre-ln", depth=DEPTH, width=WIDTH, n_tokens=N, batch=BATCH, rho0=RHO0, causal=True, **POINT)
    assert m.causal
    return phasefield.probe(m, inits=INITS, chunk=4)


def _flat(d):
    return np.concatenate([np.atleast_1d(np.asarray(d[k], np.float64)) for k in positions.QUANTITIES])


def test_causal_preset_against_the_causal_theory_per_position(res):
    """Every per-position quantity within 4 standard errors plus an O(1/d) allowance
    (|theory|/d for q and rho, 1/d for the two rates) of the causal theory from the
    measured start; the acausal theory lies outside at rho from position 3 on and at the last
    token's two rates."""
    assert res.causal and res.theory is None and res.rate_names == ("angle_rate_last", "lambda_g_last")
    assert set(positions.QUANTITIES) <= set(schema.NAMES)
    p = res.positions()
    mean, se = _flat(p), _flat({k: p[k + "_se"] for k in positions.QUANTITIES})
    want = _flat(res.causal_theory)
    allowance = np.concatenate([np.abs(want[: 2 * N]), [1.0, 1.0]]) / WIDTH
    tol = 4 * se + allowance
    keep = np.arange(mean.size) != N  # rho at position 0: 0 in both by definition
    assert np.all(np.isfinite(mean)) and np.all(np.isfinite(want)) and np.all(se[keep] > 0)
    print("causal z:", np.round((mean - want)[keep] / se[keep], 2))
    assert np.all(np.abs(mean - want) <= tol)
    z = res.position_agreement()
    zs = np.concatenate([np.atleast_1d(z[k]) for k in positions.QUANTITIES])
    assert np.isnan(z["rho_L_pos"][0]) and np.isfinite(zs[keep]).all()
    assert abs(z["max_abs_z"]["value"]) == np.max(np.abs(zs[keep]))

    block = masked(spec.build("pre-ln", POINT), False)
    wrong = _flat({k: np.asarray(v) for k, v in layers.causal_rates(block, N, DEPTH, *res.start, causal=False).items()})
    miss = np.abs(mean - wrong) > tol
    print("acausal theory outside the tolerance:", miss.astype(int))
    assert miss[N + 3 :].all()  # rho from position 3 on, the angle and gradient rates
    # the phase and the per-block bands read the last token's rates
    assert res.phase[0] == "ordered" and res.angle_rate_last[0] < 0
    assert res.diagnosis()["token"] == "last"


def test_cli_causal_path_json_and_text(res, tmp_path, monkeypatch, capsys):
    """``probe --block NAME:causal=true``: the command builds the causal preset, hands it to
    the probe, and writes the result's per-position numbers under the schema's names, the
    causal theory, z and the largest |z| (JSON), or the per-position table (text). The
    measurement is the fixture's (the probe itself is the library's, tested above; the
    command's own run is the example in docs/probe.md)."""
    from phasefield import probing
    from phasefield.cli import main

    seen = []

    def fake(m, **kw):
        seen.append((m, kw))
        return res

    monkeypatch.setattr(probing, "probe", fake)
    monkeypatch.chdir(tmp_path)
    assert main(["probe", "--block", SPEC, *SIZE, "--json", "--quiet"]) == 0
    doc = json.loads(capsys.readouterr().out)
    m, kw = seen[-1]
    assert m.causal and kw["causal"] is None and m.block == spec.build("pre-ln", dict(POINT, causal=True))
    assert doc["causal"] and doc["rates"] == ["angle_rate_last", "lambda_g_last"]
    p = res.positions()
    for k in positions.QUANTITIES:
        for key in (k, k + "_se"):
            np.testing.assert_array_equal(np.atleast_1d(np.asarray(doc[key], float)), np.atleast_1d(p[key]))
        assert k in doc["theory"] and k in doc["z"] and k in schema.NAMES
    assert doc["z"]["rho_L_pos"][0] is None and len(doc["z"]["q_L_pos"]) == N
    assert doc["max_abs_z"] == res.position_agreement()["max_abs_z"]
    assert main(["probe", "--block", SPEC.replace("causal=true,", ""), *SIZE, "--quiet", "--causal"]) == 0
    assert seen[-1][1]["causal"] is True and seen[-1][0].causal  # --causal builds it masked
    out = capsys.readouterr().out
    assert "rho_L_pos" in out and "largest |z| against the causal theory" in out
    assert main(["probe", "--block", "gpt2:heads=2", "--width", "16", "--depth", "2", "--json", "--no-causal"]) == 0
    assert seen[-1][1]["causal"] is False and not seen[-1][0].causal  # a decoder built unmasked


def test_the_search_and_the_check_read_the_last_tokens_rates():
    """No program compiled: the search's rates and the check's distance from per-init
    measurements of the last token (ratios of means), not the whole sequence's."""
    rng = np.random.default_rng(0)
    gap0 = 1e-3 * (1 + 0.1 * rng.standard_normal(8))
    gapL, g, u = gap0 * np.exp(-0.3), 5.0 * np.ones(8), 1.0 + 0.1 * rng.standard_normal(8)
    la, la_se, lg, lg_se = search.rates_of(dict(gap0=gap0, gapL=gapL, g=g, u=u), 3)
    assert la == pytest.approx(-0.1) and la_se < 1e-12 and lg == pytest.approx(np.log(5.0 / u.mean()) / 3)
    assert lg_se > 0 and search.rates_of(dict(log_gap=np.log(gapL / gap0), grad=g), 3)[2] == pytest.approx(
        np.log(5.0) / 3
    )
    L, inits = 3, 4
    ones = np.ones((inits, L + 1))
    gap = 1e-3 * np.exp(-0.02 * np.arange(L + 1)) * ones  # the whole sequence: inside the criteria
    gap_last = 1e-3 * np.exp(-0.2 * np.arange(L + 1)) * ones * (1 + 0.01 * np.arange(inits))[:, None]
    raw = dict(q_data=ones, rho_data=0.3 * ones, q_sym=ones, rho_sym=0.3 * ones, gap=gap, grad=ones)
    raw.update(gap_last=gap_last, grad_last=ones, finite=np.full(inits, L), grad_finite=np.ones(inits, bool))
    raw.update({k: np.ones((inits, 5)) for k in ("q_pos", "rho_pos", "q_pos_data", "rho_pos_data")})
    a = fix.measured(raw, L, "m", 1e-3, 10.0, 0.05, 7, causal=True)
    assert a["angle_rate"] == pytest.approx(-0.02) and a["angle_rate_last"] == pytest.approx(-0.2)
    assert a["distance"] == pytest.approx(0.2 / 0.05) and a["phase"][0] == "ordered"
    assert fix.measured(raw, L, "m", 1e-3, 10.0, 0.05, 7)["distance"] == pytest.approx(0.02 / 0.05)
    assert fix.check_size(None, ("pre-ln", {}), causal=True) == fix.check_size(None, ("pre-ln", {})) - 1


def test_positions_of_a_model_probed_as_not_causal_is_a_value_error():
    inits, L = 3, 2
    ones = np.ones((inits, L + 1))
    raw = dict(q_data=ones, rho_data=0.3 * ones, q_sym=ones, rho_sym=0.3 * ones, gap=1e-3 * ones)
    r = result.ProbeResult(name="m", ds=result.dataset(raw), start=(1.0, 0.3), eps=1e-3)
    for f in (r.positions, r.position_agreement):
        with pytest.raises(ValueError, match="causal"):
            f()
    with pytest.raises(ValueError, match="causal model only"):
        r.angle_rate_last  # noqa: B018
    assert r.to_dict()["rates"] == ["angle_rate", "lambda_g_input"] and r.to_dict()["causal"] is False


ENCODER = """
import jax.numpy as jnp
from flax import linen as nn
from phasefield.probing import Model

class B(nn.Module):
    @nn.compact
    def __call__(self, x):
        return x + nn.Dense(x.shape[-1])(x) * 0.5

class M(nn.Module):
    @nn.compact
    def __call__(self, x):
        return B(name="b1")(B(name="b0")(x))

def make(causal=False):
    m = M()
    x = jnp.ones((1, 4, 8)) + jnp.arange(32.).reshape(1, 4, 8) / 32
    return Model(lambda k: m.init(k, x), m.apply, x, blocks="B", causal=causal)
"""


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--model", "enc.py:make", "--causal"], "not causal (Model.causal=False)"),
        (["--block", "pre-ln:causal=false", "--causal", "--width", "8", "--depth", "2"], "contradicts --block"),
        (
            ["--preset", "pre-ln", "--set", "causal=true", "--no-causal", "--width", "8", "--depth", "2"],
            "contradicts --set causal",
        ),
        (["--block", "dyt:heads=2", "--causal", "--width", "8", "--depth", "2"], "block dyt: causal=true"),
    ],
)
def test_cli_causal_errors_are_one_line_and_exit_2(argv, needle, tmp_path, monkeypatch, capsys):
    from phasefield.cli import main

    (tmp_path / "enc.py").write_text(ENCODER)
    monkeypatch.chdir(tmp_path)
    code = main(["probe", "--inits", "2", "--figure", "f.png"] + argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "f.png").exists()
