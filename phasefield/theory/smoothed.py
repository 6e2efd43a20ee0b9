"""Closed forms that keep the MLP integrals' cost flat in the pre-activation scale s
(gelu with ``mlp_layers 2`` and tanh at sigma_w = 10, 100 would otherwise need 2-D trapezoid
tables whose node count grows like s^2).

* gelu: the bivariate expectations ``E[gelu gelu]``, ``E[gelu' gelu']`` in closed form
  (:func:`gelu_pair`), so gelu joins erf/relu/linear among the table-free activations;
* gelu's Gaussian smoothings ``G(m, c) = E_w[f(m + c w)]`` (:func:`gelu`, :func:`dgelu`),
  which make ``E[f(h1) f(h2)]`` one 1-D integral
  (:func:`phasefield.theory.quadrature.expect_2d_conditional`): the independent route the
  tests check :func:`gelu_pair` with. With ``gelu(u) = u Phi(u)``, ``r = sqrt(1 + c^2)``::

      E[Phi(m + c w)]       = Phi(m / r)
      E[w Phi(m + c w)]     = c phi(m / r) / r                      (Stein)
      E[gelu(m + c w)]      = m Phi(m / r) + (c^2 / r) phi(m / r)
      E[gelu'(m + c w)]     = d/dm of the above = Phi(m / r) + (m / r^3) phi(m / r)

* tanh: ``tanh = erf(K h) + rest(h)``, the erf part in closed form, ``rest`` and tanh'
  localized (fixed-size rules at any s).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax.scipy.special import erf, erfc

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)


def _cdf(x):
    return 0.5 * erfc(-x * _INV_SQRT_2)  # accurate in the lower tail too


def _pdf(x):
    return _INV_SQRT_2PI * jnp.exp(-0.5 * x * x)


def gelu(m, c):
    """E_w[gelu(m + c w)]."""
    r = jnp.sqrt(1.0 + c * c)
    t = m / r
    return m * _cdf(t) + (c * c / r) * _pdf(t)


def dgelu(m, c):
    """E_w[gelu'(m + c w)]."""
    r = jnp.sqrt(1.0 + c * c)
    t = m / r
    return _cdf(t) + (t / (r * r)) * _pdf(t)


# ---- tanh: a closed-form erf part plus a localized remainder ------------------------------
#
# tanh(h) = erf(KAPPA h) + rest(h), KAPPA = sqrt(pi) / 2 (equal slopes at 0). Both tend to
# sign(h) (tanh like e^{-2|h|}, erf faster), so rest(h) and tanh'(h) = sech^2(h) are below
# 1e-16 beyond |h| = quadrature.R_LOCAL: their Gaussian integrals need a fixed number of
# nodes at any scale s (quadrature ``local`` rules), while the erf parts are closed forms:
#
#     E[erf(K h1) erf(K h2)] = (2/pi) arcsin(2 K^2 s^2 rho / (1 + 2 K^2 s^2))
#     E_w[erf(K (m + c w))]  = erf(K m / sqrt(1 + 2 K^2 c^2))
#     E[tanh tanh] = E[erf erf] + 2 E[erf(K h1) rest(h2)] + E[rest rest]

KAPPA = math.sqrt(math.pi) / 2.0
SPLIT = ("tanh",)


def tanh_rest(x):
    """tanh(x) - erf(KAPPA x) (smooth, |.| < 1e-16 beyond |x| = 19.2)."""
    return jnp.tanh(x) - erf(KAPPA * x)


def erf_pair(s2, rho):
    """E[erf(K h1) erf(K h2)], (h1, h2) ~ N(0, s2 [[1, rho], [rho, 1]])."""
    k2 = 2.0 * KAPPA * KAPPA * s2
    return (2.0 / math.pi) * jnp.arcsin(k2 * rho / (1.0 + k2))


def erf_given(m, c):
    """E_w[erf(K (m + c w))]."""
    return erf(KAPPA * m / jnp.sqrt(1.0 + 2.0 * KAPPA * KAPPA * c * c))


# ---- gelu: the bivariate expectations in closed form ---------------------------------------
#
# gelu(h) = h Phi(h) = E_Z[h 1{h - Z >= 0}], Z ~ N(0, 1) independent. With U_i = h_i - Z_i
# ((h1, h2) of variance a = s^2, covariance k; U of variance v = a + 1, covariance k) and the
# regression h = A U + e (A = Sigma_h Sigma_U^-1 = [[al, be], [be, al]], e independent of U):
#
#     E[gelu(h1) gelu(h2)] = Cov(e)_12 P + v (2 al be m_d + (al^2 + be^2) m_o)
#
# with the orthant moments of the standardized U (correlation r = k / v):
#     P   = 1/4 + arcsin(r) / (2 pi)                 = P(U1 >= 0, U2 >= 0)
#     m_d = P + r sqrt(1 - r^2) / (2 pi)             = E[X1^2 1{X >= 0}]
#     m_o = r P + sqrt(1 - r^2) / (2 pi)             = E[X1 X2 1{X >= 0}]
# |r| <= a / (a + 1) < 1, so nothing is singular, rho = +-1 included.


def gelu_pair(s2, rho):
    """(E[gelu(h1) gelu(h2)], E[gelu'(h1) gelu'(h2)]), (h1, h2) ~ N(0, s2 [[1, rho], [rho, 1]])."""
    # written against cancellation: a - k is exact near k = a (Sterbenz), so are
    # v^2 - k^2 = (1 + (a - k)) (v + k), a v - k^2 = (a - k)(a + k) + a, and
    # P = arccos(-r) / (2 pi) = atan2(sqrt(1 - r^2), -r) / (2 pi) near r = -1
    a = jnp.asarray(s2)
    k = a * rho
    v = a + 1.0
    amk = a - k
    vmk, vpk = 1.0 + amk, v + k
    det = vmk * vpk
    al = (amk * (a + k) + a) / det
    be = k / det
    r = k / v
    root = jnp.sqrt(det) / v
    p = jnp.arctan2(root, -r) / (2.0 * math.pi)
    m_d = p + r * root / (2.0 * math.pi)
    m_o = r * p + root / (2.0 * math.pi)
    cov_e = k / det  # k - al k - be a
    e_pp = cov_e * p + v * (2.0 * al * be * m_d + (al * al + be * be) * m_o)
    # gelu' = Phi(h) + h phi(h): E[Phi Phi] = P; Gaussian tilts give the other two terms
    #   E[Phi(h1) h2 phi(h2)] = k / (2 pi v sqrt(det)),  E[h1 phi(h1) h2 phi(h2)] = k / (2 pi det^1.5)
    sq = jnp.sqrt(det)
    e_dd = p + (k / (math.pi * v * sq)) + k / (2.0 * math.pi * det * sq)
    return e_pp, e_dd
