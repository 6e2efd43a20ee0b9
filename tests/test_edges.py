"""The parameter space's edges: alpha = 0, alpha = 1, the identity residual
(beta = 1), relu with several MLP layers under autodiff, and several attractors (bistable
points). Each defined value is checked against an independent route: a limit of interior
points, the finite-depth recursion, finite differences, iterating the map."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from phasefield import HParams
from phasefield._runtime import optimized_jit
from phasefield.cli import main
from phasefield.layers import paper
from phasefield.theory import mlp

pytestmark = pytest.mark.usefixtures("float64")

KEYS = ("lambda_a", "lambda_g_collapse", "lambda_g_inf", "q_star", "rho_star")
BISTABLE = dict(sigma_w=8.175, sigma_a=6.875, alpha_a=0.705, alpha_m=0.41, n_tokens=128)


def _ex(hp, kern=None):
    return {k: float(v) for k, v in paper.exponents(hp, kern).items() if np.ndim(v) == 0}


# ---- alpha -> 0 and alpha -> 1: the limits of interior sequences ------------------------------


@pytest.mark.parametrize("sw", [1.0, 3.0])  # ordered / chaotic side of alpha -> 0
def test_alpha_zero_is_the_limit_of_small_alpha(sw):
    kern = mlp.kernel(HParams(sigma_w=sw))  # built once (depends on sigma_w only)
    at0 = _ex(HParams(sigma_w=sw, alpha_a=0.0, alpha_m=0.0), kern)
    assert all(math.isfinite(at0[k]) for k in KEYS)
    assert at0["lambda_a"] == at0["lambda_g_collapse"] == at0["lambda_g_inf"] == 0.0
    growth0 = float(paper.angle_growth(HParams(sigma_w=sw, alpha_a=0.0, alpha_m=0.0), kern))
    assert math.isfinite(growth0)  # (a NaN has a sign bit too)
    prev = None
    for k in (2, 3, 4, 5, 6):
        a = 10.0**-k
        e = _ex(HParams(sigma_w=sw, alpha_a=a, alpha_m=a), kern)
        assert all(math.isfinite(e[key]) for key in KEYS), e  # (max would skip a NaN after the first key)
        err = max(abs(e[key] - at0[key]) for key in KEYS)
        assert err < 50 * a * a  # O(alpha^2) approach
        if prev is not None and k <= 5:
            assert err < prev  # and a converging sequence
        prev = err
        # lambda_a / alpha^2 converges too (sign and rate, not only the value 0)
        assert math.copysign(1, e["lambda_a"]) == math.copysign(1, growth0)


def test_alpha_one_is_the_limit_of_alpha_to_one():
    kern = mlp.kernel(HParams(sigma_w=1.5))
    at1 = _ex(HParams(sigma_w=1.5, alpha_a=1.0, alpha_m=1.0), kern)
    assert at1["lambda_a"] == -math.inf  # beta_A = 0: the true value
    assert all(math.isfinite(at1[k]) for k in KEYS if k != "lambda_a")
    las = []
    for k in (3, 4, 5, 6):
        a = 1.0 - 10.0**-k
        e = _ex(HParams(sigma_w=1.5, alpha_a=a, alpha_m=a), kern)
        for key in KEYS[1:]:
            assert abs(e[key] - at1[key]) < 10 * 10.0**-k, key  # O(beta^2) approach
        las.append(e["lambda_a"])
    # lambda_a ~ log(beta_A^2) + const -> -inf: each decade of 1 - alpha lowers it by log 10
    # (up to O(1 - alpha))
    err = np.abs(-np.diff(las) - math.log(10))
    assert np.all(err < 2 * 10.0 ** -np.arange(3, 6))


def test_alpha_a_one_alone():
    e = _ex(HParams(sigma_w=1.5, alpha_a=1.0, alpha_m=0.3))
    assert e["lambda_a"] == -math.inf and math.isfinite(e["lambda_g_collapse"]) and math.isfinite(e["q_star"])


# ---- identity residual (beta = 1) ----------------------------------------------------------------


@pytest.mark.parametrize("alpha, depth", [(0.5, 16), (0.5, 400), (1e-4, 16)])
def test_identity_lambda_g_closed_form_equals_recursion(alpha, depth):
    """The log-Gamma closed form against the block-by-block backward recursion (the generic
    finite-depth code path) and a direct sum of the per-block logs."""
    hp = HParams(sigma_w=1.0, residual="identity", alpha_a=alpha, alpha_m=alpha, depth=depth)
    closed = float(paper.gradient_exponent_collapsed(hp))
    recursion = float(paper.gradient_exponent(hp))
    assert closed == pytest.approx(recursion, rel=1e-11, abs=1e-15)
    # direct: q_l = 1 + l c, modes t_l and (1 + aa2 sv2 / q_l) t_l, mixed 1 - 1/n : 1/n
    k = mlp.kernel(hp)
    aa2 = am2 = alpha * alpha
    c = aa2 + am2 * float(k.q_m)
    q = 1.0 + c * np.arange(depth)
    log_t = np.log1p(am2 * float(k.d_one) / (q + aa2)).sum()
    log_mean = log_t + np.log1p(aa2 / q).sum()
    n = hp.n_tokens
    direct = np.logaddexp(np.log1p(-1 / n) + log_t, log_mean - np.log(n)) / depth
    assert closed == pytest.approx(direct, rel=1e-11, abs=1e-15)


def test_identity_residual_values_and_power_law():
    hp = HParams(sigma_w=1.0, residual="identity")
    e = _ex(hp)
    assert e["q_star"] == math.inf and e["lambda_a"] == 0.0 and e["lambda_g_inf"] == 0.0
    assert float(paper.angle_exponent(hp, method="autodiff")) == 0.0
    # 1 - rho ~ depth^p with p = s angle_growth / c: measured on the map itself
    k = mlp.kernel(hp)
    c = 0.25 + 0.25 * float(k.q_m)
    p = 0.5 * float(paper.angle_growth(hp)) / c
    qs, ps = paper.trajectory(hp, 1.0, 0.999, 20000)
    u = 1.0 - np.asarray(ps / qs)
    slope = math.log(u[20000] / u[2000]) / math.log(10.0)
    assert p < 0 and e["rho_star"] == 1.0  # ordered: rho -> 1
    assert slope == pytest.approx(p, abs=2e-3)


def test_identity_residual_chaotic_attractor():
    hp = HParams(sigma_w=3.0, residual="identity")
    e = _ex(hp)
    rho = e["rho_star"]
    assert float(paper.angle_growth(hp)) > 0 and 0 < rho < 1

    # rho_star is a fixed point of the map in the limit q -> inf: at q = 1e6 its step
    # (p' - rho q') is O(1/q) of the step at rho = 1/2
    def step(r, q=1e6):
        q1, p1 = paper.block_map(hp, q, r * q)
        return float(p1 - r * q1)

    assert abs(step(rho)) < 1e-5 * abs(step(0.5))
    # and the finite-depth iteration approaches it (slowly: steps shrink like 1/depth)
    qs, ps = paper.trajectory(hp, 1.0, 0.5, 10000)
    d = np.asarray(ps / qs)[[100, 1000, 10000]] - rho
    assert np.all(d > 0) and np.all(np.diff(d) < 0)


# ---- relu, several MLP layers: autodiff lambda_a -------------------------------------------------


@pytest.mark.parametrize("layers", [2, 3])
def test_relu_autodiff_lambda_a_against_finite_differences(layers):
    """The relu arc-cosine kernel has a (1 - rho)^{3/2} term, so the one-sided difference
    quotient of u = q - p converges like h^{1/2}: extrapolate in powers of h^{1/2}. The
    quotients read the map's last digits (q - p at h ~ 1e-6), so the map is compiled with
    run-time optimisation (``optimized_jit``: LLVM -O1 in the suite, XLA's defaults in a
    user's process; the suite's fast -O0 compiles round ~10x coarser there, tests/conftest.py)."""
    hp = HParams(sigma_w=1.5, activation="relu", mlp_layers=layers, alpha_a=0.5, alpha_m=0.7)
    closed = float(paper.angle_exponent(hp, method="closed"))
    auto = float(paper.angle_exponent(hp, method="autodiff"))
    assert auto == pytest.approx(closed, abs=1e-14)
    q = float(paper.collapsed_fixed_point(hp)[0])
    hs = 1e-3 * 4.0 ** -np.arange(6)
    block_map = optimized_jit(lambda q, p: paper.block_map(hp, q, p))
    quot = []
    for h in hs:
        q1, p1 = block_map(q, q - h * q)
        quot.append(float(q1 - p1) / (h * q))
    A = np.stack([np.ones_like(hs)] + [hs ** (j / 2) for j in (1, 2, 3)], 1)
    fd = math.log(np.linalg.lstsq(A, np.asarray(quot), rcond=None)[0][0])
    assert abs(math.log(quot[-1]) - auto) > 1e-4  # the raw quotient is far off
    assert fd == pytest.approx(auto, abs=2e-9)


# ---- several attractors ------------------------------------------------------------------------


def test_bistable_point_reports_both_attractors():
    hp = HParams(**BISTABLE)
    fp = paper.stable_points(hp)
    roots = np.asarray(fp["rho"])[np.asarray(fp["stable"])]
    assert int(fp["n_stable"]) == 2 and not bool(fp["collapsed_stable"])
    np.testing.assert_allclose(roots, [0.00218188474577, 0.193628635459], rtol=1e-9)
    unstable = np.asarray(fp["rho"])[~np.asarray(fp["stable"]) & np.isfinite(np.asarray(fp["rho"]))]
    assert unstable.size == 1 and roots[0] < unstable[0] < roots[1]
    e = paper.exponents(hp)
    assert float(e["rho_star_min"]) == pytest.approx(roots[0]) and float(e["rho_star_max"]) == pytest.approx(roots[1])
    # each is a fixed point of the full map, and iterating from rho_0 = 1/2 (the reported
    # rho_star) and from rho_0 = 0 reaches the two different ones
    for rho0, target in ((0.5, roots[1]), (0.0, roots[0])):
        qs, ps = paper.trajectory(hp, 1.0, rho0, 400)
        assert float(ps[-1] / qs[-1]) == pytest.approx(target, rel=1e-9)
    assert float(e["rho_star"]) == pytest.approx(roots[1], rel=1e-12)


def test_monostable_point_reports_one_attractor():
    for pt, expect in (((1.0, 1.0, 0.5, 0.5), 1.0), ((3.0, 1.0, 0.5, 0.5), None)):
        hp = HParams(sigma_w=pt[0], sigma_a=pt[1], alpha_a=pt[2], alpha_m=pt[3])
        e = paper.exponents(hp)
        assert int(e["n_stable"]) == 1
        rho = float(e["rho_star"])
        assert float(e["rho_star_min"]) == float(e["rho_star_max"]) == rho
        if expect is not None:
            assert rho == expect
        qs, ps = paper.trajectory(hp, 1.0, 0.5, 400)
        assert float(ps[-1] / qs[-1]) == pytest.approx(rho, abs=2e-3)


# ---- the command line: valid JSON, phase labels, both attractors --------------------------------


def _strict_json(text):
    def bad(c):
        raise AssertionError(f"bare {c} in JSON output")

    return json.loads(text, parse_constant=bad)


def _cli(capsys, *args):
    code = main(["exponents", "--depth", "8", *map(str, args)])
    out, err = capsys.readouterr()
    assert code in (0, None), err
    return out


def test_cli_alpha_zero_and_one_json(capsys):
    r0 = _strict_json(_cli(capsys, "--alpha", 0, "--n-tokens", 100, "--json"))
    assert r0["lambda_a"] == 0.0 and r0["lambda_g_collapse"] == 0.0 and r0["phase"] == "edge/edge"
    assert r0["q_star"] > 0 and r0["n_stable"] == 1
    r1 = _strict_json(_cli(capsys, "--alpha", 1, "--json"))
    assert r1["lambda_a"] == "-inf" and float(r1["lambda_a"]) == -math.inf
    assert r1["phase"].startswith("ordered/") and isinstance(r1["lambda_g_collapse"], float)


def test_cli_identity_residual_json(capsys):
    r = _strict_json(_cli(capsys, "--residual", "identity", "--json"))
    assert r["q_star"] == "inf" and r["lambda_a"] == 0.0 and r["phase"].startswith("ordered/")
    assert isinstance(r["lambda_g_collapse"], float) and r["rho_star"] == 1.0
    r = _strict_json(_cli(capsys, "--residual", "identity", "--sigma-w", 3, "--json"))
    assert r["phase"].startswith("chaotic/") and 0 < r["rho_star"] < 1


def test_cli_bistable_prints_both_attractors(capsys):
    args = ["--sigma-w", 8.175, "--sigma-a", 6.875, "--alpha-a", 0.705, "--alpha-m", 0.41, "--n-tokens", 128]
    r = _strict_json(_cli(capsys, *args, "--json"))
    assert r["bistable"] is True and r["n_stable"] == 2
    np.testing.assert_allclose(r["attractors"], [0.00218188474577, 0.193628635459], rtol=1e-9)
    assert r["rho_star"] == pytest.approx(0.1936286355) and r["rho_0"] == 0.5
    text = _cli(capsys, *args)
    assert "BISTABLE" in text and "0.00218188" in text and "0.193629" in text


# ---- sweeps and the phase diagram: bistable points are marked ---------------------------------


def test_sweep_marks_bistable_points():
    import phasefield

    ds = phasefield.sweep(sigma_w=8.175, sigma_a=[1.0, 6.875], alpha_a=0.705, alpha_m=0.41, n_tokens=128)
    assert ds.n_stable.values.tolist() == [1.0, 2.0]
    b = ds.sel(sigma_a=6.875)
    np.testing.assert_allclose(
        [float(b.rho_star_min), float(b.rho_star_max), float(b.rho_star)],
        [0.00218188474577, 0.193628635459, 0.193628635459],
        rtol=1e-9,
    )


def test_phase_diagram_hatches_the_bistable_region(tmp_path):
    import xarray as xr

    from phasefield.figures import paper, phase

    a, sw = np.linspace(0.05, 0.95, 6), np.linspace(0.5, 6, 5)
    A, S = np.meshgrid(a, sw)
    ns = np.where((S > 4) & (A > 0.5), 2.0, 1.0)
    ds = xr.Dataset(
        {
            "lambda_a": (("sigma_w", "alpha"), (S - 2) * A),
            "lambda_g_collapse": (("sigma_w", "alpha"), (S - 2) * A + 0.1),
            "n_stable": (("sigma_w", "alpha"), ns),
        },
        coords=dict(alpha=a, sigma_w=sw),
    )
    mask = phase.bistable(ds, "alpha", "sigma_w")
    assert mask is not None and int(mask.sum()) == int((ns >= 2).sum())
    assert phase.bistable(ds.drop_vars("n_stable"), "alpha", "sigma_w") is None  # old sweeps
    paths = paper.phase_diagram(ds, str(tmp_path))
    assert all(p.endswith((".png", ".pdf")) for p in paths)
