"""Finite-width measurements on random transformer stacks, each with a standard error over
independent draws (seeds).

Every public function takes a concrete :class:`HParams` (one hyperparameter point) and
keyword options

    width     embedding width d
    seeds     number of independent draws (weights and input tokens)
    causal    causal attention mask
    mlp_hidden MLP hidden width (default d)
    dtype     simulation dtype (float32 by default)
    seed      integer seed of the draw keys (fixed seed -> reproducible numbers)
    weights   "lazy" (default: lazily sampled linear maps, O(n^2 d) per block, exact in
              distribution) or "dense" (every d x d matrix drawn; the reference)

and returns numpy arrays. The ``*_draws`` kernels underneath are pure jit-able functions
of ``(hp, key, ...)``; :mod:`phasefield.simulate.sweep` vmaps them over hyperparameter
points (sharing the weight draws between points: common random numbers).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from .. import HParams, grid, schema
from .._runtime import optimized_jit
from ..layers import registry
from ..theory.precision import float64
from .stack import DEFAULT_WEIGHTS, block_forward, collapsed_tokens, simplex_tokens, stack_forward, two_group_tokens

paper = registry.lookup("paper").engine.namespace  # the paper block's closed-form engine

DEFAULT_EPS = 1e-3
# bytes of live weights and residuals per draw batch of the gradient kernel (memory-bound on
# a CPU: smaller batches measured faster at widths 256 and 512)
MEMORY_BUDGET = 2.5e8


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


def _large(hp, keys, *args, n, d, depth, **kwargs):  # noqa: ARG001 - the kernels' signature
    return keys.shape[0] * depth * n * d * d >= OPTIMIZE_ABOVE


@partial(
    optimized_jit,
    when=_large,
    static_argnames=("n", "d", "depth", "causal", "mlp_hidden", "dtype", "exact_input", "weights"),
)
def transient_draws(
    hp,
    keys,
    q0,
    p0,
    *,
    n,
    d,
    depth,
    causal=False,
    mlp_hidden=None,
    dtype=jnp.float32,
    exact_input=True,
    weights=DEFAULT_WEIGHTS,
):
    """Per draw and layer (q, p, u): arrays ``[draws, depth + 1]``."""
    hp = hp.astype(dtype)

    def one(key):
        kx, kw = jax.random.split(key)
        x = simplex_tokens(kx, n, d, q0, p0, dtype, exact=exact_input)
        _, stats = stack_forward(
            hp, kw, x, depth, causal=causal, mlp_hidden=mlp_hidden, reduce=token_stats, weights=weights
        )
        return stats

    return jax.vmap(one)(keys)


@partial(jax.jit, static_argnames=("n", "d", "depth", "causal", "mlp_hidden", "dtype", "weights"))
def geometry_draws(
    hp, keys, q0, p0, *, n, d, depth, causal=False, mlp_hidden=None, dtype=jnp.float32, weights=DEFAULT_WEIGHTS
):
    """Per draw and layer: squared norms / d ``[draws, depth+1, n]`` and pairwise cosines
    ``[draws, depth+1, n(n-1)/2]``."""
    hp = hp.astype(dtype)

    def reduce(x):
        return jnp.sum(jnp.square(x), -1) / d, cosines(x)

    def one(key):
        kx, kw = jax.random.split(key)
        x = simplex_tokens(kx, n, d, q0, p0, dtype)
        return stack_forward(hp, kw, x, depth, causal=causal, mlp_hidden=mlp_hidden, reduce=reduce, weights=weights)[1]

    return jax.vmap(one)(keys)


@partial(jax.jit, static_argnames=("n", "d", "depth", "causal", "mlp_hidden", "dtype", "weights"))
def group_draws(
    hp,
    keys,
    q0,
    p_intra,
    p_inter,
    *,
    n,
    d,
    depth,
    causal=False,
    mlp_hidden=None,
    dtype=jnp.float32,
    weights=DEFAULT_WEIGHTS,
):
    """Per draw and layer (intra, inter) group cosines, ``[draws, depth + 1]`` each."""
    hp = hp.astype(dtype)

    def one(key):
        kx, kw = jax.random.split(key)
        x = two_group_tokens(kx, n, d, q0, p_intra, p_inter, dtype)
        return stack_forward(
            hp, kw, x, depth, causal=causal, mlp_hidden=mlp_hidden, reduce=group_stats, weights=weights
        )[1]

    return jax.vmap(one)(keys)


def angle_draws(
    hp,
    keys,
    q_star,
    *,
    n,
    d,
    eps=DEFAULT_EPS,
    causal=False,
    mlp_hidden=None,
    dtype=jnp.float32,
    weights=DEFAULT_WEIGHTS,
):
    """Per draw ``log[(1 - rho') / (1 - rho)]`` for one random block, input tokens at
    ``q = q*``, ``rho = 1 - eps`` (docs/theory.md §6, paper App. A). rho is the draw's
    realised cosine (``p/q`` averaged over token pairs), before and after the block."""
    hp = hp.astype(dtype)

    def one(key):
        kx, kw = jax.random.split(key)
        q = jnp.asarray(q_star, dtype)
        x = simplex_tokens(kx, n, d, q, q * (1 - eps), dtype)
        y = block_forward(hp, kw, x, causal=causal, mlp_hidden=mlp_hidden, weights=weights)
        q0, _, u0 = token_stats(x)
        q1, _, u1 = token_stats(y)
        return jnp.log(u1 / q1) - jnp.log(u0 / q0)

    return jax.vmap(one)(keys)


def gradient_draws(
    hp,
    keys,
    q_star,
    *,
    n,
    d,
    depth,
    causal=False,
    mlp_hidden=None,
    dtype=jnp.float32,
    draw_batch=None,
    weights=DEFAULT_WEIGHTS,
):
    """Per draw ``(|J^T u|^2, |u|^2)`` with ``J = dX_L/dX_0`` of a depth-``depth`` random
    stack, X_0 = n identical tokens of squared norm ``q* d`` (the collapsed fixed point),
    ``u ~ N(0, I)`` shaped like X_L (docs/theory.md §7). Draws run ``draw_batch`` at a time
    (vmapped) to bound memory; each block is recomputed in the backward pass (its
    parameters are redrawn from the same key) instead of storing every layer's weights."""
    hp = hp.astype(dtype)

    def one(key):
        kx, kw, ku = jax.random.split(key, 3)
        x = collapsed_tokens(kx, n, d, q_star, dtype)
        f = lambda x0: stack_forward(
            hp, kw, x0, depth, causal=causal, mlp_hidden=mlp_hidden, remat=True, weights=weights
        )
        y, vjp = jax.vjp(f, x)
        u = jax.random.normal(ku, y.shape, dtype)
        (g,) = vjp(u)
        return jnp.sum(jnp.square(g)), jnp.sum(jnp.square(u))

    return jax.lax.map(one, keys, batch_size=draw_batch)


def default_draw_batch(
    n, d, depth, mlp_hidden=None, points=1, itemsize=4, budget=MEMORY_BUDGET, weights=DEFAULT_WEIGHTS
):
    """How many draws to vmap at once so that the memory of the gradient kernel
    (:func:`phasefield.grid.simulation_bytes`) fits ``budget`` bytes."""
    per_draw = grid.simulation_bytes(d, n, depth, mlp_hidden, itemsize, points, weights)
    return int(max(1, min(1024, budget // max(per_draw, 1))))


_gradient_jit = optimized_jit(
    gradient_draws,
    when=_large,
    static_argnames=("n", "d", "depth", "causal", "mlp_hidden", "dtype", "draw_batch", "weights"),
)
_angle_jit = jax.jit(angle_draws, static_argnames=("n", "d", "causal", "mlp_hidden", "dtype", "weights"))


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


def _keys(seed, seeds):
    if seeds < 2:
        raise ValueError(f"seeds must be >= 2 to give a standard error (got {seeds})")
    return shard_draws(jax.random.split(jax.random.key(int(seed)), int(seeds)))


def shard_draws(keys):
    """Spread independent draws over every local accelerator (the jitted, vmapped
    measurement follows its inputs' sharding); left alone when the count does not divide
    evenly, and on CPU host devices, where a sharded QR of the exact simplex input was
    seen to deadlock XLA's CPU runtime (2 cores, jaxlib 0.10); there XLA's own threads
    already use every core for the matmuls."""
    devices = jax.local_devices()
    if len(devices) < 2 or keys.shape[0] % len(devices) or devices[0].platform == "cpu":
        return keys
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    return jax.device_put(keys, NamedSharding(Mesh(np.array(devices), ("draws",)), P("draws")))


def exponent_keys(seed, seeds):
    """(angle keys, gradient keys) of the exponent measurements: the sweep and the
    single-point functions use the same draws for the same ``seed``."""
    keys = jax.random.split(jax.random.key(int(seed)), 2 * _keys(seed, seeds).shape[0])
    return shard_draws(keys[:seeds]), shard_draws(keys[seeds:])


def _check(hp, width):
    hp.validate()
    if int(width) < 2:
        raise ValueError(f"width must be >= 2 (got {width})")
    return int(np.asarray(hp.n_tokens)), int(width)


def collapsed_q_star(hp: HParams) -> float:
    """q* of the collapsed fixed point from the theory engine (docs/theory.md §6)."""
    return float(paper.collapsed_fixed_point(hp)[0])


@float64
def q_star_reference(hp: HParams) -> float:
    """Closed form ``q* = (beta_M^2 alpha_A^2 sigma_V^2 + alpha_M^2 q_M(1)) / (1 -
    beta_A^2 beta_M^2)`` with q_M(1) from a dense trapezoid rule in standard-normal space
    (composed over ``mlp_layers``). Requires the unit-norm residual (finite q*)."""
    from .. import activations

    phi = activations.get(hp.activation)
    z = np.linspace(-12.0, 12.0, 200001)
    w = np.exp(-0.5 * z * z)
    w /= w.sum()
    sw = float(hp.sigma_w)
    var = sw**2  # pre-activation variance of the first layer (normalised input)
    for _ in range(hp.mlp_layers):
        qm = sw**2 * float(np.sum(w * np.asarray(phi(np.sqrt(var) * z)) ** 2))
        var = qm
    aa, am, sv = float(hp.alpha_a), float(hp.alpha_m), float(hp.sigma_v)
    ba2, bm2 = float(hp.beta_a) ** 2, float(hp.beta_m) ** 2
    return (bm2 * aa**2 * sv**2 + am**2 * qm) / (1.0 - ba2 * bm2)


# ---------------------------------------------------------------- public measurements
def transients(
    hp: HParams,
    q0,
    p0,
    *,
    width=512,
    seeds=16,
    depth=None,
    causal=False,
    mlp_hidden=None,
    dtype=jnp.float32,
    seed=0,
    exact_input=True,
    weights=DEFAULT_WEIGHTS,
) -> dict:
    """Per-layer q, p and rho = p/q (each averaged over draws, with ``*_se``), arrays of
    length depth+1 (index 0 is the input), from simplex tokens with (q0, p0)
    (``exact_input``: input Gram exactly (q0, p0), see :func:`stack.simplex_tokens`)."""
    n, d = _check(hp, width)
    depth = int(np.asarray(hp.depth)) if depth is None else int(depth)
    q, p, u = transient_draws(
        hp,
        _keys(seed, seeds),
        q0,
        p0,
        n=n,
        d=d,
        depth=depth,
        causal=causal,
        mlp_hidden=mlp_hidden,
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
    hp: HParams,
    q0,
    p0,
    *,
    width=512,
    seeds=16,
    depth=None,
    causal=False,
    mlp_hidden=None,
    dtype=jnp.float32,
    seed=0,
    weights=DEFAULT_WEIGHTS,
) -> dict:
    """Full per-layer samples for histograms (paper Fig. 2): ``norms`` ``[depth+1,
    seeds*n]`` (squared norm / d of every token) and ``cosines`` ``[depth+1,
    seeds*n(n-1)/2]`` (every token pair), pooled over draws."""
    n, d = _check(hp, width)
    depth = int(np.asarray(hp.depth)) if depth is None else int(depth)
    norms, cos = geometry_draws(
        hp,
        _keys(seed, seeds),
        q0,
        p0,
        n=n,
        d=d,
        depth=depth,
        causal=causal,
        mlp_hidden=mlp_hidden,
        dtype=dtype,
        weights=weights,
    )
    norms = np.moveaxis(np.asarray(norms, np.float64), 1, 0).reshape(depth + 1, -1)
    cos = np.moveaxis(np.asarray(cos, np.float64), 1, 0).reshape(depth + 1, -1)
    return {"layer": np.arange(depth + 1), "norms": norms, "cosines": cos}


def group_cosines(
    hp: HParams,
    q0,
    p_intra,
    p_inter,
    *,
    width=512,
    seeds=16,
    depth=None,
    causal=False,
    mlp_hidden=None,
    dtype=jnp.float32,
    seed=0,
    weights=DEFAULT_WEIGHTS,
) -> dict:
    """Permutation-symmetry restoration (paper Eq. 12, Fig. 3): per layer the mean
    intra-group and inter-group cosine of two groups of n/2 tokens and their ratio
    ``inter/intra`` (-> 1 when symmetry is restored), each with ``*_se``."""
    n, d = _check(hp, width)
    if not (0 <= p_inter < p_intra <= q0):
        raise ValueError("need 0 <= p_inter < p_intra <= q0 for the two-group input")
    depth = int(np.asarray(hp.depth)) if depth is None else int(depth)
    intra, inter = group_draws(
        hp,
        _keys(seed, seeds),
        q0,
        p_intra,
        p_inter,
        n=n,
        d=d,
        depth=depth,
        causal=causal,
        mlp_hidden=mlp_hidden,
        dtype=dtype,
        weights=weights,
    )
    intra, inter = np.asarray(intra, np.float64), np.asarray(inter, np.float64)
    out = {"layer": np.arange(depth + 1)}
    for name, arr in (("intra", intra), ("inter", inter), ("ratio", inter / intra)):
        out[name], out[name + "_se"] = mean_se(arr)
    return out


def angle_exponent(
    hp: HParams,
    *,
    width=512,
    seeds=16,
    eps=DEFAULT_EPS,
    q_star=None,
    causal=False,
    mlp_hidden=None,
    dtype=jnp.float32,
    seed=0,
    weights=DEFAULT_WEIGHTS,
):
    """Numerical lambda_a and its standard error over draws (docs/theory.md §6)."""
    n, d = _check(hp, width)
    q_star = collapsed_q_star(hp) if q_star is None else float(q_star)
    vals = _angle_jit(
        hp,
        exponent_keys(seed, seeds)[0],
        q_star,
        n=n,
        d=d,
        eps=eps,
        causal=causal,
        mlp_hidden=mlp_hidden,
        dtype=dtype,
        weights=weights,
    )
    m, se = mean_se(vals)
    return float(m), float(se)


def gradient_exponent(
    hp: HParams,
    *,
    width=512,
    seeds=16,
    depth=None,
    q_star=None,
    causal=False,
    mlp_hidden=None,
    dtype=jnp.float32,
    seed=0,
    draw_batch=None,
    weights=DEFAULT_WEIGHTS,
):
    """Numerical lambda_g(L) and its delta-method standard error (docs/theory.md §7)."""
    n, d = _check(hp, width)
    depth = int(np.asarray(hp.depth)) if depth is None else int(depth)
    q_star = collapsed_q_star(hp) if q_star is None else float(q_star)
    draw_batch = draw_batch or default_draw_batch(n, d, depth, mlp_hidden, weights=weights)
    a, b = _gradient_jit(
        hp,
        exponent_keys(seed, seeds)[1],
        q_star,
        n=n,
        d=d,
        depth=depth,
        causal=causal,
        mlp_hidden=mlp_hidden,
        dtype=dtype,
        draw_batch=draw_batch,
        weights=weights,
    )
    m, se = log_ratio_of_means(a, b, scale=1.0 / depth)
    return float(m), float(se)


def exponents(
    hp: HParams,
    *,
    width=512,
    seeds=16,
    eps=DEFAULT_EPS,
    causal=False,
    mlp_hidden=None,
    dtype=jnp.float32,
    seed=0,
    weights=DEFAULT_WEIGHTS,
) -> dict:
    """``lambda_a, lambda_a_se, lambda_g_collapse, lambda_g_collapse_se`` (lambda_g(L) from the
    collapsed point at depth ``hp.depth``; ``lambda_g``, ``lambda_g_se``: deprecated aliases)
    and the ``q_star`` the inputs were built from."""
    q_star = collapsed_q_star(hp)
    opts = dict(
        width=width,
        seeds=seeds,
        q_star=q_star,
        causal=causal,
        mlp_hidden=mlp_hidden,
        dtype=dtype,
        seed=seed,
        weights=weights,
    )
    la, la_se = angle_exponent(hp, eps=eps, **opts)
    lg, lg_se = gradient_exponent(hp, **opts)
    out = {
        "lambda_a": la,
        "lambda_a_se": la_se,
        "lambda_g_collapse": lg,
        "lambda_g_collapse_se": lg_se,
        "q_star": q_star,
    }
    return schema.results(out, schema.SIMULATION)
