"""Per-position results of a stack on the full Gram (phasefield.layers.causal): without the
mask every position is the (q, p) route's answer, the paper preset's are its causal
geometry, a new number compiles nothing, and causal pre-LN matches its finite-width network
per position."""

from __future__ import annotations

import numpy as np
import pytest

from phasefield import HParams, layers, schema
from phasefield.layers import gram, spec
from phasefield.layers.paper import gram as paper_gram

pytestmark = pytest.mark.usefixtures("float64")
N, DEPTH, Q0, RHO0 = 4, 3, 1.0, 0.4
_PLAIN = dict(attention="paper", softmax_correction=False)
POINTS = {
    "pre-ln": dict(sigma=0.9, alpha=0.6, heads=2, **_PLAIN),
    "post-ln": dict(sigma=0.7, alpha=0.8, **_PLAIN),
    "rms-swiglu": dict(sigma=0.9, alpha=0.5, **_PLAIN),
    "paper": dict(sigma_w=1.6, sigma_a=1.3, alpha_a=0.5, alpha_m=0.7),
}
KEYS = ("q_L_pos", "rho_L_pos", "angle_rate_last", "lambda_g_last")


def test_the_results_carry_schema_names():
    assert set(KEYS) <= set(schema.NAMES) and set(KEYS) <= set(schema.SYMBOLS)
    block = spec.build("pre-ln", POINTS["pre-ln"])
    for bad in (dict(n_tokens=1), dict(depth=0)):
        with pytest.raises(ValueError):
            layers.causal_rates(block, **{"n_tokens": N, "depth": DEPTH, **bad})


@pytest.mark.parametrize("name", list(POINTS))
def test_without_the_mask_every_position_is_the_qp_route(name):
    block = spec.build(name, POINTS[name])
    got = layers.causal_rates(block, N, DEPTH, Q0, RHO0, causal=False)
    want = layers.rates(block, Q0, RHO0, n_tokens=N, depth=DEPTH)
    gaps = dict(
        q=np.max(np.abs(np.asarray(got["q_L_pos"]) - float(want["q_L"]))),
        rho=np.max(np.abs(np.asarray(got["rho_L_pos"])[1:] - float(want["rho_L"]))),
        angle=abs(float(got["angle_rate_last"]) - float(want["angle_rate"])),
        grad=abs(float(got["lambda_g_last"]) - float(want["lambda_g_input"])),
    )
    print(f"{name}: max |per position - (q, p)|", {k: f"{v:.1e}" for k, v in gaps.items()})
    assert float(got["rho_L_pos"][0]) == 0.0
    assert all(np.isfinite(v) and v < 1e-10 for v in gaps.values()), gaps


def test_exact_attention_angle_rate_is_the_qp_route():
    """The angle rate runs the attention in the paper map at the collapsed Gram (the same
    first order): with the exact map it is the (q, p) route's exact-map angle rate."""
    block = spec.build("pre-ln", dict(sigma=1.1, alpha=0.5, attention="exact"))
    got = float(layers.causal_rates(block, N, 2, Q0, RHO0, causal=False)["angle_rate_last"])
    want = float(layers.rates(block, Q0, RHO0, n_tokens=N, depth=2)["angle_rate"])
    print(f"exact map: angle rate {got:.12f} vs (q, p) {want:.12f}")
    assert np.isfinite(got) and abs(got - want) < 1e-10


def test_paper_preset_causal_is_its_causal_geometry():
    kw = POINTS["paper"]
    block = spec.build("paper", kw)
    got = layers.causal_rates(block, N, DEPTH, Q0, RHO0, causal=True)
    hp = HParams(n_tokens=N, depth=DEPTH, **kw)
    geo = paper_gram.causal_geometry(hp, Q0, RHO0, DEPTH, causal=True)
    norms, cos = np.asarray(geo["norms"])[-1], np.asarray(geo["cosines"])[-1]
    earlier = np.array([0.0] + [cos[i, :i].mean() for i in range(1, N)])
    gap = np.max([np.max(np.abs(got["q_L_pos"] - norms)), np.max(np.abs(got["rho_L_pos"] - earlier))])  # NaN fails
    # the last input token's gradient: the paper engine's gradient Grams
    lam, gs = paper_gram.gradient_exponent_from_gram(
        hp, gram.symmetric_gram(N, Q0, RHO0 * Q0), DEPTH, True, return_grams=True
    )
    lg_last = float(lam) + np.log(float(gs[0][-1, -1])) / DEPTH
    gap = np.max([gap, abs(lg_last - float(got["lambda_g_last"]))])
    print(f"paper causal: max |causal_rates - causal_geometry| = {gap:.1e}")
    assert np.isfinite(gap) and gap < 1e-10
    assert np.ptp(np.asarray(got["q_L_pos"])) > 1e-3  # the mask breaks the symmetry


def test_the_angle_rate_is_its_finite_difference():
    """angle_rate_last against its definition (1/L) log[(1 - rho_L_last)/(1 - rho_0)] at
    rho_0 = 1 - eps, eps = 1e-5 (relative error O(eps) from the second order, ~1e-11 from
    the cancellation in 1 - rho)."""
    block = spec.build("pre-ln", POINTS["pre-ln"])
    rate = float(layers.causal_rates(block, N, DEPTH, Q0, RHO0, causal=True)["angle_rate_last"])
    from phasefield.layers.causal import mean_cosine_with_earlier

    def gap(eps):
        c0 = Q0 * ((1 - eps) * np.ones((N, N)) + eps * np.eye(N))
        c = gram.grams(block, c0, depth=DEPTH, causal=True)[-1]
        return 1.0 - float(mean_cosine_with_earlier(c)[-1])

    eps = 1e-5
    fd = np.log(gap(eps) / eps) / DEPTH
    print(f"causal pre-ln: angle_rate_last {rate:.8f}, finite difference {fd:.8f}")
    assert np.isfinite(rate) and abs(rate - fd) < 1e-3


def test_a_new_number_compiles_nothing(compiles):
    first = layers.causal_rates(spec.build("pre-ln", dict(sigma=0.8, alpha=0.5, **_PLAIN)), N, 2, causal=True)
    before = compiles.count
    out = layers.causal_rates(spec.build("pre-ln", dict(sigma=1.1, alpha=0.3, **_PLAIN)), N, 2, 0.9, 0.2, causal=True)
    assert compiles.count == before
    assert np.isfinite(float(out["angle_rate_last"])) and float(out["lambda_g_last"]) != float(first["lambda_g_last"])


def test_causal_pre_ln_against_network_per_position():
    """q_L_pos and rho_L_pos after 2 causal pre-LN blocks (exact-softmax map) against the
    network at width 256 over 48 draws: within 4 standard errors plus an O(1/d) allowance;
    the acausal answer, the wrong one, lies far outside."""
    from phasefield.simulate import measure

    n, depth, draws, width = 5, 2, 48, 256
    block = spec.build("pre-ln", dict(sigma=1.2, alpha=0.9, heads=2, attention="exact", softmax_correction=False))
    th = {c: layers.causal_rates(block, n, depth, 1.0, 0.3, causal=c) for c in (True, False)}
    sim = measure.token_geometry(
        block, 1.0, 0.3, n_tokens=n, width=width, draws=draws, depth=depth, causal=True, seed=1
    )
    norms = sim["norms"].reshape(depth + 1, draws, n)[-1]
    iu = np.triu_indices(n, 1)
    cos = np.zeros((draws, n, n))
    cos[:, iu[0], iu[1]] = sim["cosines"].reshape(depth + 1, draws, -1)[-1]
    cos = cos + cos.transpose(0, 2, 1)
    earlier = np.stack([cos[:, i, :i].mean(-1) for i in range(1, n)], axis=1)  # per draw
    vals = np.concatenate([norms, earlier], axis=1)
    mean, se = vals.mean(0), vals.std(0, ddof=1) / np.sqrt(draws)

    def theory(out):
        return np.concatenate([np.asarray(out["q_L_pos"]), np.asarray(out["rho_L_pos"])[1:]])

    z = (mean - theory(th[True])) / se
    print("causal pre-ln, per position (q_L_pos, rho_L_pos[1:]) z:", np.round(z, 2))
    allowance = 2.0 / width * np.abs(theory(th[True]))
    assert np.all(np.abs(mean - theory(th[True])) < 4 * se + allowance)
    z_wrong = (mean - theory(th[False])) / se
    print("acausal theory z:", np.round(z_wrong, 1), "chi2", round(float(np.sum(z_wrong**2)), 1))
    assert np.sum(np.square(z_wrong)) > 10 * len(z)  # 9 values: chi2 expectation 9
