"""Closed-form Gaussian smoothings ``G(m, c) = E_w[f(m + c w)]``, ``w ~ N(0, 1)``.

With them a bivariate expectation ``E[f(h1) g(h2)]`` is a single 1-D integral
(:func:`phasefield.theory.quadrature.expect_2d_conditional`) instead of a 2-D rule whose
node count grows like ``s^2`` — the cost cliff of gelu with ``mlp_layers >= 2`` (issue 13).

gelu, ``gelu(u) = u Phi(u)`` (Phi the standard normal CDF, phi its density), with
``r = sqrt(1 + c^2)``::

    E[Phi(m + c w)]       = Phi(m / r)
    E[w Phi(m + c w)]     = c phi(m / r) / r                      (Stein)
    E[gelu(m + c w)]      = m Phi(m / r) + (c^2 / r) phi(m / r)
    E[gelu'(m + c w)]     = d/dm of the above = Phi(m / r) + (m / r^3) phi(m / r)
"""
from __future__ import annotations

import math

import jax.numpy as jnp
from jax.scipy.special import erfc

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)


def _cdf(x):
    return 0.5 * erfc(-x * _INV_SQRT_2)      # accurate in the lower tail too


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


SMOOTHED = {"gelu": (gelu, dgelu)}    # name -> (E phi, E phi') as functions of (m, c)
