"""Simulation against the mean-field theory engine (``phasefield.theory``): transients
over 16 blocks and both exponents, at points on both sides of both phase boundaries.
Tolerances: the acceptance targets (q within 3 %, rho within 0.03), each checked to exceed the
statistical resolution (3 standard errors of q, 2 of rho: the per-draw spread of q at
width 512 is ~7 %, set by the fresh value/MLP weights of every layer, so 64 draws are
needed for a ~0.9 % standard error), and q also within 4 standard errors per layer;
lambda_a 3 standard errors, lambda_g(16) 0.03 (checked to be >= 3 standard errors).
Lazy weights, the simulator's default (exact in distribution: tests/test_lazy.py; the
tolerances above were set with dense reference weights)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import q_star_reference

import phasefield  # noqa: F401
from phasefield import HParams
from phasefield.layers import (
    paper,  # noqa: E402  (the lead's theory engine; no skip)
    presets,
)
from phasefield.simulate import measure

# (sigma_w, sigma_A, alpha): ordered/vanishing, ordered/vanishing near the lambda_g
# boundary, chaotic/exploding near the lambda_a boundary, deep chaotic/exploding
POINTS = [(1.0, 1.0, 0.5), (1.5, 1.5, 0.5), (2.0, 0.5, 0.5), (3.0, 1.0, 0.5)]


@pytest.mark.parametrize("sigma_w,sigma_a,alpha", POINTS)
def test_transients_match_theory(sigma_w, sigma_a, alpha):
    hp = HParams(sigma_w=sigma_w, sigma_a=sigma_a, alpha_a=alpha, alpha_m=alpha, depth=16)
    sim = measure.transients(presets.paper(hp), 1.0, 0.5, depth=16, width=512, draws=64, seed=21, weights="lazy")
    q, p = (np.asarray(v, float) for v in paper.trajectory(hp, 1.0, 0.5, 16))
    z = np.abs(sim["q"] - q)[1:] / sim["q_se"][1:]
    print(f"max |z| of q over the layers: {z.max():.2f}, max |rho - theory| {np.abs(sim['rho'] - p / q).max():.4f}")
    assert q.shape == sim["q"].shape == (17,)
    assert np.all(3 * sim["q_se"][1:] / q[1:] <= 0.03), sim["q_se"] / q
    assert np.all(2 * sim["rho_se"] <= 0.03), sim["rho_se"]
    np.testing.assert_array_less(np.abs(sim["q"] - q)[1:] / q[1:], 0.03)
    # 16 layers are tested at once: 4 se keeps the family-wise false-alarm rate below 1 %
    # (t distribution, 63 dof); measured max |z| over the layers (lazy weights, exact in
    # distribution -- tests/test_lazy.py -- and ~10x cheaper than dense here): 1.25, 0.82,
    # 1.19, 1.51 (dense weights: 1.6, 1.5, 1.7, 1.4).
    np.testing.assert_array_less(np.abs(sim["q"] - q)[1:], 4 * sim["q_se"][1:])
    np.testing.assert_array_less(np.abs(sim["rho"] - p / q), 0.03)


@pytest.mark.parametrize("sigma_w,sigma_a,alpha", POINTS)
def test_exponents_match_theory(sigma_w, sigma_a, alpha):
    hp = HParams(sigma_w=sigma_w, sigma_a=sigma_a, alpha_a=alpha, alpha_m=alpha, depth=16)
    th = paper.exponents(hp)
    q_star = float(paper.collapsed_fixed_point(hp)[0])
    assert q_star_reference(hp) == pytest.approx(q_star, rel=1e-6)
    blk = presets.paper(hp)
    la, la_se = measure.angle_exponent(blk, width=256, draws=16, q_star=q_star, seed=11, weights="lazy")
    assert abs(la - float(th["lambda_a"])) < 3 * la_se
    lg, lg_se = measure.gradient_exponent(blk, depth=16, width=256, draws=16, q_star=q_star, seed=11, weights="lazy")
    assert lg_se < 0.01
    assert abs(lg - float(th["lambda_g_collapse"])) < 0.03


def test_phase_signs_on_both_sides():
    """The chosen points straddle both boundaries in the theory (so the tests above
    exercise both phases of each exponent)."""
    signs = []
    for sw, sa, a in POINTS:
        th = paper.exponents(HParams(sigma_w=sw, sigma_a=sa, alpha_a=a, alpha_m=a, depth=16))
        signs.append((np.sign(float(th["lambda_a"])), np.sign(float(th["lambda_g_collapse"]))))
    assert {s[0] for s in signs} == {-1.0, 1.0}
    assert {s[1] for s in signs} == {-1.0, 1.0}
