"""Finite-width measurements of any block (a :mod:`phasefield.layers` composition: a preset,
``NAME:key=value,...`` or a JSON spec file), under the names its theory uses
(:func:`phasefield.layers.finite_depth`, the block sweep), each with its standard error
over independent draws (``<name>_se``):

``angle_rate``         (1/L) log[(1 - rho_L)/(1 - rho_0)] of nearby tokens from (q0, 1 - eps)
                       (per draw, then averaged; the theory's is the limit rho_0 -> 1)
``lambda_g_input``     (1/L) log(E|J^T u|^2 / E|u|^2) from tokens at (q0, rho0)
``lambda_g_collapse``  the same from n identical tokens of squared norm q0
``lambda_a``           log[(1 - rho')/(1 - rho)] of one block at q = q*, rho = 1 - eps, where
                       the block has a finite collapsed fixed point q* (NaN where it has none)
``rho_L``, ``q_L``     token cosine and squared norm per component after L blocks from
                       (q0, rho0) (per draw p/q and q, averaged)

and ``q_star`` (the theory's, which ``lambda_a`` starts from). The random stacks are the
block's own Flax network (``block.module(weights)``, :mod:`phasefield.layers.measure`: one
definition of each measurement), ``weights="lazy"`` (O(n^2 d) per block, the default) or
``"dense"`` (the reference). The forward and gradient passes run in ``dtype`` (float32 by
default); the two angle measurements always in float64, reading 1 - rho from the centred
tokens (:func:`phasefield.layers.measure.near_gap`: in float32 a stack that contracts
nearby tokens to 1 - rho ~ 1e-8 merges them).

    from phasefield import simulate
    simulate.exponents("pre-ln:sigma=1,alpha=0.5,heads=4", width=256, draws=8, n_tokens=8, depth=4)
    simulate.blocks.theory("pre-ln:sigma=1,alpha=0.5,heads=4", n_tokens=8, depth=4)

:func:`sweep` measures a grid of the block's numbers (by name, as the block sweep) and
returns an ``xarray.Dataset`` with the theory's variable names plus ``<name>_se``.
"""

from __future__ import annotations

import os
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from .. import driver, grid, layers
from .._runtime import optimized_jit
from ..layers import depth as depth_fns
from ..layers import measure as M
from ..layers import spec as block_spec
from ..layers.base import check_layer
from ..layers.weights import check_weights
from ..theory.precision import float64
from .measure import MEMORY_BUDGET, log_ratio_of_means, mean_se

QUANTITIES = ("angle_rate", "lambda_g_input", "lambda_g_collapse", "lambda_a", "rho_L", "q_L")
DEFAULT_EPS = 1e-4
RESOLUTION = 1e-6  # relative floor of the standard errors in z-scores (z_scores)
GPU_MEMORY_BUDGET = 4e9


def resolve(block):
    """``(label, block)`` from a spec string (``NAME:key=value,...`` or a JSON file's path),
    a ``(name, keywords)`` pair or a block (a layer); ValueError (one line) otherwise."""
    if isinstance(block, str):
        name, kw = block_spec.parse(block)
        return name, block_spec.build(name, kw)
    if isinstance(block, tuple) and len(block) == 2 and isinstance(block[0], str):
        name, kw = block[0], block_spec.check(block[0], dict(block[1]))
        return name, block_spec.build(name, kw)
    try:
        check_layer(block)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    return type(block).__name__, block


def _leaves_as(block, dtype):
    """The block with its numbers as NumPy arrays of ``dtype`` (one compilation per dtype,
    whatever JAX's x64 switch)."""
    return jax.tree_util.tree_map(lambda v: np.asarray(v, dtype), block)


def _cast(block, dtype):
    return jax.tree_util.tree_map(lambda v: jnp.asarray(v, dtype), block)


def draw_batch(n, d, depth, weights, draws, dtype=jnp.float32) -> int:
    """Draws vmapped at once: the memory of one draw's gradient pass
    (:func:`phasefield.grid.simulation_bytes`, MLP width 4 d) within the budget of the
    platform (CPU: :data:`phasefield.simulate.measure.MEMORY_BUDGET`; an accelerator:
    :data:`GPU_MEMORY_BUDGET`)."""
    budget = MEMORY_BUDGET if jax.default_backend() == "cpu" else GPU_MEMORY_BUDGET
    per = grid.simulation_bytes(d, n, depth, 4 * d, jnp.dtype(dtype).itemsize, 1, weights)
    return int(max(1, min(int(draws), budget // max(per, 1))))


# ---------------------------------------------------------------- per-draw kernels
@partial(optimized_jit, static_argnames=("n", "d", "depth", "weights", "dtype", "batch"))
def forward_draws(block, keys, q0, rho0, *, n, d, depth, weights, dtype, batch):
    """Per draw, from (q0, rho0) and from n identical tokens (q0, 1) (vmapped together: one
    compiled network): :func:`phasefield.layers.measure.gradient_draw`'s ``q, p``
    (``[draws, 2, depth + 1]``) and ``g, u`` (``[draws, 2]``)."""
    block = _cast(block, dtype)
    rhos = jnp.stack([jnp.asarray(rho0, dtype), jnp.asarray(1.0, dtype)])

    def one(key):
        ks = jax.random.split(key, 2)
        return jax.vmap(lambda k, r: M.gradient_draw(block, k, n, d, depth, q0, r, weights, dtype))(ks, rhos)

    return jax.lax.map(one, keys, batch_size=batch)


@partial(optimized_jit, static_argnames=("n", "d", "depth", "weights", "batch", "with_fixed_point"))
def angle_draws(block, keys, q0, eps, q_star, *, n, d, depth, weights, batch, with_fixed_point):
    """Per draw (float64; call inside ``jax.enable_x64``) ``1 - rho`` per layer
    (:func:`phasefield.layers.measure.near_gap`) from (q0, 1 - eps), and, with
    ``with_fixed_point``, from (q_star, 1 - eps) (vmapped together): ``[draws, 1 or 2,
    depth + 1]``."""
    block = _cast(block, jnp.float64)
    q = jnp.stack([jnp.asarray(q0, jnp.float64), jnp.asarray(q_star, jnp.float64)])[: 2 if with_fixed_point else 1]

    def one(key):
        ks = jax.random.split(jax.random.fold_in(key, 1), q.shape[0])
        return jax.vmap(lambda k, qq: M.near_gap(block, k, n, d, depth, qq, eps, weights, jnp.float64))(ks, q)

    return jax.lax.map(one, keys, batch_size=batch)


# ---------------------------------------------------------------- theory
_angle_exponent = jax.jit(depth_fns.angle_exponent)


@float64
def theory(block, n_tokens=32, depth=16, q0=1.0, rho0=0.5) -> dict:
    """The theory's values of :data:`QUANTITIES` (and ``q_star``) under these names, from
    :func:`phasefield.layers.finite_depth` and the collapsed fixed point."""
    _, block = resolve(block)
    fd = layers.finite_depth(block, q0=q0, rho0=rho0, n_tokens=n_tokens, depth=depth)
    blk, ctx = layers.prepare(block, n_tokens)
    q_star = float(layers.q_star(block, n_tokens=n_tokens))
    la = float(_angle_exponent(blk, ctx)) if np.isfinite(q_star) else float("nan")
    return dict(
        angle_rate=float(fd["angle_rate"]),
        lambda_g_input=float(fd["lambda_g_input"]),
        lambda_g_collapse=float(fd["lambda_g_collapse"]),
        lambda_a=la,
        rho_L=float(fd["rho"][-1]),
        q_L=float(fd["q"][-1]),
        q_star=q_star,
    )


# ---------------------------------------------------------------- measurements
def check(width, draws, n_tokens, depth, q0, rho0, eps, weights):
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


def exponents(
    block,
    *,
    width=512,
    draws=16,
    n_tokens=32,
    depth=16,
    q0=1.0,
    rho0=0.5,
    eps=DEFAULT_EPS,
    weights="lazy",
    dtype=jnp.float32,
    seed=0,
    batch=None,
    q_star=None,
) -> dict:
    """:data:`QUANTITIES` of ``block`` (a spec string, ``(name, keywords)`` or a block) at
    finite ``width``, each with ``<name>_se`` over ``draws`` independent draws (module
    docstring), and per layer ``q, q_se, rho, rho_se`` (length depth + 1) and ``q_star``.
    ``seed``: the draws' keys (fixed seed -> the same numbers); ``batch``: draws vmapped at
    once (default: :func:`draw_batch`); ``q_star``: the theory's, computed if not given."""
    _, block = resolve(block)
    check(width, draws, n_tokens, depth, q0, rho0, eps, weights)
    n, d, L = int(n_tokens), int(width), int(depth)
    if q_star is None:
        q_star = float(layers.q_star(block, n_tokens=n))
    fixed = bool(np.isfinite(q_star))
    keys = jax.random.split(jax.random.key(int(seed)), int(draws))
    batch = int(batch or draw_batch(n, d, L, weights, draws, dtype))
    # both kernels trace inside JAX's x64 scope (every array has an explicit dtype): one
    # compilation whether the caller has x64 on (the CLI) or off
    dt = jnp.dtype(dtype)
    opts = dict(n=n, d=d, depth=L, weights=weights, batch=batch)
    with jax.enable_x64(True):
        fw = jax.device_get(
            forward_draws(_leaves_as(block, dt), keys, np.asarray(q0, dt), np.asarray(rho0, dt), dtype=dt, **opts)
        )
        f64 = [np.asarray(v, np.float64) for v in (q0, eps, q_star if fixed else 1.0)]
        gap = np.asarray(
            jax.device_get(angle_draws(_leaves_as(block, np.float64), keys, *f64, with_fixed_point=fixed, **opts)),
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


def z_scores(sim: dict, th: dict) -> dict:
    """``(sim - theory) / se`` of every quantity both give (NaN where either is NaN), the se
    floored at :data:`RESOLUTION` max(1, |theory|) (a LayerNorm's epsilon moves q after the
    norm by up to 1e-6, which the theory leaves out: post-LN's q_L is 1 - 7e-7 with se 2e-8)."""
    out = {}
    for k in QUANTITIES:
        if k in sim and k in th and k + "_se" in sim:
            se = max(float(sim[k + "_se"]), RESOLUTION * max(1.0, abs(float(th[k]))))
            with np.errstate(invalid="ignore", divide="ignore"):
                out[k] = float((sim[k] - th[k]) / se)
    return out


# ---------------------------------------------------------------- grids
def sweep(
    name: str,
    axes: dict,
    fixed: dict | None = None,
    *,
    n_tokens=32,
    depth=16,
    q0=1.0,
    rho0=0.5,
    width=512,
    draws=16,
    eps=DEFAULT_EPS,
    weights="lazy",
    dtype=jnp.float32,
    seed=0,
    parts_dir=None,
    progress=False,
    out=None,
    wait=driver.WAIT,
    log=None,
):
    """:func:`exponents` on the grid ``axes`` (name -> values: numbers of preset ``name``
    and at most one ``depth``, as :func:`phasefield.layers.sweep.sweep`) with the other
    numbers ``fixed``: an ``xarray.Dataset`` with the variables :data:`QUANTITIES`, their
    ``<name>_se`` and ``q_star``, dimensions as the theory's block sweep (``depth`` first,
    then the numbers in order), so ``phasefield compare`` matches them by name. Every point
    uses the same draws (``seed``). Runs through the chunk driver of every sweep
    (:mod:`phasefield.driver`), one point a chunk: ``out``: the netCDF file, written
    atomically once the grid is complete; ``parts_dir`` (default ``<out>.parts`` with
    ``out``): each finished point is kept there and reused by a rerun (with ``out`` the folder
    is removed after the write, without it the caller removes it); multi-host as the theory
    sweeps (the other processes return None)."""
    from ..layers import sweep as layer_sweep

    fixed, depths = layer_sweep.check(name, axes, dict(fixed or {}))
    check(width, draws, n_tokens, depth, q0, rho0, eps, weights)
    num_keys = [k for k in axes if k != "depth"]
    grids = [np.asarray(axes[k], np.float64) for k in num_keys]
    depth_list = depths if depths is not None else [int(depth)]
    dims = (["depth"] if depths is not None else []) + num_keys
    coords = ([np.asarray(depth_list)] if depths is not None else []) + grids
    shape = tuple(len(c) for c in coords)
    points = list(np.ndindex(*shape)) if shape else [()]
    names = list(QUANTITIES) + [k + "_se" for k in QUANTITIES] + ["q_star"]
    spec = dict(
        source="phasefield.simulate.blocks.sweep",
        block=name,
        fixed=fixed,
        dims=dims,
        coords=[np.asarray(c, np.float64).tolist() for c in coords],
        n_tokens=int(n_tokens),
        depth=int(depth),
        q0=float(q0),
        rho0=float(rho0),
        width=int(width),
        draws=int(draws),
        eps=float(eps),
        weights=weights,
        dtype=jnp.dtype(dtype).name,
        seed=int(seed),
    )

    def evaluate(i):  # one point a chunk
        at = {k: float(c[j]) for k, c, j in zip(dims, coords, points[i])}
        L = int(at.pop("depth", depth_list[0]))
        r = exponents(
            (name, dict(fixed, **at)),
            width=width,
            draws=draws,
            n_tokens=n_tokens,
            depth=L,
            q0=q0,
            rho0=rho0,
            eps=eps,
            weights=weights,
            dtype=dtype,
            seed=seed,
        )
        return {v: np.asarray(r[v], np.float64) for v in names}

    folder = parts_dir if parts_dir is not None else None if out is None else os.fspath(out) + ".parts"
    with driver.Driver(out, spec, log=log, store=folder) as drv:
        values = drv.run(
            evaluate,
            len(points),
            lambda i: (i, i + 1),
            len(points),
            names,
            progress=progress,
            desc=f"simulate {name}",
            wait=wait,
            unit="pt",
        )
        if values is None:
            return None  # process 0 assembles
        ds = _dataset(
            values,
            names=names,
            dims=dims,
            coords=coords,
            shape=shape,
            name=name,
            fixed=fixed,
            depths=depths,
            n_tokens=n_tokens,
            depth=depth,
            q0=q0,
            rho0=rho0,
            width=width,
            draws=draws,
            eps=eps,
            weights=weights,
            dtype=dtype,
            seed=seed,
        )
        drv.write(ds)
    return ds


def _dataset(
    out,
    *,
    names,
    dims,
    coords,
    shape,
    name,
    fixed,
    depths,
    n_tokens,
    depth,
    q0,
    rho0,
    width,
    draws,
    eps,
    weights,
    dtype,
    seed,
):
    """The flat results ``out`` of :func:`sweep` as its dataset."""
    import xarray as xr

    long = {
        "angle_rate": "angle rate of nearby tokens (1/L) log[(1 - rho_L)/(1 - rho_0)] from rho_0 = 1 - eps",
        "lambda_g_input": "(1/L) log(E|J^T u|^2 / E|u|^2) from (q0, rho0)",
        "lambda_g_collapse": "(1/L) log(E|J^T u|^2 / E|u|^2) from identical tokens of norm q0",
        "lambda_a": "log[(1 - rho')/(1 - rho)] of one block at (q*, 1 - eps) (NaN: no finite q*)",
        "rho_L": "token cosine after L blocks from (q0, rho0)",
        "q_L": "token squared norm per component after L blocks from (q0, rho0)",
        "q_star": "the theory's collapsed fixed point q* (input of lambda_a)",
    }
    data = {}
    for v in names:
        base = v[:-3] if v.endswith("_se") else v
        attrs = dict(long_name=("standard error of " if v.endswith("_se") else "") + long[base])
        data[v] = (dims, out[v].reshape(shape), attrs)
    attrs = dict(
        source="phasefield.simulate.blocks.sweep",
        block=name,
        n_tokens=int(n_tokens),
        q0=float(q0),
        rho0=float(rho0),
        width=int(width),
        draws=int(draws),
        eps=float(eps),
        weights=weights,
        dtype=jnp.dtype(dtype).name,
        seed=int(seed),
        **{f"fixed_{k}": (str(v) if isinstance(v, (str, bool)) else v) for k, v in fixed.items()},
    )
    if depths is None:
        attrs["depth"] = int(depth)
    return xr.Dataset(data, coords=dict(zip(dims, coords)), attrs=attrs)
