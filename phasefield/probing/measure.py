"""The measurements of one initialization, and of many (``lax.map`` over keys, vmapped
``chunk`` at a time so that a large model's parameters exist for ``chunk`` inits at once).

For one draw of the parameters, from the tokens ``x0`` entering the first block:

* ``q_data``, ``rho_data`` [L + 1]: squared norm per component and mean cosine after each
  block, from the user's inputs (block 0: the input);
* ``q_sym``, ``rho_sym`` [L + 1]: the same from permutation-symmetric tokens at the start
  geometry (q0, rho0) (default: the input's own, rho0 clipped at 0);
* ``gap`` [L + 1]: ``1 - rho`` after each block from symmetric tokens at (q0, 1 - eps):
  nearby tokens, whose per-block log ratio is the angle growth (angle rate) of that block;
* ``grad`` [L + 1]: ``|d(u . x_L)/d x_l|^2 / |x0|`` (``|x0|`` = number of entries), the
  gradient at block l's output (l = 0: the first block's input) of a random cotangent
  ``u ~ N(0, I)`` at the last block's output, from the user's inputs: one vector-Jacobian
  product, with zero perturbations added to every block's output (Flax blocks; a stack
  callable gives only l = 0 and L). ``grad[0] = |J^T u|^2 / |x0|`` is the gradient growth
  of the whole stack, ``grad[L] = |u|^2 / |x0|`` (about 1);
* ``finite``: i for the first block output ``outs[i]`` that is not finite (L: none), in any
  of the three forward passes; ``grad_finite``: whether the input's gradient is finite.

A causal model (``causal=True``) adds the per-position statistics of :mod:`.positions`, from
the same passes: ``q_pos``, ``rho_pos`` [n] after the last block from the symmetric start
(the theory's input), ``q_pos_data``, ``rho_pos_data`` [n] from the user's inputs,
``gap_last`` [L + 1] (the last token's gap after each block, from the nearby tokens) and
``grad_last`` [L + 1] (the last token's squared gradient per component at each block's
output, from the same vector-Jacobian product; ``grad_last[L]`` is the cotangent's).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import positions
from .geometry import q_rho_gap, symmetric_tokens


def _profile(x0, outs):
    xs = jnp.concatenate([x0[None], outs])
    return jax.vmap(q_rho_gap)(xs)


def _first_bad(*arrays):
    bad = jnp.zeros(arrays[0].shape[0], bool)
    for a in arrays:
        bad = bad | ~jnp.all(jnp.isfinite(a.reshape(a.shape[0], -1)), axis=1)
    return jnp.where(jnp.any(bad), jnp.argmax(bad), bad.shape[0])


def one(init_fn, run, key, eps, start=None, gradient=True, with_deltas=True, causal=False):
    """The measurements (module docstring) of the initialization drawn with ``key``."""
    kp, ks, kn, ku = jax.random.split(key, 4)
    params = init_fn(kp)
    x0, outs = run(params)
    x0 = jax.lax.stop_gradient(x0)
    q_d, rho_d, _ = _profile(x0, outs)
    q0, rho0 = (q_d[0], rho_d[0]) if start is None else start
    rho0 = jnp.clip(rho0, 0.0, 1.0)  # a shared Gaussian direction cannot make rho < 0
    dt = x0.dtype
    xs = symmetric_tokens(ks, x0.shape, q0, rho0, dt)
    _, outs_s = run(params, xs)
    q_s, rho_s, _ = _profile(xs, outs_s)
    xn = symmetric_tokens(kn, x0.shape, q0, 1.0 - eps, dt)
    _, outs_n = run(params, xn)
    _, _, gap = _profile(xn, outs_n)
    res = dict(q_data=q_d, rho_data=rho_d, q_sym=q_s, rho_sym=rho_s, gap=gap)
    if causal:
        res["q_pos"], res["rho_pos"] = positions.q_rho_pos(outs_s[-1])
        res["q_pos_data"], res["rho_pos_data"] = positions.q_rho_pos(outs[-1])
        res["gap_last"] = jax.vmap(positions.gap_last)(jnp.concatenate([xn[None], outs_n]))
    L = outs.shape[0]
    if gradient:
        u = jax.random.normal(ku, outs.shape[1:], outs.dtype)
        size = x0.size
        if with_deltas:
            f = lambda x, dl: run(params, x, dl)[1][-1]
            _, vjp = jax.vjp(f, x0, jnp.zeros_like(outs))
            g0, gd = vjp(u)
            g = jnp.concatenate([g0[None], gd])
        else:
            _, vjp = jax.vjp(lambda x: run(params, x)[1][-1], x0)
            (g0,) = vjp(u)
            g = jnp.concatenate([g0[None], jnp.full((L - 1,) + u.shape, jnp.nan, u.dtype), u[None]])
        res["grad"] = jnp.sum(jnp.square(g).reshape(L + 1, -1), axis=1) / size
        if causal:
            res["grad_last"] = jax.vmap(positions.sq_last)(g)
        res["grad_finite"] = jnp.all(jnp.isfinite(g0))
    res["finite"] = _first_bad(outs, outs_s, outs_n)
    return res


class Steps:
    """``progress(done, total)`` counted in initializations measured; ``steps(n)`` adds
    ``n``. One object follows a whole run (probe, fix search, check)."""

    def __init__(self, progress, total: int):
        self.progress, self.total, self.done = progress, int(total), 0

    def __call__(self, n: int = 1) -> None:
        self.done = min(self.done + int(n), self.total)
        self.progress(self.done, self.total)


def many(init_fn, run, keys, eps, start=None, gradient=True, chunk=1, with_deltas=True, advance=None, causal=False):
    """:func:`one` for every key: a dict of arrays with a leading init axis. ``advance(n)``,
    when given, is called after every ``chunk`` initializations (one compiled program for
    every chunk: the keys are padded to a whole number of chunks and the padding dropped);
    ``causal``: the per-position statistics too (module docstring)."""
    f = lambda k: one(init_fn, run, k, eps, start, gradient, with_deltas, causal)
    if advance is None:
        return jax.jit(lambda ks: jax.lax.map(f, ks, batch_size=chunk))(keys)
    n, chunk = len(keys), max(1, min(int(chunk), len(keys)))
    g = jax.jit(jax.vmap(f))
    pad = jnp.concatenate([keys, jnp.repeat(keys[-1:], -n % chunk, axis=0)])
    parts = []
    for i in range(0, n, chunk):
        parts.append(jax.device_get(g(pad[i : i + chunk])))
        advance(min(chunk, n - i))
    return jax.tree.map(lambda *a: jnp.concatenate(a)[:n], *parts)
