"""Simulated exponents over a grid of hyperparameter points, in the grid format of the
theory sweep (:func:`phasefield.sweep.sweep`): one dimension per swept hyperparameter,
variables ``lambda_a, lambda_g`` plus their standard errors ``lambda_a_se,
lambda_g_se`` (and the ``q_star`` the inputs were built from).

Points are vmapped in chunks; within a chunk every point uses the same weight and token
draws (common random numbers: the Gaussian draws are made once and only rescaled per
point), which makes differences between neighbouring points far less noisy and
amortises the cost of the Gaussian sampling. With lazily sampled weights (the default,
``weights="lazy"``) the shared draws are the standard-normal slabs S and noise G of
:func:`phasefield.block.random_linear`, which do not depend on the point either. Finished chunks are stored under a parts
directory so an interrupted sweep resumes where it stopped.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
from functools import partial
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from ..config import HParams, NUMERIC_FIELDS
from ..block import WEIGHTS
from . import measure

AXES = ("sigma_w", "sigma_a", "alpha_a", "alpha_m", "alpha", "sigma_v", "n_tokens", "depth")
VARIABLES = ("lambda_a", "lambda_a_se", "lambda_g", "lambda_g_se", "q_star")


@partial(jax.jit, static_argnames=("n", "d", "depth", "eps", "causal", "mlp_hidden", "dtype",
                                   "draw_batch", "weights"))
def _chunk_kernel(hp, keys_a, keys_g, q_star, *, n, d, depth, eps, causal, mlp_hidden, dtype,
                  draw_batch, weights):
    opts = dict(n=n, d=d, causal=causal, mlp_hidden=mlp_hidden, dtype=dtype, weights=weights)
    la = jax.vmap(lambda h, qs: measure.angle_draws(h, keys_a, qs, eps=eps, **opts))(hp, q_star)
    a, b = jax.vmap(lambda h, qs: measure.gradient_draws(
        h, keys_g, qs, depth=depth, draw_batch=draw_batch, **opts))(hp, q_star)
    return la, a, b


def _q_star_batch(hp_batch: HParams) -> np.ndarray:
    try:
        from .. import theory

        theory.collapsed_fixed_point
    except (ImportError, AttributeError):
        size = np.asarray(hp_batch.sigma_w).shape[0]
        return np.array([measure.q_star_reference(jax.tree_util.tree_map(lambda v: v[i], hp_batch))
                         for i in range(size)])
    hp64 = hp_batch.astype(jnp.float64)
    try:
        return np.asarray(jax.vmap(lambda h: theory.collapsed_fixed_point(h)[0])(hp64), np.float64)
    except Exception:  # a theory routine that is not vmappable: loop
        size = np.asarray(hp64.sigma_w).shape[0]
        pts = [jax.tree_util.tree_map(lambda v: v[i], hp64) for i in range(size)]
        return np.array([float(theory.collapsed_fixed_point(h)[0]) for h in pts])


def grid_points(base: HParams, axes: dict):
    """Cartesian grid: (dims, coords, list of per-point field dicts)."""
    dims = list(axes)
    coords = {k: np.asarray(v, np.float64).ravel() for k, v in axes.items()}
    points = []
    for values in itertools.product(*(coords[k] for k in dims)):
        fields = {k: float(getattr(base, k)) for k in NUMERIC_FIELDS}
        for k, v in zip(dims, values):
            if k == "alpha":
                fields["alpha_a"] = fields["alpha_m"] = v
            else:
                fields[k] = v
        points.append(fields)
    return dims, coords, points


def sweep(*, width: int = 512, seeds: int = 16, eps: float = measure.DEFAULT_EPS,
          causal: bool = False, mlp_hidden: Optional[int] = None, dtype=jnp.float32,
          seed: int = 0, base: Optional[HParams] = None, chunk: int = 16,
          parts_dir: Optional[str] = None, progress: bool = False,
          weights: str = measure.DEFAULT_WEIGHTS, **axes) -> xr.Dataset:
    """Simulate ``lambda_a, lambda_g`` (with ``_se``) on the grid spanned by ``axes``
    (keyword arrays named as in :data:`AXES`; ``alpha`` sets alpha_a = alpha_m).

    ``parts_dir``: store finished chunks there and reuse them on a rerun (resume).
    ``weights``: ``"lazy"`` (default) or ``"dense"`` (see :mod:`phasefield.simulate.measure`).
    """
    base = HParams() if base is None else base
    for k in axes:
        if k not in AXES:
            raise ValueError(f"unknown sweep axis {k!r}; choose from {', '.join(AXES)}")
    if "alpha" in axes and ("alpha_a" in axes or "alpha_m" in axes):
        raise ValueError("sweep either alpha or alpha_a/alpha_m, not both")
    if seeds < 2:
        raise ValueError(f"seeds must be >= 2 to give a standard error (got {seeds})")
    if weights not in WEIGHTS:
        raise ValueError(f"unknown weights {weights!r}; choose one of {', '.join(WEIGHTS)}")
    dims, coords, points = grid_points(base, axes)
    for f in points:  # validate every point (one line on error)
        base.replace(**f).validate()
    d = int(width)
    config = dict(width=d, seeds=int(seeds), eps=float(eps), causal=bool(causal),
                  mlp_hidden=mlp_hidden, dtype=jnp.dtype(dtype).name, seed=int(seed),
                  chunk=int(chunk), activation=base.activation, mlp_layers=base.mlp_layers,
                  residual=base.residual, axes={k: coords[k].tolist() for k in dims},
                  base={k: float(getattr(base, k)) for k in NUMERIC_FIELDS})
    if weights != "dense":  # dense keeps the tags of parts written before the lazy sampler
        config["weights"] = weights
    tag = hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    if parts_dir:
        os.makedirs(parts_dir, exist_ok=True)

    # group points by their static shape (n, depth), then chunk
    groups: dict = {}
    for i, f in enumerate(points):
        groups.setdefault((int(round(f["n_tokens"])), int(round(f["depth"]))), []).append(i)
    jobs = [(nd, idx[s:s + chunk]) for nd, idx in groups.items() for s in range(0, len(idx), chunk)]

    out = {v: np.full(len(points), np.nan) for v in VARIABLES}
    keys_a, keys_g = measure.exponent_keys(seed, int(seeds))
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(points), unit="pt", desc="simulate sweep")
    for j, ((n, depth), idx) in enumerate(jobs):
        part = os.path.join(parts_dir, f"{tag}-{j:05d}.npz") if parts_dir else None
        if part and os.path.exists(part):
            res = dict(np.load(part))
        else:
            res = _run_chunk(base, [points[i] for i in idx], keys_a, keys_g, n=n, d=d,
                             depth=depth, eps=eps, causal=causal, mlp_hidden=mlp_hidden,
                             dtype=dtype, weights=weights)
            if part:
                tmp = part + ".tmp.npz"
                np.savez(tmp, **res)
                os.replace(tmp, part)
        for v in VARIABLES:
            out[v][idx] = res[v]
        if bar is not None:
            bar.update(len(idx))
    if bar is not None:
        bar.close()

    shape = tuple(len(coords[k]) for k in dims)
    ds = xr.Dataset(
        {v: (dims, out[v].reshape(shape)) for v in VARIABLES},
        coords={k: coords[k] for k in dims},
    )
    ds.attrs.update({
        "source": "phasefield.simulate.sweep",
        "width": d, "seeds": int(seeds), "eps": float(eps), "causal": int(bool(causal)),
        "dtype": jnp.dtype(dtype).name, "seed": int(seed), "weights": weights,
        "activation": base.activation, "mlp_layers": base.mlp_layers, "residual": base.residual,
        **{f"hp_{k}": float(getattr(base, k)) for k in NUMERIC_FIELDS if k not in dims},
    })
    ds["lambda_a"].attrs["long_name"] = "angle exponent, one block, rho = 1 - eps at q*"
    ds["lambda_g"].attrs["long_name"] = "gradient exponent lambda_g(L), VJP from the collapsed point"
    return ds


def _run_chunk(base, fields, keys_a, keys_g, *, n, d, depth, eps, causal, mlp_hidden, dtype,
               weights):
    P = len(fields)
    hp = base.replace(**{k: jnp.asarray([f[k] for f in fields], jnp.float64) for k in NUMERIC_FIELDS})
    q_star = _q_star_batch(hp)
    draw_batch = measure.default_draw_batch(n, d, depth, mlp_hidden, points=P,
                                            itemsize=jnp.dtype(dtype).itemsize, weights=weights)
    la, a, b = _chunk_kernel(hp, keys_a, keys_g, jnp.asarray(q_star), n=n, d=d, depth=depth,
                             eps=float(eps), causal=bool(causal), mlp_hidden=mlp_hidden,
                             dtype=dtype, draw_batch=draw_batch, weights=weights)
    la_m, la_se = measure.mean_se(np.asarray(la), axis=1)
    lg_m, lg_se = measure.log_ratio_of_means(np.asarray(a), np.asarray(b), scale=1.0 / depth, axis=1)
    return {"lambda_a": la_m, "lambda_a_se": la_se, "lambda_g": lg_m, "lambda_g_se": lg_se,
            "q_star": q_star}
