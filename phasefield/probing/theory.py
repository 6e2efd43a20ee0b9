"""The theory's curves beside a probe of a model built from phasefield's blocks (a layer
of :mod:`phasefield.layers`, e.g. a preset), in float64:

* ``q``, ``rho`` [L + 1]: the mean-field trajectory from (q0, rho0);
* ``gap`` [L + 1]: ``1 - rho`` along the trajectory from (q0, 1 - eps), so that
  ``angle_l = log(gap_l / gap_{l-1})`` is the angle growth of nearby tokens per block;
* ``log_grad`` [L + 1]: ``log(a + b)`` of the gradient Gram at block l's output (l = 0:
  the input) after the backward maps of blocks L..l+1 from ``G = I`` at the last block's
  output (docs/theory.md §7), along the trajectory from the gradient's start (the user's input
  geometry): ``log_grad[0] = L lambda_g(L)``, ``log_grad[L] = 0``.

A causal block has no (q, p) curves: :func:`causal` gives its per-position results.

The backward curve is one jitted backward map applied along the trajectory (the tests
check it against :func:`phasefield.layers.gradient_exponent` of the sub-stack from block l).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import layers
from ..layers.depth import _backward  # one program per block structure: new numbers compile nothing
from ..layers.state import Grad, Kernel


def curves(block, n_tokens: int, depth: int, q0: float, rho0: float, eps: float, grad_start=None) -> dict:
    """The curves (module docstring); the gradient's trajectory starts at ``grad_start`` =
    (q, rho) (default (q0, rho0))."""
    with jax.enable_x64(True):
        blk, ctx = layers.prepare(block, n_tokens)
        q, p = (np.asarray(a) for a in layers.trajectory(block, q0, rho0, n_tokens=n_tokens, depth=depth))
        qn, pn = (np.asarray(a) for a in layers.trajectory(block, q0, 1.0 - eps, n_tokens=n_tokens, depth=depth))
        gq, grho = (q0, rho0) if grad_start is None else grad_start
        qg, pg = (np.asarray(a) for a in layers.trajectory(block, gq, grho, n_tokens=n_tokens, depth=depth))
        a, b, total = 1.0, 0.0, 0.0
        log_grad = [0.0]
        for j in range(depth - 1, -1, -1):
            g = _backward(
                blk, Kernel(jnp.float64(qg[j]), jnp.float64(pg[j])), Grad(jnp.float64(a), jnp.float64(b)), ctx
            )
            s = float(g.a + g.b)
            a, b, total = float(g.a) / s, float(g.b) / s, total + np.log(s)
            log_grad.append(total)
        log_grad = log_grad[::-1]
    gap = 1.0 - pn / qn
    return dict(
        q=q, rho=p / q, gap=gap, angle=np.concatenate([[np.nan], np.diff(np.log(gap))]), log_grad=np.asarray(log_grad)
    )


def causal(block, n_tokens: int, depth: int, q0: float, rho0: float, grad_start=None) -> dict:
    """:func:`phasefield.layers.causal_rates` of ``block`` with every attention masked, from
    (q0, rho0), as NumPy float64: ``q_L_pos``, ``rho_L_pos`` [n], ``angle_rate_last``,
    ``lambda_g_last``; the gradient's rate from ``grad_start`` = (q, rho) (the inputs'
    geometry, where the probe measures the gradient; default (q0, rho0))."""
    out = {k: np.asarray(v, float) for k, v in layers.causal_rates(block, n_tokens, depth, q0, rho0, True).items()}
    gq, grho = (q0, rho0) if grad_start is None else (float(grad_start[0]), min(max(float(grad_start[1]), 0.0), 1.0))
    if (gq, grho) != (q0, rho0):
        g = layers.causal_rates(block, n_tokens, depth, gq, grho, True)
        out["lambda_g_last"] = np.asarray(g["lambda_g_last"], float)
    return out
