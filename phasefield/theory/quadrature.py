"""Gaussian expectations of an activation, by dense trapezoid rules (docs/theory.md §4).

Everything here concerns pre-activations with variance ``s**2`` and correlation ``rho``:

    E1(s)        = E[f(s z)],                       z ~ N(0, 1)
    E2(s, rho)   = E[f(h1) g(h2)],  (h1, h2) ~ N(0, s^2 [[1, rho], [rho, 1]])

Why a trapezoid rule: for analytic integrands with Gaussian decay the trapezoid rule
converges geometrically, ``err ~ exp(-2 pi d / h)`` with ``d`` the distance of the nearest
complex singularity. ``tanh(s z)`` has poles at ``z = i pi / (2 s)``, so the spacing must
shrink like ``1/s``; Gauss–Hermite cannot do that and fails at large ``s`` (docs/theory.md §4).
The 2-D rule works in rotated coordinates ``h1 = s (a u + b v)``, ``h2 = s (a u - b v)``
with ``a = cos(theta/2)``, ``b = sin(theta/2)``, ``rho = cos(theta)`` and independent
``u, v``; each direction gets its own spacing ``min(h_max, c / (s a|b))``, so the rule stays
accurate as ``rho -> ±1`` where the 2-D density degenerates to a ridge.

Two implementations:
* :func:`expect_2d` / :func:`expect_1d` — JAX, static grid size, used to build the tables
  of :mod:`phasefield.theory.mlp`;
* :func:`reference_2d` / :func:`reference_1d` — NumPy, grid sized from concrete values
  with a finer spacing constant; the dense reference the tests and benchmarks use.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

R_LOCAL = 19.2  # |f(h)| < 1e-16 beyond (localized integrands: tanh - erf, sech^2)
N_LOCAL = 129  # local axis: 64 spacings of C_TABLE / scale = R_LOCAL / scale
Z_MAX = 9.0  # |z| range; the Gaussian weight there is exp(-40.5) ~ 3e-18
H_MAX = 0.5  # coarsest spacing (Gaussian alone: error ~ exp(-2 pi^2 / h^2))
C_TABLE = 0.3  # spacing constant of the JAX tables: h = C / (s a)
C_REFERENCE = 0.2  # spacing constant of the dense reference
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def grid_size(s_max: float, c: float = C_TABLE) -> int:
    """Static number of trapezoid nodes per direction resolving scale ``s_max``."""
    need = 2.0 * Z_MAX * max(float(s_max), 1e-3) / c + 1.0
    need = max(need, 2.0 * Z_MAX / H_MAX + 1.0)
    return next(b for b in _BUCKETS if b >= need) if need <= _BUCKETS[-1] else int(256 * math.ceil(need / 256))


# static grid sizes (few distinct sizes -> few compilations; steps of ~1.25x)
_BUCKETS = (48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)


def trapezoid_axis(scale, n: int, c: float, fold: bool = False, local: bool = False):
    """Nodes and weights (including the Gaussian density) of one trapezoid axis.

    ``fold``: the integrand is even along this axis, so keep the nodes >= 0 of the same
    symmetric rule and double the weights of those > 0 (the same sum, half the work).
    ``local``: the integrand vanishes (below rounding) where ``|scale * x| > R_LOCAL``, so
    the axis need not cover ``[-Z_MAX, Z_MAX]``: ``N_LOCAL`` nodes at the spacing
    ``min(H_MAX, c / scale)`` cover ``min(32, R_LOCAL / scale)`` whatever the scale.
    """
    h = jnp.minimum(H_MAX, c / jnp.maximum(scale, 1e-300))
    if not local:
        h = jnp.maximum(h, 2.0 * Z_MAX / (n - 1))  # never narrower than the grid covers
    # the rule's value does not depend on its spacing (to its accuracy): keep the spacing
    # out of autodiff, so derivatives flow through the integrand only
    h = jax.lax.stop_gradient(h)
    j = np.arange(n) - 0.5 * (n - 1)
    factor = np.ones(n)
    if fold:
        j = j[n // 2 :]
        factor = np.where(j == 0, 1.0, 2.0)
    x = jnp.asarray(j, jnp.result_type(float)) * h
    w = jnp.exp(-0.5 * x * x) * h * _INV_SQRT_2PI * factor
    return x, w


def expect_1d(f, s, n: int = 2049):
    """E[f(s z)], z ~ N(0,1): trapezoid on a fixed grid over [-Z_MAX, Z_MAX]."""
    dt = jnp.result_type(float)
    z = jnp.linspace(-Z_MAX, Z_MAX, n, dtype=dt)
    h = 2.0 * Z_MAX / (n - 1)
    w = jnp.exp(-0.5 * z * z) * h * _INV_SQRT_2PI
    return jnp.sum(w * f(s * z))


def expect_1d_local(f, s, n: int = 4 * (N_LOCAL - 1) + 1):
    """E[f(s z)] for f below rounding beyond ``|s z| = R_LOCAL`` (fixed size at any s;
    a 4x finer spacing than the tables, as 1-D nodes cost nothing)."""
    z, w = trapezoid_axis(s, n, C_TABLE * (N_LOCAL - 1) / (n - 1), local=True)
    return jnp.sum(w * f(s * z))


def expect_2d(pairs, s, theta, n: int, n_v: int | None = None, parity: bool = False, local: bool = False):
    """E[f(h1) g(h2)] for each (f, g) in ``pairs`` at correlation cos(theta).

    ``theta`` is a scalar in [0, pi]; ``n`` (static) nodes along u, ``n_v`` along v
    (default ``n``; for theta <= pi/2, b <= sin(pi/4) so ``n_v ~ 0.71 n`` suffices).
    Symmetries halve the work exactly (same nodes, folded weights): when every pair has
    ``f is g`` the integrand is even in v (v -> -v swaps h1 and h2); with ``parity`` (each
    function odd or even) it is also even in u ((h1, h2) -> (-h2, -h1)). ``local``: every
    product vanishes unless ``|h1|, |h2| <= R_LOCAL`` (see :func:`trapezoid_axis`; use ``N_LOCAL``
    nodes). Returns a tuple.
    """
    a = jnp.cos(0.5 * theta)
    b = jnp.sin(0.5 * theta)
    same = all(f is g for f, g in pairs)
    u, wu = trapezoid_axis(s * a, n, C_TABLE, fold=parity, local=local)
    v, wv = trapezoid_axis(s * b, n if n_v is None else n_v, C_TABLE, fold=same, local=local)
    x1 = s * (a * u[:, None] + b * v[None, :])
    x2 = s * (a * u[:, None] - b * v[None, :])
    out = []
    cache = {}
    for f, g in pairs:
        f1 = cache.setdefault((id(f), 1), f(x1))
        g2 = cache.setdefault((id(g), 2), g(x2))
        out.append(wu @ (f1 * g2) @ wv)
    return tuple(out)


# ---- NumPy dense reference -------------------------------------------------------------


def _np_axis(scale: float, c: float):
    h = min(H_MAX, c / max(scale, 1e-300))
    m = int(math.ceil(Z_MAX / h))
    x = np.arange(-m, m + 1) * h
    return x, np.exp(-0.5 * x * x) * h * _INV_SQRT_2PI


def reference_1d(f, s: float, c: float = C_REFERENCE) -> float:
    """Dense reference for E[f(s z)] (f a NumPy-compatible function)."""
    z, w = _np_axis(s, c)
    return float(np.sum(w * np.asarray(f(s * z))))


def reference_2d(f, g, s: float, rho: float, c: float = C_REFERENCE) -> float:
    """Dense reference for E[f(h1) g(h2)], (h1, h2) ~ N(0, s^2 [[1, rho], [rho, 1]])."""
    theta = math.acos(min(1.0, max(-1.0, float(rho))))
    a, b = math.cos(theta / 2), math.sin(theta / 2)
    u, wu = _np_axis(s * a, c)
    v, wv = _np_axis(s * b, c)
    x1 = s * (a * u[:, None] + b * v[None, :])
    x2 = s * (a * u[:, None] - b * v[None, :])
    return float(wu @ (np.asarray(f(x1)) * np.asarray(g(x2))) @ wv)


# ---- conditional (one-dimensional) rule for activations with a closed Gaussian smoothing ----


def expect_2d_conditional(pairs, s, rho, n: int, local: bool = False):
    """E[f(h1) g(h2)] for each (f, G) in ``pairs`` at correlation ``rho``, by one 1-D rule.

    Conditioning on ``h1 = s x``: ``h2 | h1 ~ N(rho h1, c^2)``, ``c = s sqrt(1 - rho^2)``, so
    ``E[f(h1) g(h2)] = E_x[f(s x) G(rho s x, c)]`` with ``G(m, c) = E_w[g(m + c w)]`` given
    in closed form by the caller (:mod:`phasefield.theory.smoothed`). The x rule is the
    trapezoid axis of :func:`expect_2d` at scale ``s`` (``n`` static nodes); G is smooth on
    the scale ``sqrt(1 + c^2) >= 1`` so it needs no finer spacing. ``local``: every f
    vanishes beyond ``|h1| = R_LOCAL`` (see :func:`trapezoid_axis`). Returns a tuple.
    """
    x, w = trapezoid_axis(s, n, C_TABLE, local=local)
    c = s * jnp.sqrt(jnp.maximum(1.0 - rho * rho, 0.0))
    h1 = s * x
    m = rho * h1
    cache = {}
    out = []
    for f, big_g in pairs:
        f1 = cache.setdefault(id(f), f(h1))
        out.append(jnp.sum(w * f1 * big_g(m, c)))
    return tuple(out)
