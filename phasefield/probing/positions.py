"""Per-position statistics of a causal model's tokens and the last token's rates: the probe's
estimates of :func:`phasefield.layers.causal_rates` (docs/theory.md, "Causal stacks"), read
from the block outputs the probe captures (:mod:`.capture`) and its gradient pass.

Tokens are ``[..., n, d]``: n positions of d components, leading axes a batch of sequences
(averaged over). Per initialization:

* ``q_pos`` [n]: token i's squared norm per component ``|x_i|^2 / d``;
* ``rho_pos`` [n]: token i's mean cosine with the tokens j < i (position 0 has none: 0);
* ``gap_last``: the last token's ``1 - mean_j cos(x_last, x_j)`` over the earlier tokens,
  read as ``mean_j |x^_last - x^_j|^2 / 2`` of the unit tokens (no cancellation near
  collapse);
* ``sq_last``: the last token's squared norm per component of a gradient (or cotangent).

Over initializations (:func:`last_rates`): ``angle_rate_last = (1/L) log(E gap_L / E gap_0)``
of nearby tokens and ``lambda_g_last = (1/L) log(E g_0 / E u_L)`` (``g_0`` the last input
token's squared gradient, ``u_L`` the last output token's squared cotangent, ``u ~ N(0, I)``
at every output token), ratios of means with delta-method standard errors, as
:func:`phasefield.simulate.causal_positions` measures them on the block's own network.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

QUANTITIES = ("q_L_pos", "rho_L_pos", "angle_rate_last", "lambda_g_last")


def _rows(x):
    return x.reshape((-1,) + x.shape[-2:])


def _unit(x):
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def q_rho_pos(x):
    """(q [n], rho [n]) of tokens ``[..., n, d]`` (module docstring), averaged over the batch."""
    x = _rows(x)
    n, d = x.shape[-2:]
    xh = _unit(x)
    cos = jnp.einsum("bid,bjd->bij", xh, xh)
    lower = np.tril(np.ones((n, n)), -1)
    counts = np.maximum(lower.sum(-1), 1.0)
    rho = jnp.sum(cos * lower, -1) / counts
    return jnp.mean(jnp.sum(jnp.square(x), -1) / d, 0), jnp.mean(rho, 0)


def gap_last(x):
    """The last token's gap to the earlier tokens (module docstring), averaged over the batch."""
    xh = _unit(_rows(x))
    return jnp.mean(0.5 * jnp.mean(jnp.sum(jnp.square(xh[:, -1:] - xh[:, :-1]), -1), -1))


def sq_last(g):
    """The last token's squared norm per component of ``g`` ``[..., n, d]``, averaged over the batch."""
    g = _rows(g)
    return jnp.mean(jnp.sum(jnp.square(g[:, -1]), -1)) / g.shape[-1]


def log_ratio_of_means(a, b, scale: float = 1.0) -> tuple[float, float]:
    """``scale * log(mean a / mean b)`` over paired draws and its delta-method standard error
    (NaN where a mean is not positive)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    n = a.size
    ma, mb = a.mean(), b.mean()
    if not (ma > 0 and mb > 0 and np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return float("nan"), float("nan")
    v = a / ma - b / mb
    se = float(np.std(v, ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    return float(scale * math.log(ma / mb)), abs(scale) * se


def last_rates(gap0, gapL, g0, uL, L: int) -> dict:
    """``angle_rate_last``, ``lambda_g_last`` and their ``_se`` from per-init arrays."""
    la, la_se = log_ratio_of_means(gapL, gap0, 1.0 / L)
    lg, lg_se = log_ratio_of_means(g0, uL, 1.0 / L)
    return dict(angle_rate_last=la, angle_rate_last_se=la_se, lambda_g_last=lg, lambda_g_last_se=lg_se)
