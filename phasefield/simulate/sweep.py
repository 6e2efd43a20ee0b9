"""Simulated exponents over a grid of hyperparameter points, in the grid format of the
theory sweep (:func:`phasefield.diagram.sweep`): one dimension per swept hyperparameter,
variables ``lambda_a, lambda_g_collapse`` plus their standard errors ``lambda_a_se,
lambda_g_collapse_se`` (and the ``q_star`` the inputs were built from; ``lambda_g``,
``lambda_g_se``: deprecated copies under the earlier names).

Points are vmapped in chunks; within a chunk every point uses the same weight and token
draws (common random numbers: the Gaussian draws are made once and only rescaled per
point), which makes differences between neighbouring points far less noisy and
amortises the cost of the Gaussian sampling. With lazily sampled weights (the default,
``weights="lazy"``) the shared draws are the standard-normal slabs S and noise G of
:func:`phasefield.block.random_linear`, which do not depend on the point either. The chunks
run through the chunk driver of every sweep (:mod:`phasefield.driver`): finished chunks are
stored under a parts directory so an interrupted sweep resumes where it stopped, the netCDF
file is written atomically, and the chunks split over the processes of a multi-host run.
"""

from __future__ import annotations

import itertools
import os
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from .. import HParams, driver, grid, schema
from ..block import check_weights
from ..layers import registry
from ..theory.precision import float64
from . import measure

paper = registry.lookup("paper").engine.namespace  # the paper block's closed-form engine
NUMERIC_FIELDS = paper.numbers.NUMERIC_FIELDS

AXES = grid.AXES
VARIABLES = ("lambda_a", "lambda_a_se", "lambda_g_collapse", "lambda_g_collapse_se", "q_star")


@partial(jax.jit, static_argnames=("n", "d", "depth", "eps", "causal", "mlp_hidden", "dtype", "draw_batch", "weights"))
def _chunk_kernel(hp, keys_a, keys_g, q_star, *, n, d, depth, eps, causal, mlp_hidden, dtype, draw_batch, weights):
    opts = dict(n=n, d=d, causal=causal, mlp_hidden=mlp_hidden, dtype=dtype, weights=weights)
    la = jax.vmap(lambda h, qs: measure.angle_draws(h, keys_a, qs, eps=eps, **opts))(hp, q_star)
    a, b = jax.vmap(lambda h, qs: measure.gradient_draws(h, keys_g, qs, depth=depth, draw_batch=draw_batch, **opts))(
        hp, q_star
    )
    return la, a, b


# one compiled program per batch shape (run eagerly, the vmap dispatched and compiled every
# primitive on its own: ~10 s per chunk of a small sweep)
_q_star_jit = jax.jit(jax.vmap(lambda h: paper.collapsed_fixed_point(h)[0]))


@float64
def _q_star_batch(hp_batch: HParams) -> np.ndarray:
    return np.asarray(_q_star_jit(hp_batch.astype(jnp.float64)), np.float64)


def grid_points(base: HParams, axes: dict):
    """Cartesian grid: (dims, coords, list of per-point field dicts)."""
    dims = list(axes)
    coords = {k: np.asarray(v, np.float64).ravel() for k, v in axes.items()}
    points = []
    for values in itertools.product(*(coords[k] for k in dims)):
        fields = {k: float(getattr(base, k)) for k in NUMERIC_FIELDS}
        fields.update(grid.untie(dict(zip(dims, values))))
        points.append(fields)
    return dims, coords, points


def sweep(
    *,
    width: int = 512,
    seeds: int = 16,
    eps: float = measure.DEFAULT_EPS,
    causal: bool = False,
    mlp_hidden: int | None = None,
    dtype=jnp.float32,
    seed: int = 0,
    base: HParams | None = None,
    chunk: int = 16,
    parts_dir: str | None = None,
    progress: bool = False,
    weights: str = measure.DEFAULT_WEIGHTS,
    out=None,
    wait: float = driver.WAIT,
    log=None,
    **axes,
) -> xr.Dataset | None:
    """Simulate ``lambda_a, lambda_g`` (with ``_se``) on the grid spanned by ``axes``
    (keyword arrays named as in :data:`AXES`; ``alpha`` sets alpha_a = alpha_m).

    Runs through the chunk driver of every sweep (:mod:`phasefield.driver`): ``out``: the
    netCDF file, written atomically once the grid is complete; ``parts_dir`` (default
    ``<out>.parts`` with ``out``): finished chunks are stored there at once and reused by a
    rerun (resume; with ``out`` the folder is removed after the write, without it the caller
    removes it). Multi-host (after ``jax.distributed.initialize()``, ``parts_dir`` or ``out``
    on a shared filesystem): each process computes the chunks ``c % process_count ==
    process_index``, process 0 waits (up to ``wait`` seconds) and assembles, the others
    return None.
    ``weights``: ``"lazy"`` (default) or ``"dense"`` (see :mod:`phasefield.simulate.measure`).
    """
    base = HParams() if base is None else base
    for k in axes:
        if k not in AXES:
            raise ValueError(f"unknown sweep axis {k!r}; choose from {', '.join(AXES)}")
    grid.branch_weights(axes.get("alpha"), axes.get("alpha_a"), axes.get("alpha_m"))  # not both
    if seeds < 2:
        raise ValueError(f"seeds must be >= 2 to give a standard error (got {seeds})")
    check_weights(weights)
    dims, coords, points = grid_points(base, axes)
    base.validate()
    grid.check_values(coords)
    d = int(width)
    config = dict(
        width=d,
        seeds=int(seeds),
        eps=float(eps),
        causal=bool(causal),
        mlp_hidden=mlp_hidden,
        dtype=jnp.dtype(dtype).name,
        seed=int(seed),
        chunk=int(chunk),
        activation=base.activation,
        mlp_layers=base.mlp_layers,
        residual=base.residual,
        axes={k: coords[k].tolist() for k in dims},
        base={k: float(getattr(base, k)) for k in NUMERIC_FIELDS},
    )
    if weights != "dense":  # dense keeps the tags of parts written before the lazy sampler
        config["weights"] = weights
    # group points by their static shape (n, depth), then chunk
    groups: dict = {}
    for i, f in enumerate(points):
        groups.setdefault((int(round(f["n_tokens"])), int(round(f["depth"]))), []).append(i)
    jobs = [(nd, idx[s : s + chunk]) for nd, idx in groups.items() for s in range(0, len(idx), chunk)]
    keys_a, keys_g = measure.exponent_keys(seed, int(seeds))

    def evaluate(j):
        (n, depth), idx = jobs[j]
        return _run_chunk(
            base,
            [points[i] for i in idx],
            keys_a,
            keys_g,
            n=n,
            d=d,
            depth=depth,
            eps=eps,
            causal=causal,
            mlp_hidden=mlp_hidden,
            dtype=dtype,
            weights=weights,
        )

    folder = parts_dir or (None if out is None else os.fspath(out) + ".parts")
    with driver.Driver(out, dict(source="phasefield.simulate.sweep", **config), log=log, store=folder) as drv:
        values = drv.run(
            evaluate,
            len(jobs),
            lambda j: np.asarray(jobs[j][1]),
            len(points),
            VARIABLES,
            progress=progress,
            desc="simulate sweep",
            wait=wait,
            unit="pt",
        )
        if values is None:
            return None  # process 0 assembles
        ds = _dataset(
            values,
            base=base,
            dims=dims,
            coords=coords,
            d=d,
            seeds=seeds,
            eps=eps,
            causal=causal,
            dtype=dtype,
            seed=seed,
            weights=weights,
        )
        drv.write(ds)
    return ds


def _dataset(out, *, base, dims, coords, d, seeds, eps, causal, dtype, seed, weights) -> xr.Dataset:
    """The flat results ``out`` as the sweep's dataset."""
    shape = tuple(len(coords[k]) for k in dims)
    # fixed hyperparameters are scalar coordinates, as in the theory sweep
    tied = ("alpha_a", "alpha_m") if "alpha" in dims else ()
    fixed = {k: float(getattr(base, k)) for k in NUMERIC_FIELDS if k not in dims and k not in tied}
    ds = xr.Dataset(
        {v: (dims, out[v].reshape(shape)) for v in VARIABLES},
        coords={**{k: coords[k] for k in dims}, **fixed},
    )
    ds.attrs.update(
        {
            "source": "phasefield.simulate.sweep",
            "width": d,
            "seeds": int(seeds),
            "eps": float(eps),
            "causal": int(bool(causal)),
            "dtype": jnp.dtype(dtype).name,
            "seed": int(seed),
            "weights": weights,
            "activation": base.activation,
            "mlp_layers": base.mlp_layers,
            "residual": base.residual,
        }
    )
    ds["lambda_a"].attrs["long_name"] = "angle exponent, one block, rho = 1 - eps at q*"
    ds["lambda_g_collapse"].attrs["long_name"] = "gradient exponent lambda_g(L), VJP from the collapsed point"
    return schema.alias_variables(ds, schema.SIMULATION)


def _run_chunk(base, fields, keys_a, keys_g, *, n, d, depth, eps, causal, mlp_hidden, dtype, weights):
    P = len(fields)
    hp = base.replace(**{k: np.asarray([f[k] for f in fields], np.float64) for k in NUMERIC_FIELDS})
    q_star = _q_star_batch(hp)
    draw_batch = measure.default_draw_batch(
        n, d, depth, mlp_hidden, points=P, itemsize=jnp.dtype(dtype).itemsize, weights=weights
    )
    la, a, b = _chunk_kernel(
        hp,
        keys_a,
        keys_g,
        jnp.asarray(q_star),
        n=n,
        d=d,
        depth=depth,
        eps=float(eps),
        causal=bool(causal),
        mlp_hidden=mlp_hidden,
        dtype=dtype,
        draw_batch=draw_batch,
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
