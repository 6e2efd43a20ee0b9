"""Softmax-derivative (query/key path) correction of the attention backward map, against
autodiff of one finite-width attention layer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phasefield import HParams
from phasefield._runtime import optimized_jit
from phasefield.layers import paper
from phasefield.layers.paper import gram
from phasefield.theory import attention
from phasefield.theory.attention import softmax

pytestmark = pytest.mark.usefixtures("float64")

N, D, SA, RHO, A, B = 6, 256, 2.0, 0.3, 1.0, 0.5


def _draw(key):
    """|gamma_m|^2/d and gamma_m.gamma_m'/d of the full VJP of softmax(xWq (xWk)^T/sqrt d) x Wv
    for normalized tokens with cosine RHO and output gradients with Gram A I + B 11^T."""
    k1, k2, k3, k4, k5, k6 = jax.random.split(key, 6)
    qm, _ = jnp.linalg.qr(jax.random.normal(k1, (D, N + 1)))
    x = jnp.sqrt(D) * (jnp.sqrt(RHO) * qm[:, :1].T + jnp.sqrt(1 - RHO) * qm[:, 1:].T)
    wq = jax.random.normal(k2, (D, D)) * jnp.sqrt(SA / D)
    wk = jax.random.normal(k3, (D, D)) * jnp.sqrt(SA / D)
    wv = jax.random.normal(k4, (D, D)) / jnp.sqrt(D)
    g = jnp.sqrt(B) * jax.random.normal(k5, (1, D)) + jnp.sqrt(A) * jax.random.normal(k6, (N, D))

    def f(x):
        att = jax.nn.softmax((x @ wq) @ (x @ wk).T / jnp.sqrt(D), -1)
        return att @ (x @ wv)

    _, vjp = jax.vjp(f, x)
    (gam,) = vjp(g)
    gin = gam @ gam.T / D
    off = ~jnp.eye(N, dtype=bool)
    return jnp.stack([jnp.mean(jnp.diagonal(gin)), jnp.sum(jnp.where(off, gin, 0)) / (N * (N - 1))])


def _jit(fn):
    """``fn()`` as one compiled program (the maps called inside it with concrete arguments,
    as a direct call), not op by op (one tiny program per eager operation)."""
    return jax.jit(fn)()


def test_correction_matches_autodiff_of_one_layer():
    keys = jax.random.split(jax.random.key(11), 600)
    # compiled with run-time optimisation (optimized_jit: the suite's fast -O0 compiles
    # made the 600 draws ~3x slower)
    r = np.asarray(optimized_jit(lambda ks: jax.lax.map(_draw, ks, batch_size=100))(keys))
    m, se = r.mean(0), r.std(0, ddof=1) / np.sqrt(len(r))
    maps = _jit(
        lambda: (
            attention.backward(SA, N, 1.0, 1.0, RHO, A, B, "exact"),
            softmax.softmax_term(SA, N, 1.0, 1.0, RHO, A, B),
            attention.backward(SA, N, 1.0, 1.0, RHO, A, B, "exact", softmax_correction=True),
        )
    )
    (dv, ov), (ds, os_), (dc, oc) = ((float(a), float(b)) for a, b in maps)
    assert (dc, oc) == pytest.approx((dv + ds, ov + os_), rel=1e-14)  # the switch adds the term
    assert abs(m[0] - (dv + ds)) < 4 * se[0] + 0.02 * (dv + ds)  # O(1/d) allowance
    assert abs(m[1] - (ov + os_)) < 4 * se[1] + 0.02
    assert abs(m[0] - dv) > 20 * se[0]  # values path alone fails


def test_gram_correction_matches_symmetric_formula():
    def both_terms():
        r = gram.cosines(gram.symmetric_gram(N, 1.0, RHO))
        g = gram.symmetric_gram(N, A + B, B)
        corr = softmax.gram_softmax_term(SA, 1.0, r, g, gram.causal_mask(N, False), 16384)
        return corr, softmax.softmax_term(SA, N, 1.0, 1.0, RHO, A, B)

    corr, (ds, os_) = _jit(both_terms)
    corr, ds, os_ = np.asarray(corr), float(ds), float(os_)
    off = ~np.eye(N, dtype=bool)
    assert abs(float(np.mean(np.diagonal(corr))) - ds) < 0.02 * abs(ds)
    assert abs(float(np.mean(corr[off])) - os_) < 0.1 * abs(os_)


def test_correction_vanishes_at_collapse():
    hp = HParams(sigma_w=2.0, sigma_a=2.0, alpha_a=0.6, alpha_m=0.7, n_tokens=8, depth=4)
    d, o = _jit(lambda: softmax.softmax_term(hp.sigma_a, hp.n_tokens, hp.sigma_v, 1.0, 1.0, 1.0, 0.3))
    assert float(d) == 0.0 and float(o) == 0.0
    lg = paper.gradient_exponent(hp.replace(softmax_correction=True), num_layers=4)
    assert abs(float(lg) - float(paper.gradient_exponent(hp, num_layers=4))) < 1e-12
