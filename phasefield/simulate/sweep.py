"""Simulated exponents over grids of points, each point a block of one preset:

:func:`fixed_point_grid`  the fixed-point exponents (:func:`phasefield.simulate.measure.fixed_point_exponents`)
                          in the grid format of the theory sweep (:func:`phasefield.diagram.sweep`):
                          one dimension per swept number (:data:`AXES`), variables ``lambda_a,
                          lambda_g_collapse`` plus their standard errors ``lambda_a_se,
                          lambda_g_collapse_se`` (and the ``q_star`` the inputs were built from);
:func:`rates_grid`        the finite-depth quantities (:func:`phasefield.simulate.measure.rates`)
                          in the format of the block sweep (:func:`phasefield.layers.sweep.sweep_grid`).

In :func:`fixed_point_grid` points are vmapped in chunks; within a chunk every point uses the
same weight and token draws (common random numbers: the Gaussian draws are made once and only rescaled
per point), which makes differences between neighbouring points far less noisy and
amortises the cost of the Gaussian sampling. With lazily sampled weights (the default,
``weights="lazy"``) the shared draws are the standard-normal slabs S and noise G of
:func:`phasefield.layers.weights.random_linear`, which do not depend on the point either.
:func:`rates_grid` measures one point at a time with the same draws (``seed``). Both run
through the chunk driver of every sweep (:mod:`phasefield.driver`): their points are a
:class:`phasefield.driver.Grid` (``n_tokens`` and ``depth`` its outer axes: a chunk's static
shape), finished chunks are stored under a parts directory so an interrupted sweep resumes
where it stopped, the netCDF file is written atomically, and the chunks split over the
processes of a multi-host run.
"""

from __future__ import annotations

import os
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from .. import driver, grid
from ..layers import registry
from ..layers import spec as block_spec
from ..layers.weights import check_weights
from . import measure
from .positions import POSITION_QUANTITIES, causal_positions

AXES = grid.AXES
SIZES = ("n_tokens", "depth")  # axes of the measurement, not numbers of the block
VARIABLES = ("lambda_a", "lambda_a_se", "lambda_g_collapse", "lambda_g_collapse_se", "q_star")


@partial(jax.jit, static_argnames=("n", "d", "depth", "eps", "causal", "dtype", "draw_batch", "weights"))
def _chunk_kernel(blocks, keys_a, keys_g, q_star, *, n, d, depth, eps, causal, dtype, draw_batch, weights):
    opts = dict(n=n, d=d, causal=causal, dtype=dtype, weights=weights)
    la = jax.vmap(lambda b, qs: measure.angle_draws(b, keys_a, qs, eps=eps, **opts))(blocks, q_star)
    a, b = jax.vmap(
        lambda blk, qs: measure.gradient_draws(blk, keys_g, qs, depth=depth, draw_batch=draw_batch, **opts)
    )(blocks, q_star)
    return la, a, b


def _base(block):
    """(name, the preset, its checked keywords) of a spec string or a ``(name, keywords)`` pair."""
    if isinstance(block, str):
        name, kw = block_spec.parse(block)
    elif isinstance(block, tuple) and len(block) == 2 and isinstance(block[0], str):
        name, kw = block[0], block_spec.check(block[0], dict(block[1]))
    else:
        raise ValueError("a grid sweep ranges over a preset's numbers: give the block as NAME[:key=value,...]")
    return name, registry.lookup(name), kw


def _ordered(names):
    """``names`` in the order of :data:`AXES` (the theory sweep's coordinates)."""
    return sorted(names, key=lambda k: AXES.index(k) if k in AXES else len(AXES))


def fixed_point_grid(
    block="paper",
    *,
    n_tokens: int = 32,
    depth: int = 16,
    width: int = 512,
    draws: int = 16,
    eps: float = measure.DEFAULT_EPS,
    causal: bool = False,
    mlp_hidden: int | None = None,
    dtype=jnp.float32,
    seed: int = 0,
    chunk: int = 16,
    parts_dir: str | None = None,
    progress: bool = False,
    weights: str = measure.DEFAULT_WEIGHTS,
    out=None,
    wait: float = driver.WAIT,
    log=None,
    **axes,
) -> xr.Dataset | None:
    """Simulate ``lambda_a, lambda_g_collapse`` (with ``_se``) of the preset ``block`` (a spec
    ``NAME:key=value,...`` or ``(name, keywords)``: its fixed numbers, default ``"paper"``)
    on the grid spanned by ``axes`` (keyword arrays named as in :data:`AXES`, numbers of the
    preset, or ``n_tokens``, ``depth`` given as arrays: the last dimensions; ``alpha`` sets
    alpha_a = alpha_m). ``mlp_hidden``: the
    MLP's hidden width where the preset's builder takes its ratio to the width (``mult``, the
    paper's block; default: the preset's).

    Runs through the chunk driver of every sweep (:mod:`phasefield.driver`): ``out``: the
    netCDF file, written atomically once the grid is complete; ``parts_dir`` (default
    ``<out>.parts`` with ``out``): finished chunks are stored there at once and reused by a
    rerun (resume; with ``out`` the folder is removed after the write, without it the caller
    removes it). Multi-host (after ``jax.distributed.initialize()``, ``parts_dir`` or ``out``
    on a shared filesystem): each process computes the chunks ``c % process_count ==
    process_index``, process 0 waits (up to ``wait`` seconds) and assembles, the others
    return None.
    ``weights``: ``"lazy"`` (default) or ``"dense"`` (see :mod:`phasefield.simulate.stack`).
    """
    name, preset, kw = _base(block)
    sizes = {"n_tokens": n_tokens, "depth": depth}
    for k, v in sizes.items():  # arrays: the last dimensions
        if np.ndim(v) > 0:
            axes[k], sizes[k] = v, np.ravel(v)[0]
    n_tokens, depth = sizes["n_tokens"], sizes["depth"]
    for k in axes:
        if k not in AXES:
            raise ValueError(f"unknown sweep axis {k!r}; choose from {', '.join(AXES)}")
        for n in grid.untie({k: 0}):
            if n not in preset.numbers and n not in SIZES:
                raise ValueError(f"block {name} has no number {n!r} to sweep")
    grid.branch_weights(axes.get("alpha"), axes.get("alpha_a"), axes.get("alpha_m"))  # not both
    if draws < 2:
        raise ValueError(f"draws must be >= 2 to give a standard error (got {draws})")
    check_weights(weights)
    if kw.get("causal"):
        raise ValueError(
            f"block {name}: a simulated grid measures the (q, p) numbers; causal=true is not one of its blocks"
        )
    defaults = preset.defaults_for(kw)
    options = {k: kw.get(k, defaults.get(k)) for k in preset.options}
    numbers = {k: float(kw.get(k, defaults[k])) for k in _ordered(preset.numbers)}
    numbers.update(n_tokens=float(n_tokens), depth=float(depth))
    numbers = {k: numbers[k] for k in _ordered(numbers)}
    coords = {k: np.asarray(v, np.float64).ravel() for k, v in axes.items()}
    grid.check_values({k: v for k, v in numbers.items() if k in SIZES})
    grid.check_values(coords)
    if int(chunk) != chunk or chunk < 1:
        raise ValueError(f"chunk must be an integer >= 1 (got {chunk})")
    # the numbers not swept are scalar coordinates, as in the theory sweep (alpha ties both weights)
    tied = ("alpha_a", "alpha_m") if "alpha" in axes else ()
    fixed = {k: v for k, v in numbers.items() if k not in axes and k not in tied}
    # n_tokens and depth are static in a compiled chunk: outer axes (the last dimensions)
    points = driver.Grid(coords, fixed, outer=SIZES)
    chunks = points.chunks(int(chunk))
    d = int(width)
    config = dict(
        width=d,
        seeds=int(draws),
        eps=float(eps),
        causal=bool(causal),
        mlp_hidden=mlp_hidden,
        dtype=jnp.dtype(dtype).name,
        seed=int(seed),
        chunk=int(chunk),
        **{k: v for k, v in options.items()},
        axes={k: coords[k].tolist() for k in coords},
        base=numbers,
        block=name,
    )
    if weights != "dense":  # dense keeps the tags of parts written before the lazy sampler
        config["weights"] = weights
    keys_a, keys_g = measure.exponent_keys(seed, int(draws))

    def evaluate(c):  # the chunk's points, not padded: a simulated point costs more than a compile
        lo, hi = chunks.span(c)
        at = {k: v.tolist() for k, v in points.values(np.arange(lo, hi)).items()}
        # every number of each point: the fixed ones, then the swept ones (alpha untied)
        fields = [{**fixed, **grid.untie({k: at[k][i] for k in coords})} for i in range(hi - lo)]
        return _run_chunk(
            preset,
            options,
            None if mlp_hidden is None else mlp_hidden / d,
            fields,
            keys_a,
            keys_g,
            n=int(round(fields[0]["n_tokens"])),
            d=d,
            depth=int(round(fields[0]["depth"])),
            eps=eps,
            causal=causal,
            dtype=dtype,
            weights=weights,
        )

    folder = parts_dir or (None if out is None else os.fspath(out) + ".parts")
    with driver.Driver(out, dict(source="phasefield.simulate.sweep", **config), log=log, store=folder) as drv:
        values = drv.run(
            evaluate,
            chunks.count,
            chunks.span,
            points.size,
            VARIABLES,
            progress=progress,
            desc="simulate sweep",
            wait=wait,
            unit="pt",
        )
        if values is None:
            return None  # process 0 assembles
        long = {
            "lambda_a": "angle exponent, one block, rho = 1 - eps at q*",
            "lambda_g_collapse": "gradient exponent lambda_g(L), VJP from the collapsed point",
        }
        attrs = {
            "source": "phasefield.simulate.sweep",
            "width": d,
            "seeds": int(draws),
            "eps": float(eps),
            "causal": int(bool(causal)),
            "dtype": jnp.dtype(dtype).name,
            "seed": int(seed),
            "weights": weights,
            **{k: (int(v) if isinstance(v, bool) else v) for k, v in options.items() if v is not None},
        }
        ds = points.dataset(values, {v: {"long_name": long[v]} if v in long else {} for v in VARIABLES}, attrs)
        drv.write(ds)
    return ds


def _build(preset, kw, mult):
    """The preset's block from its keywords, its MLP ``mult`` times the width if given."""
    if mult is None:
        return preset.build(kw)
    if preset.numbers_class is not None:
        return preset.builder(preset.numbers_class(**kw), mult=mult)
    return preset.builder(**kw, mult=mult)


def _run_chunk(preset, options, mult, fields, keys_a, keys_g, *, n, d, depth, eps, causal, dtype, weights):
    """The chunk's points vmapped together: their blocks stacked leaf by leaf."""
    blocks = [_build(preset, {**options, **{k: f[k] for k in preset.numbers}}, mult) for f in fields]
    q_star = np.asarray([measure.collapsed_q_star(b, n) for b in blocks], np.float64)
    stacked = jax.tree_util.tree_map(lambda *v: np.stack([np.asarray(x, np.float64) for x in v]), *blocks)
    size = measure.batch_size(
        blocks[0], n, d, depth, weights, keys_g.shape[0], points=len(fields), itemsize=jnp.dtype(dtype).itemsize
    )
    la, a, b = _chunk_kernel(
        stacked,
        keys_a,
        keys_g,
        jnp.asarray(q_star),
        n=n,
        d=d,
        depth=depth,
        eps=float(eps),
        causal=bool(causal),
        dtype=dtype,
        draw_batch=size,
        weights=weights,
    )
    la_m, la_se = measure.mean_se(np.asarray(la), axis=1)
    lg_m, lg_se = measure.log_ratio_of_means(np.asarray(a), np.asarray(b), scale=1.0 / depth, axis=1)
    return {
        "lambda_a": la_m,
        "lambda_a_se": la_se,
        "lambda_g_collapse": lg_m,
        "lambda_g_collapse_se": lg_se,
        "q_star": q_star,
    }


# ---------------------------------------------------------------- the finite-depth quantities
def _check_network(block, n: int, width: int) -> None:
    """The block's network at this width, traced without running (ValueError before any
    work: a width that is not a multiple of the heads, ...)."""
    x = jax.ShapeDtypeStruct((n, width), jnp.float32)
    jax.eval_shape(lambda x: block.module("dense").init(jax.random.PRNGKey(0), x), x)


def rates_grid(
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
    eps=measure.GAP_EPS,
    weights=measure.DEFAULT_WEIGHTS,
    dtype=jnp.float32,
    seed=0,
    parts_dir=None,
    progress=False,
    out=None,
    wait=driver.WAIT,
    log=None,
):
    """:func:`phasefield.simulate.measure.rates` on the grid ``axes`` (name -> values:
    numbers of preset ``name`` and at most one ``depth``, as :func:`phasefield.layers.sweep.sweep_grid`) with the other
    numbers ``fixed``: an ``xarray.Dataset`` with the variables :data:`~phasefield.simulate.measure.QUANTITIES`, their
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
    measure.check(width, draws, n_tokens, depth, q0, rho0, eps, weights)
    causal = bool(fixed.get("causal"))
    if causal and "n_tokens" in axes:
        raise ValueError("a causal block's simulated grid takes one n_tokens (its values are per position)")
    first = {k: float(np.asarray(v)[0]) for k, v in axes.items() if k != "depth"}
    _check_network(block_spec.build(name, dict(fixed, **first)), int(n_tokens), int(width))
    num_keys = [k for k in axes if k != "depth"]
    depth_list = depths if depths is not None else [int(depth)]
    # dimensions as the theory's block sweep: depth first, then the numbers in order
    lead = {"depth": np.asarray(depth_list)} if depths is not None else {}
    points = driver.Grid({**lead, **{k: np.asarray(axes[k], np.float64) for k in num_keys}}, outer=("depth",))
    chunks = points.chunks(1)  # one point a chunk
    quantities = POSITION_QUANTITIES if causal else measure.QUANTITIES
    names = list(quantities) + [k + "_se" for k in quantities] + ([] if causal else ["q_star"])
    shapes = {k: (int(n_tokens),) for k in names if k.removesuffix("_se").endswith("_pos")}
    source = "phasefield.simulate.sweep.rates_grid"
    settings = dict(  # the run's settings: in the store's key and the dataset's attributes
        n_tokens=int(n_tokens),
        q0=float(q0),
        rho0=float(rho0),
        width=int(width),
        draws=int(draws),
        eps=float(eps),
        weights=weights,
        dtype=jnp.dtype(dtype).name,
        seed=int(seed),
    )
    spec = dict(
        source=source,
        block=name,
        fixed=fixed,
        dims=list(points.dims),
        coords=[np.asarray(v, np.float64).tolist() for v in points.axes.values()],
        depth=int(depth),
        **settings,
    )

    def evaluate(c):
        at = {k: float(v[0]) for k, v in points.values([chunks.span(c)[0]]).items()}
        L = int(at.pop("depth", depth_list[0]))
        measured = causal_positions if causal else measure.rates  # the same draws' settings
        r = measured(
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
            chunks.count,
            chunks.span,
            points.size,
            names,
            progress=progress,
            desc=f"simulate {name}",
            wait=wait,
            unit="pt",
            shapes=shapes,
        )
        if values is None:
            return None  # process 0 assembles
        attrs = dict(
            source=source,
            block=name,
            **settings,
            **{f"fixed_{k}": (str(v) if isinstance(v, (str, bool)) else v) for k, v in fixed.items()},
        )
        if depths is None:
            attrs["depth"] = int(depth)
        extra = dict(
            coords={"position": ("position", np.arange(int(n_tokens)))}, trailing=dict.fromkeys(shapes, ("position",))
        )
        ds = points.dataset(
            values, {v: dict(long_name=_long_name(v)) for v in names}, attrs, **(extra if causal else {})
        )
        drv.write(ds)
    return ds


_LONG_NAMES = {
    "angle_rate": "angle rate of nearby tokens (1/L) log[(1 - rho_L)/(1 - rho_0)] from rho_0 = 1 - eps",
    "lambda_g_input": "(1/L) log(E|J^T u|^2 / E|u|^2) from (q0, rho0)",
    "lambda_g_collapse": "(1/L) log(E|J^T u|^2 / E|u|^2) from identical tokens of norm q0",
    "lambda_a": "log[(1 - rho')/(1 - rho)] of one block at (q*, 1 - eps) (NaN: no finite q*)",
    "rho_L": "token cosine after L blocks from (q0, rho0)",
    "q_L": "token squared norm per component after L blocks from (q0, rho0)",
    "q_star": "the theory's collapsed fixed point q* (input of lambda_a)",
    "q_L_pos": "token i's squared norm per component after L blocks (causal mask)",
    "rho_L_pos": "token i's mean cosine with the tokens j < i after L blocks (causal mask)",
    "angle_rate_last": "the last token's angle rate (1/L) log(E gap_L / E gap_0) from rho_0 = 1 - eps",
    "lambda_g_last": "(1/L) log of the last input token's squared gradient per component",
}


def _long_name(v: str) -> str:
    """The long name of :func:`rates_grid`'s variable ``v`` (``<name>_se``: its standard error)."""
    if v.endswith("_se"):
        return "standard error of " + _LONG_NAMES[v[:-3]]
    return _LONG_NAMES[v]
