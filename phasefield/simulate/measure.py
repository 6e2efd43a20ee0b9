"""Finite-width measurements on random stacks of any block, each with a standard error over
independent draws. One simulator: every measurement takes a block (a spec string
``NAME:key=value,...``, a ``(name, keywords)`` pair or a :mod:`phasefield.layers` block,
:func:`phasefield.simulate.stack.resolve`; the paper's block is ``"paper:sigma_w=2,..."`` or
``layers.presets.paper(hp)``) and runs the block's own network
(:mod:`phasefield.simulate.stack`), with the keyword options

    n_tokens  number of tokens n
    depth     number of blocks L
    width     embedding width d
    draws     number of independent draws (weights and input tokens)
    causal    causal attention mask (the fixed-point protocol)
    dtype     simulation dtype (float32 by default)
    seed      integer seed of the draw keys (fixed seed -> reproducible numbers)
    weights   "lazy" (default: lazily sampled linear maps, O(n^2 d) per block, exact in
              distribution) or "dense" (every d x d matrix drawn; the reference)

Two protocols (docs/simulation.md):

* the fixed-point protocol of the paper (docs/theory.md §6, §7): :func:`transients`,
  :func:`token_geometry`, :func:`group_cosines` from simplex / two-group tokens,
  :func:`angle_exponent` (one block from nearby simplex tokens at the collapsed fixed point
  q*, 1 - rho read as u/q in ``dtype``), :func:`gradient_exponent` (identical tokens of
  squared norm q*), both in :func:`fixed_point_exponents`;
* the finite-depth protocol of any block's theory (:func:`phasefield.layers.finite_depth`):
  :func:`rates` (``angle_rate, lambda_g_input, lambda_g_collapse, lambda_a, rho_L,
  q_L`` from (q0, rho0); its ``lambda_a`` reads 1 - rho in float64 through
  :func:`phasefield.layers.measure.near_gap`).

The ``*_draws`` kernels underneath are pure jit-able functions of ``(block, key, ...)``;
:mod:`phasefield.simulate.sweep` vmaps them over points (sharing the weight draws between
points: common random numbers).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from .. import driver, grid, layers
from .._runtime import optimized_jit
from ..layers import measure as M
from ..layers.weights import check_weights
from .stack import (
    DEFAULT_WEIGHTS,
    block_forward,
    block_of,
    cast,
    collapsed_tokens,
    simplex_tokens,
    stack_forward,
    two_group_tokens,
)

DEFAULT_EPS = 1e-3  # 1 - rho of the fixed-point protocol's nearby tokens (float32 network)
GAP_EPS = 1e-4  # 1 - rho of the finite-depth protocol's nearby tokens (float64 network)
QUANTITIES = ("angle_rate", "lambda_g_input", "lambda_g_collapse", "lambda_a", "rho_L", "q_L")
# bytes of live weights and residuals per draw batch of the gradient kernels (memory-bound on
# a CPU: smaller batches measured faster at widths 256 and 512); on an accelerator
MEMORY_BUDGET = 2.5e8
GPU_MEMORY_BUDGET = 4e9


# ---------------------------------------------------------------- per-draw statistics
def token_stats(x):
    """(q, p, u) of one token matrix ``[n, d]``: mean squared norm / d, mean off-diagonal
    dot product / d, and ``u = q - p`` computed stably from centred tokens."""
    n, d = x.shape[-2:]
    sq = jnp.sum(jnp.square(x), axis=-1)
    q = jnp.mean(sq, axis=-1) / d
    xc = x - jnp.mean(x, axis=-2, keepdims=True)
    u = jnp.sum(jnp.square(xc), axis=(-2, -1)) / ((n - 1) * d)
    return q, q - u, u


def cosines(x):
    """Pairwise cosines ``[n(n-1)/2]`` (upper triangle) of tokens ``[n, d]``."""
    n = x.shape[-2]
    xh = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    c = xh @ xh.T
    i, j = np.triu_indices(n, 1)
    return c[i, j]


def group_stats(x):
    """Mean intra-group and inter-group cosine for two groups (first n//2 tokens, rest)."""
    n = x.shape[-2]
    xh = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    c = xh @ xh.T
    g = np.arange(n) >= n // 2
    same = (g[:, None] == g[None, :]) & ~np.eye(n, dtype=bool)
    diff = g[:, None] != g[None, :]
    intra = jnp.sum(jnp.where(same, c, 0.0)) / same.sum()
    inter = jnp.sum(jnp.where(diff, c, 0.0)) / diff.sum()
    return intra, inter


# ---------------------------------------------------------------- jit-able kernels
# draws x depth x n x d^2 above which a draw kernel is compiled with run-time optimisation
# in a process that compiles for speed (optimized_jit; the test suite). On a 2-core CPU
# (gradient draws): at 1.3e8 (16 draws, n = 16, d = 256, depth 8) -O0 took
# 1.1 + 1.6 s to compile and run, -O1 2.9 + 0.3 s; break-even ~1.9e8. Below it, as at the
# CLI tests' sizes, the slower compile is not paid back.
OPTIMIZE_ABOVE = 2e8


def _large(block, keys, *args, n, d, depth, **kwargs):  # noqa: ARG001 - the kernels' signature
    return keys.shape[0] * depth * n * d * d >= OPTIMIZE_ABOVE


@partial(
    optimized_jit,
    when=_large,
    static_argnames=("n", "d", "depth", "causal", "dtype", "exact_input", "weights"),
)
def transient_draws(
    block,
    keys,
    q0,
    p0,
    *,
    n,
    d,
    depth,
    causal=False,
    dtype=jnp.float32,
    exact_input=True,
    weights=DEFAULT_WEIGHTS,
):
    """Per draw and layer (q, p, u): arrays ``[draws, depth + 1]``."""
    block = cast(block, dtype)

    def one(key):
        kx, kw = jax.random.split(key)
        x = simplex_tokens(kx, n, d, q0, p0, dtype, exact=exact_input)
        _, stats = stack_forward(block, kw, x, depth, causal=causal, reduce=token_stats, weights=weights)
        return stats

    return jax.vmap(one)(keys)


@partial(jax.jit, static_argnames=("n", "d", "depth", "causal", "dtype", "weights"))
def geometry_draws(block, keys, q0, p0, *, n, d, depth, causal=False, dtype=jnp.float32, weights=DEFAULT_WEIGHTS):
    """Per draw and layer: squared norms / d ``[draws, depth+1, n]`` and pairwise cosines
    ``[draws, depth+1, n(n-1)/2]``."""
    block = cast(block, dtype)

    def reduce(x):
        return jnp.sum(jnp.square(x), -1) / d, cosines(x)

    def one(key):
        kx, kw = jax.random.split(key)
        x = simplex_tokens(kx, n, d, q0, p0, dtype)
        return stack_forward(block, kw, x, depth, causal=causal, reduce=reduce, weights=weights)[1]

    return jax.vmap(one)(keys)


@partial(jax.jit, static_argnames=("n", "d", "depth", "causal", "dtype", "weights"))
def group_draws(
    block,
    keys,
    q0,
    p_intra,
    p_inter,
    *,
    n,
    d,
    depth,
    causal=False,
    dtype=jnp.float32,
    weights=DEFAULT_WEIGHTS,
):
    """Per draw and layer (intra, inter) group cosines, ``[draws, depth + 1]`` each."""
    block = cast(block, dtype)

    def one(key):
        kx, kw = jax.random.split(key)
        x = two_group_tokens(kx, n, d, q0, p_intra, p_inter, dtype)
        return stack_forward(block, kw, x, depth, causal=causal, reduce=group_stats, weights=weights)[1]

    return jax.vmap(one)(keys)


def angle_draws(
    block,
    keys,
    q_star,
    *,
    n,
    d,
    eps=DEFAULT_EPS,
    causal=False,
    dtype=jnp.float32,
    weights=DEFAULT_WEIGHTS,
):
    """Per draw ``log[(1 - rho') / (1 - rho)]`` for one random block, input tokens at
    ``q = q*``, ``rho = 1 - eps`` (docs/theory.md §6, paper App. A). rho is the draw's
    realised cosine (``p/q`` averaged over token pairs), before and after the block."""
    block = cast(block, dtype)

    def one(key):
        kx, kw = jax.random.split(key)
        q = jnp.asarray(q_star, dtype)
        x = simplex_tokens(kx, n, d, q, q * (1 - eps), dtype)
        y = block_forward(block, kw, x, causal=causal, weights=weights)
        q0, _, u0 = token_stats(x)
        q1, _, u1 = token_stats(y)
        return jnp.log(u1 / q1) - jnp.log(u0 / q0)

    return jax.vmap(one)(keys)


def gradient_draws(
    block,
    keys,
    q_star,
    *,
    n,
    d,
    depth,
    causal=False,
    dtype=jnp.float32,
    draw_batch=None,
    weights=DEFAULT_WEIGHTS,
):
    """Per draw ``(|J^T u|^2, |u|^2)`` with ``J = dX_L/dX_0`` of a depth-``depth`` random
    stack, X_0 = n identical tokens of squared norm ``q* d`` (the collapsed fixed point),
    ``u ~ N(0, I)`` shaped like X_L (docs/theory.md §7). Draws run ``draw_batch`` at a time
    (vmapped) to bound memory; each block is recomputed in the backward pass (its
    parameters are redrawn from the same key) instead of storing every layer's weights."""
    block = cast(block, dtype)

    def one(key):
        kx, kw, ku = jax.random.split(key, 3)
        x = collapsed_tokens(kx, n, d, q_star, dtype)
        f = lambda x0: stack_forward(block, kw, x0, depth, causal=causal, remat=True, weights=weights)
        y, vjp = jax.vjp(f, x)
        u = jax.random.normal(ku, y.shape, dtype)
        (g,) = vjp(u)
        return jnp.sum(jnp.square(g)), jnp.sum(jnp.square(u))

    return jax.lax.map(one, keys, batch_size=draw_batch)


_gradient_jit = optimized_jit(
    gradient_draws,
    when=_large,
    static_argnames=("n", "d", "depth", "causal", "dtype", "draw_batch", "weights"),
)
_angle_jit = jax.jit(angle_draws, static_argnames=("n", "d", "causal", "dtype", "weights"))


# ---------------------------------------------------------------- finite-depth protocol kernels
@partial(optimized_jit, static_argnames=("n", "d", "depth", "weights", "dtype", "batch"))
def forward_draws(block, keys, q0, rho0, *, n, d, depth, weights, dtype, batch):
    """Per draw, from (q0, rho0) and from n identical tokens (q0, 1) (vmapped together: one
    compiled network): :func:`phasefield.layers.measure.gradient_draw`'s ``q, p``
    (``[draws, 2, depth + 1]``) and ``g, u`` (``[draws, 2]``)."""
    block = cast(block, dtype)
    rhos = jnp.stack([jnp.asarray(rho0, dtype), jnp.asarray(1.0, dtype)])

    def one(key):
        ks = jax.random.split(key, 2)
        return jax.vmap(lambda k, r: M.gradient_draw(block, k, n, d, depth, q0, r, weights, dtype))(ks, rhos)

    return jax.lax.map(one, keys, batch_size=batch)


@partial(optimized_jit, static_argnames=("n", "d", "depth", "weights", "batch", "with_fixed_point"))
def gap_draws(block, keys, q0, eps, q_star, *, n, d, depth, weights, batch, with_fixed_point):
    """Per draw (float64; call inside ``jax.enable_x64``) ``1 - rho`` per layer
    (:func:`phasefield.layers.measure.near_gap`) from (q0, 1 - eps), and, with
    ``with_fixed_point``, from (q_star, 1 - eps) (vmapped together): ``[draws, 1 or 2,
    depth + 1]``."""
    block = cast(block, jnp.float64)
    q = jnp.stack([jnp.asarray(q0, jnp.float64), jnp.asarray(q_star, jnp.float64)])[: 2 if with_fixed_point else 1]

    def one(key):
        ks = jax.random.split(jax.random.fold_in(key, 1), q.shape[0])
        return jax.vmap(lambda k, qq: M.near_gap(block, k, n, d, depth, qq, eps, weights, jnp.float64))(ks, q)

    return jax.lax.map(one, keys, batch_size=batch)


# ---------------------------------------------------------------- estimators
def mean_se(a, axis=0):
    """Mean and standard error (sample std / sqrt(N)) along ``axis``."""
    a = np.asarray(a, dtype=np.float64)
    m = a.shape[axis]
    se = a.std(axis=axis, ddof=1) / np.sqrt(m) if m > 1 else np.full_like(a.mean(axis=axis), np.nan)
    return a.mean(axis=axis), se


def log_ratio_of_means(a, b, scale=1.0, axis=0):
    """``scale * log(mean a / mean b)`` and its delta-method standard error."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    m = a.shape[axis]
    ma, mb = a.mean(axis=axis), b.mean(axis=axis)
    val = scale * np.log(ma / mb)
    da = a / np.expand_dims(ma, axis) - b / np.expand_dims(mb, axis)  # linearised log-ratio
    se = scale * da.std(axis=axis, ddof=1) / np.sqrt(m)
    return val, se


def hidden_width(block, d: int) -> int:
    """The widest hidden layer of the block's MLPs at width ``d`` (``d`` without one)."""
    widths, todo = [int(d)], [block]
    while todo:
        layer = todo.pop()
        mult = getattr(layer, "mult", None)
        if isinstance(mult, (int, float)):
            widths.append(max(1, int(round(mult * d))))
        todo.extend(layer.children())
    return max(widths)


def batch_size(block, n, d, depth, weights, draws, *, points=1, itemsize=4) -> int:
    """Draws vmapped at once by the gradient kernels: the memory of one draw
    (:func:`phasefield.grid.simulation_bytes` at the block's MLP width, ``points`` points
    vmapped together) within the budget of the platform (CPU: :data:`MEMORY_BUDGET`; an
    accelerator: :data:`GPU_MEMORY_BUDGET`), at most ``draws``."""
    budget = MEMORY_BUDGET if jax.default_backend() == "cpu" else GPU_MEMORY_BUDGET
    per = grid.simulation_bytes(d, n, depth, hidden_width(block, d), itemsize, points, weights)
    return int(max(1, min(int(draws), budget // max(per, 1))))


def shard_draws(keys):
    """Spread independent draws over every local accelerator (the jitted, vmapped
    measurement follows its inputs' sharding, :func:`phasefield.driver.shard`); left
    alone when the count does not divide evenly, and on CPU host devices, where a sharded QR
    of the exact simplex input was seen to deadlock XLA's CPU runtime (2 cores, jaxlib
    0.10); there XLA's own threads already use every core for the matmuls."""
    devices = jax.local_devices()
    if len(devices) < 2 or keys.shape[0] % len(devices) or devices[0].platform == "cpu":
        return keys
    return driver.shard(keys, devices)


def draw_keys(seed, draws):
    """The keys of ``draws`` independent draws (sharded, :func:`shard_draws`)."""
    if int(draws) != draws or draws < 2:
        raise ValueError(f"draws must be an integer >= 2 to give a standard error (got {draws})")
    return shard_draws(jax.random.split(jax.random.key(int(seed)), int(draws)))


def exponent_keys(seed, draws):
    """(angle keys, gradient keys) of the fixed-point exponents: the sweep and the
    single-point functions use the same draws for the same ``seed``."""
    draws = draw_keys(seed, draws).shape[0]
    keys = jax.random.split(jax.random.key(int(seed)), 2 * draws)
    return shard_draws(keys[:draws]), shard_draws(keys[draws:])


def check(width, draws, n_tokens, depth, q0=1.0, rho0=0.5, eps=GAP_EPS, weights=DEFAULT_WEIGHTS):
    """ValueError (one line) for options out of range."""
    check_weights(weights)
    if int(width) != width or width < 2:
        raise ValueError(f"width must be an integer >= 2 (got {width})")
    if int(draws) != draws or draws < 2:
        raise ValueError(f"draws must be an integer >= 2 to give a standard error (got {draws})")
    if int(n_tokens) != n_tokens or n_tokens < 2:
        raise ValueError(f"n_tokens must be an integer >= 2 (got {n_tokens})")
    if int(depth) != depth or depth < 1:
        raise ValueError(f"depth must be an integer >= 1 (got {depth})")
    if not (0.0 < q0 < np.inf):
        raise ValueError(f"q0 must be positive and finite (got {q0})")
    if not (-1.0 / (n_tokens - 1) <= rho0 <= 1.0):
        raise ValueError(f"rho0 must lie in [-1/(n-1), 1] (got {rho0})")
    if not (0.0 < eps < 1.0):
        raise ValueError(f"eps must lie in (0, 1) (got {eps})")


def _setup(block, n_tokens, depth, width, draws, weights):
    block = block_of(block)
    check(width, draws, n_tokens, depth, weights=weights)
    return block, int(n_tokens), int(depth), int(width)


def collapsed_q_star(block, n_tokens=32) -> float:
    """q* of the block's collapsed fixed point (the theory's, :func:`phasefield.layers.q_star`;
    ``inf`` where the norm grows with depth)."""
    return float(layers.q_star(block_of(block), n_tokens=int(n_tokens)))


def _fixed_q_star(block, n):
    qs = collapsed_q_star(block, n)
    if not np.isfinite(qs):
        raise ValueError("the fixed-point protocol needs a finite collapsed fixed point q* (this block has none)")
    return qs


# ---------------------------------------------------------------- fixed-point protocol
def transients(
    block,
    q0,
    p0,
    *,
    n_tokens=32,
    depth=16,
    width=512,
    draws=16,
    causal=False,
    dtype=jnp.float32,
    seed=0,
    exact_input=True,
    weights=DEFAULT_WEIGHTS,
) -> dict:
    """Per-layer q, p and rho = p/q (each averaged over draws, with ``*_se``), arrays of
    length depth+1 (index 0 is the input), from simplex tokens with (q0, p0)
    (``exact_input``: input Gram exactly (q0, p0), see :func:`stack.simplex_tokens`)."""
    block, n, depth, d = _setup(block, n_tokens, depth, width, draws, weights)
    q, p, u = transient_draws(
        block,
        draw_keys(seed, draws),
        q0,
        p0,
        n=n,
        d=d,
        depth=depth,
        causal=causal,
        dtype=dtype,
        exact_input=bool(exact_input),
        weights=weights,
    )
    q, p = np.asarray(q, np.float64), np.asarray(p, np.float64)
    out = {}
    for name, arr in (("q", q), ("p", p), ("rho", p / q)):
        out[name], out[name + "_se"] = mean_se(arr)
    out["layer"] = np.arange(depth + 1)
    return out


def token_geometry(
    block,
    q0,
    p0,
    *,
    n_tokens=32,
    depth=16,
    width=512,
    draws=16,
    causal=False,
    dtype=jnp.float32,
    seed=0,
    weights=DEFAULT_WEIGHTS,
) -> dict:
    """Full per-layer samples for histograms (paper Fig. 2): ``norms`` ``[depth+1,
    draws*n]`` (squared norm / d of every token) and ``cosines`` ``[depth+1,
    draws*n(n-1)/2]`` (every token pair), pooled over draws."""
    block, n, depth, d = _setup(block, n_tokens, depth, width, draws, weights)
    norms, cos = geometry_draws(
        block,
        draw_keys(seed, draws),
        q0,
        p0,
        n=n,
        d=d,
        depth=depth,
        causal=causal,
        dtype=dtype,
        weights=weights,
    )
    norms = np.moveaxis(np.asarray(norms, np.float64), 1, 0).reshape(depth + 1, -1)
    cos = np.moveaxis(np.asarray(cos, np.float64), 1, 0).reshape(depth + 1, -1)
    return {"layer": np.arange(depth + 1), "norms": norms, "cosines": cos}


def group_cosines(
    block,
    q0,
    p_intra,
    p_inter,
    *,
    n_tokens=32,
    depth=16,
    width=512,
    draws=16,
    causal=False,
    dtype=jnp.float32,
    seed=0,
    weights=DEFAULT_WEIGHTS,
) -> dict:
    """Permutation-symmetry restoration (paper Eq. 12, Fig. 3): per layer the mean
    intra-group and inter-group cosine of two groups of n/2 tokens and their ratio
    ``inter/intra`` (-> 1 when symmetry is restored), each with ``*_se``."""
    block, n, depth, d = _setup(block, n_tokens, depth, width, draws, weights)
    if not (0 <= p_inter < p_intra <= q0):
        raise ValueError("need 0 <= p_inter < p_intra <= q0 for the two-group input")
    intra, inter = group_draws(
        block,
        draw_keys(seed, draws),
        q0,
        p_intra,
        p_inter,
        n=n,
        d=d,
        depth=depth,
        causal=causal,
        dtype=dtype,
        weights=weights,
    )
    intra, inter = np.asarray(intra, np.float64), np.asarray(inter, np.float64)
    out = {"layer": np.arange(depth + 1)}
    for name, arr in (("intra", intra), ("inter", inter), ("ratio", inter / intra)):
        out[name], out[name + "_se"] = mean_se(arr)
    return out


def angle_exponent(
    block,
    *,
    n_tokens=32,
    width=512,
    draws=16,
    eps=DEFAULT_EPS,
    q_star=None,
    causal=False,
    dtype=jnp.float32,
    seed=0,
    weights=DEFAULT_WEIGHTS,
):
    """Numerical lambda_a and its standard error over draws (docs/theory.md §6): one block
    from nearby simplex tokens at (q*, 1 - eps), 1 - rho read as u/q in ``dtype``."""
    block, n, _, d = _setup(block, n_tokens, 1, width, draws, weights)
    q_star = _fixed_q_star(block, n) if q_star is None else float(q_star)
    vals = _angle_jit(
        block,
        exponent_keys(seed, draws)[0],
        q_star,
        n=n,
        d=d,
        eps=eps,
        causal=causal,
        dtype=dtype,
        weights=weights,
    )
    m, se = mean_se(vals)
    return float(m), float(se)


def gradient_exponent(
    block,
    *,
    n_tokens=32,
    depth=16,
    width=512,
    draws=16,
    q_star=None,
    causal=False,
    dtype=jnp.float32,
    seed=0,
    draw_batch=None,
    weights=DEFAULT_WEIGHTS,
):
    """Numerical lambda_g(L) from identical tokens of squared norm q* and its delta-method
    standard error (docs/theory.md §7)."""
    block, n, depth, d = _setup(block, n_tokens, depth, width, draws, weights)
    q_star = _fixed_q_star(block, n) if q_star is None else float(q_star)
    draw_batch = draw_batch or batch_size(block, n, d, depth, weights, draws)
    a, b = _gradient_jit(
        block,
        exponent_keys(seed, draws)[1],
        q_star,
        n=n,
        d=d,
        depth=depth,
        causal=causal,
        dtype=dtype,
        draw_batch=draw_batch,
        weights=weights,
    )
    m, se = log_ratio_of_means(a, b, scale=1.0 / depth)
    return float(m), float(se)


def fixed_point_exponents(
    block,
    *,
    n_tokens=32,
    depth=16,
    width=512,
    draws=16,
    eps=DEFAULT_EPS,
    causal=False,
    dtype=jnp.float32,
    seed=0,
    weights=DEFAULT_WEIGHTS,
) -> dict:
    """``lambda_a, lambda_a_se`` (:func:`angle_exponent`), ``lambda_g_collapse,
    lambda_g_collapse_se`` (:func:`gradient_exponent` at depth ``depth``) and the ``q_star``
    the inputs were built from: the fixed-point protocol (the paper's, docs/theory.md §6-7)."""
    block, n, depth, d = _setup(block, n_tokens, depth, width, draws, weights)
    qs = _fixed_q_star(block, n)
    opts = dict(n_tokens=n, width=d, draws=draws, q_star=qs, causal=causal, dtype=dtype, seed=seed, weights=weights)
    la, la_se = angle_exponent(block, eps=eps, **opts)
    lg, lg_se = gradient_exponent(block, depth=depth, **opts)
    return {
        "lambda_a": la,
        "lambda_a_se": la_se,
        "lambda_g_collapse": lg,
        "lambda_g_collapse_se": lg_se,
        "q_star": qs,
    }


# ---------------------------------------------------------------- finite-depth protocol
def leaves_as(block, dtype):
    """The block with its numbers as NumPy arrays of ``dtype`` (one compilation per dtype,
    whatever JAX's x64 switch)."""
    return jax.tree_util.tree_map(lambda v: np.asarray(v, dtype), block)


def rates(
    block,
    *,
    width=512,
    draws=16,
    n_tokens=32,
    depth=16,
    q0=1.0,
    rho0=0.5,
    eps=GAP_EPS,
    weights=DEFAULT_WEIGHTS,
    dtype=jnp.float32,
    seed=0,
    batch=None,
    q_star=None,
) -> dict:
    """:data:`QUANTITIES` of ``block`` at finite ``width``, each with ``<name>_se`` over
    ``draws`` independent draws, and per layer ``q, q_se, rho, rho_se`` (length depth + 1)
    and ``q_star``: the finite-depth protocol (the names of
    :func:`phasefield.layers.finite_depth`):

    ``angle_rate``         (1/L) log[(1 - rho_L)/(1 - rho_0)] of nearby tokens from (q0, 1 - eps)
    ``lambda_g_input``     (1/L) log(E|J^T u|^2 / E|u|^2) from tokens at (q0, rho0)
    ``lambda_g_collapse``  the same from n identical tokens of squared norm q0
    ``lambda_a``           log[(1 - rho')/(1 - rho)] of one block at (q*, 1 - eps) (NaN where
                           the block has no finite collapsed fixed point q*)
    ``rho_L``, ``q_L``     token cosine and squared norm per component after L blocks

    The forward and gradient passes run in ``dtype``; the two angle measurements always in
    float64, reading 1 - rho from the centred tokens (:func:`phasefield.layers.measure.near_gap`:
    in float32 a stack that contracts nearby tokens to 1 - rho ~ 1e-8 merges them).
    ``seed``: the draws' keys; ``batch``: draws vmapped at once (default: :func:`batch_size`);
    ``q_star``: the theory's, computed if not given."""
    block = block_of(block)
    check(width, draws, n_tokens, depth, q0, rho0, eps, weights)
    n, d, L = int(n_tokens), int(width), int(depth)
    if q_star is None:
        q_star = collapsed_q_star(block, n)
    fixed = bool(np.isfinite(q_star))
    keys = draw_keys(seed, draws)
    dt = jnp.dtype(dtype)
    batch = int(batch or batch_size(block, n, d, L, weights, draws, itemsize=dt.itemsize))
    # both kernels trace inside JAX's x64 scope (every array has an explicit dtype): one
    # compilation whether the caller has x64 on (the CLI) or off
    opts = dict(n=n, d=d, depth=L, weights=weights, batch=batch)
    with jax.enable_x64(True):
        fw = jax.device_get(
            forward_draws(leaves_as(block, dt), keys, np.asarray(q0, dt), np.asarray(rho0, dt), dtype=dt, **opts)
        )
        f64 = [np.asarray(v, np.float64) for v in (q0, eps, q_star if fixed else 1.0)]
        gap = np.asarray(
            jax.device_get(gap_draws(leaves_as(block, np.float64), keys, *f64, with_fixed_point=fixed, **opts)),
            np.float64,
        )
    q, p = (np.asarray(fw[k][:, 0], np.float64) for k in ("q", "p"))
    (gi, gc), (ui, uc) = (np.asarray(fw[k], np.float64).T for k in ("g", "u"))
    rate = np.log(gap[:, 0, -1] / gap[:, 0, 0]) / L
    out = {}
    for name, arr in (("q", q), ("rho", p / q)):
        out[name], out[name + "_se"] = mean_se(arr)
    out["rho_L"], out["rho_L_se"] = float(out["rho"][-1]), float(out["rho_se"][-1])
    out["q_L"], out["q_L_se"] = float(out["q"][-1]), float(out["q_se"][-1])
    for name, (g, u) in (("lambda_g_input", (gi, ui)), ("lambda_g_collapse", (gc, uc))):
        m, se = log_ratio_of_means(g, u, scale=1.0 / L)
        out[name], out[name + "_se"] = float(m), float(se)
    m, se = mean_se(rate)
    out["angle_rate"], out["angle_rate_se"] = float(m), float(se)
    if fixed:  # one block from (q*, 1 - eps)
        m, se = mean_se(np.log(gap[:, 1, 1] / gap[:, 1, 0]))
        out["lambda_a"], out["lambda_a_se"] = float(m), float(se)
    else:
        out["lambda_a"] = out["lambda_a_se"] = float("nan")
    out["q_star"] = float(q_star)
    return out
