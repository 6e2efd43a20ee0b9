"""Sensitivity (Catformer appendix, seed 004): estimator, closed forms, composition rules."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import phasefield  # noqa: F401
from phasefield.seeds import sensitivity as sn

# these tests transform the seed formulas with their own jit/vmap: JAX's scoped x64 switch
# (the library's functions enter it themselves; tests/test_isolation.py checks that)
pytestmark = pytest.mark.usefixtures("float64")

K = jax.random.PRNGKey
DEPTH, WIDTH, DRAWS = 3, 8, 1024


@pytest.mark.parametrize("arch", sn.ARCHS)
def test_profiles_match_closed_forms(arch):
    r = sn.profile(arch, DEPTH, WIDTH, DRAWS, key=K(1))
    z = np.abs(r["S"] - r["theory"]) / r["se"]
    assert np.all(z < 4), (arch, r["S"], r["theory"], r["se"])


def test_closed_form_values():
    N = 10
    assert sn.closed_form("feedforward", N)[-1] == N
    assert sn.closed_form("post-norm", N)[-1] == N / 2
    assert sn.closed_form("rescalenet", N)[-1] == pytest.approx(sn.harmonic(N))
    assert sn.closed_form("pre-norm", N)[-1] == pytest.approx(sn.harmonic(N + 1) - 1)
    assert sn.closed_form("admin", N)[-1] == pytest.approx(sn.harmonic(N + 1) - 1)
    a = 0.6
    assert sn.closed_form("weighted-post", N, a, 1.0)[-1] == pytest.approx(N / (1 + a * a))
    big = sn.closed_form("weighted-pre", 4000, a)  # -> (1 - alpha^2) N
    assert big[-1] / 4000 == pytest.approx(1 - a * a, rel=1e-3)


def test_fd_equals_jvp():
    a = sn.profile("weighted-pre", DEPTH, WIDTH, 64, key=K(2), method="jvp")
    b = sn.profile("weighted-pre", DEPTH, WIDTH, 64, key=K(2), method="fd", delta=1e-6)
    assert np.allclose(a["S"], b["S"], rtol=1e-4)


def _lin(shape):
    return lambda k: jax.random.normal(k, shape, jnp.float64) / math.sqrt(shape[0])


def _S(f, sp, key=None, draws=2048, x_dim=6):
    key = K(3) if key is None else key
    S, se = sn.estimate(f, sp, lambda k: jax.random.normal(k, (x_dim,), jnp.float64), key, draws)
    return float(S[0]), float(se[0])


def test_rule_identity():
    S, se = sn.estimate(
        lambda u, x: u, lambda k: jax.random.normal(k, (7,), jnp.float64), lambda k: jnp.zeros(()), K(4), 256
    )
    assert abs(float(S[0]) - 1.0) < 4 * float(se[0])


def test_rule_product_and_chain():
    # two linear layers (disjoint parameters): S = S[W1 x] + S[W2] = 2; depth 3 -> 3
    sp2 = lambda k: [_lin((6, 5))(k), _lin((5, 4))(jax.random.fold_in(k, 1))]
    S, se = _S(lambda p, x: x @ p[0] @ p[1], sp2)
    assert abs(S - 2) < 4 * se
    sp3 = lambda k: [_lin((6, 5))(k), _lin((5, 5))(jax.random.fold_in(k, 1)), _lin((5, 4))(jax.random.fold_in(k, 2))]
    S, se = _S(lambda p, x: x @ p[0] @ p[1] @ p[2], sp3)
    assert abs(S - 3) < 4 * se


def test_rule_sum_and_concatenation():
    # f = W1 x (var 1), g = 2 W2 W3 x (var 4, S = 2), gradients uncorrelated
    sp = lambda k: [_lin((6, 4))(k), _lin((6, 4))(jax.random.fold_in(k, 1)), _lin((4, 4))(jax.random.fold_in(k, 2))]
    f = lambda p, x: x @ p[0]
    g = lambda p, x: 2.0 * x @ p[1] @ p[2]
    expected = (1 * 1 + 2 * 4) / (1 + 4)
    S, se = _S(lambda p, x: f(p, x) + g(p, x), sp)
    assert abs(S - expected) < 4 * se
    S, se = _S(lambda p, x: jnp.concatenate([f(p, x), g(p, x)]), sp)  # Prop. 9
    assert abs(S - expected) < 4 * se


def test_invariances():
    sp = lambda k: [_lin((6, 5))(k), _lin((5, 4))(jax.random.fold_in(k, 1))]
    base = lambda p, x: jnp.tanh(x @ p[0]) @ p[1]
    S0, _ = _S(base, sp, draws=256)
    S1, _ = _S(lambda p, x: 7.3 * base(p, x), sp, draws=256)  # normalization by a constant
    assert S1 == pytest.approx(S0, rel=1e-10)
    c = 3.0  # reparameterization g(t) = f(c t), t ~ p / c
    sp_c = lambda k: [a / c for a in sp(k)]
    S2, _ = _S(lambda p, x: base([c * a for a in p], x), sp_c, draws=256)
    assert S2 == pytest.approx(S0, rel=1e-10)


def test_seed001_block_limits():
    S, se = sn.block_sensitivity(0.0, 0.0, width=8, n_tokens=4, draws=8)
    assert S == pytest.approx(0.0, abs=1e-14)  # identity block
    S, se = sn.block_sensitivity(0.0, 1.0, width=8, n_tokens=4, draws=512, activation="linear")
    assert abs(S - 2.0) < 4 * se  # W2 W1 LN(x): two linear layers
