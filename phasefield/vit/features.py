"""What the theory says about one training configuration: the exponents a trained ViT is
compared with.

Two places to start the mean-field map from:

* the **collapsed point** (the paper's choice): lambda_a (transverse eigenvalue at rho = 1),
  lambda_g(L) from q* with rho = 1, lambda_g^inf at the stable fixed point. Attention is
  uniform at rho = 1, so none of these depends on sigma_A.
* the **input geometry** the ViT actually sees at initialization, measured by
  :func:`input_geometry` (digits, width 64: q0 = 1.61, rho0 = 0.051): the forward trajectory
  (q_l, rho_l) from (q0, rho0 q0) for the run's L blocks, with the paper's attention map or
  the exact-softmax map, and the backward pass along it, with or without the
  softmax-derivative (query/key) path. From it

      lambda_g_in   = (1/L) log (a + b) at the input         (finite-depth gradient exponent)
      angle_rate_in = (1/L) log [(1 - rho_L) / (1 - rho_0)]  (finite-depth angle rate)
      rho_out       = rho_L                                   (token cosine at the output)

The features are computed per configuration (sigma_w, sigma_A, alpha_A, alpha_M, depth), in
float64, one jitted call per point.
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np

from .. import io

MAPS = ("paper", "exact")
HP_NAMES = ("sigma_w", "sigma_a", "alpha_a", "alpha_m", "depth")


def input_geometry(cfg, data, inits: int = 8, images: int = 256) -> dict:
    """Mean squared norm q0 and mean dot product p0 (per coordinate) of the tokens entering
    the first block of freshly initialised ViTs of ``cfg`` on the first ``images`` training
    images, averaged over ``inits`` initialisations (the embedding does not depend on the
    initialization hyperparameters). Returns q0, p0, rho0 = p0 / q0 and their standard
    errors over the initialisations."""
    import jax
    import jax.numpy as jnp

    from ..probing.capture import first_input
    from ..probing.geometry import gram_qp
    from .model import preprocess
    from .train import model_for

    model = model_for(cfg, cfg.hparams(), data.num_classes)
    x = preprocess(data.x_train[:images], data.scale, cfg.patch_size)
    apply = lambda p, xx: model.apply({"params": p}, xx)
    qs, ps = [], []
    for s in range(inits):
        params = model.init(jax.random.PRNGKey(s), x[:1])["params"]
        # the tokens entering the first (scanned) block, found by the probe: no forward by hand
        q, p = gram_qp(jnp.asarray(first_input(apply, params, x, "blocks")))
        qs.append(float(q))
        ps.append(float(p))
    qs, ps = np.array(qs), np.array(ps)
    rho = ps / qs
    se = lambda v: float(np.std(v, ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")
    return dict(
        q0=float(qs.mean()),
        p0=float(ps.mean()),
        rho0=float(rho.mean()),
        q0_se=se(qs),
        rho0_se=se(rho),
        inits=inits,
        images=images,
    )


def _traced_features(hp, q0, rho0, L: int, maps) -> dict:
    """The features of one point (traceable; ``L`` static)."""
    import jax.numpy as jnp

    from ..layers import registry

    paper = registry.lookup("paper").engine.namespace

    ex = paper.exponents(hp)
    out = dict(
        lambda_a=ex["lambda_a"],
        lambda_g_collapse=ex["lambda_g_collapse"],
        lambda_g_inf=ex["lambda_g_inf"],
        rho_star=ex["rho_star"],
    )
    p0 = rho0 * q0
    for m in maps:
        hpm = hp.replace(attention=m)
        qs, ps = paper.trajectory(hpm, q0, p0, num_layers=L)
        rho_l = ps[-1] / qs[-1]
        out[f"rho_out_{m}"] = rho_l
        out[f"angle_rate_in_{m}"] = jnp.log(jnp.maximum(1.0 - rho_l, 1e-300) / (1.0 - rho0)) / L
        for corr in (False, True):
            out[f"lambda_g_in_{m}" + ("_corr" if corr else "")] = paper.gradient_exponent(
                hpm.replace(softmax_correction=corr), q0, p0, num_layers=L
            )
    return out


@functools.cache
def _compiled(L: int, maps: tuple, batch_size: int):
    import jax

    return jax.jit(
        lambda h, q0, rho0: jax.lax.map(lambda x: _traced_features(x, q0, rho0, L, maps), h, batch_size=batch_size)
    )


def features(cfg, configs: list[dict], q0: float, rho0: float, maps=MAPS, batch_size: int = 4) -> dict:
    """Features of many configurations ({name: array over configurations}, float64): one
    compiled program per depth, points mapped ``batch_size`` at a time (bounded memory).
    A sweep of a block without the closed-form engine of the paper's (``cfg.block``, its
    preset's ``fast_engine``) gets that block's features (:func:`block_features`)."""
    import jax

    n = len(configs)
    if n == 0:
        return {}
    if not cfg.preset().fast_engine:
        return block_features(cfg, configs, q0, rho0, maps)
    with jax.enable_x64(True):
        return _features(cfg, configs, q0, rho0, maps, batch_size)


def _features(cfg, configs, q0, rho0, maps, batch_size):
    import jax
    import jax.numpy as jnp

    n = len(configs)
    col = lambda k: np.array([float(c[k]) for c in configs])
    depth = col("depth").astype(int)
    out = {}
    for L in sorted(set(depth.tolist())):
        idx = np.flatnonzero(depth == L)
        # pad to a multiple of batch_size (repeating the last point): 1 to batch_size points
        # share one compiled program (a predict call of one point, then of two, compiled twice)
        take = np.pad(idx, (0, -len(idx) % batch_size), mode="edge")
        hp = cfg.hparams(
            col("sigma_w")[take],
            col("sigma_a")[take],
            col("alpha_a")[take],
            col("alpha_m")[take],
            depth=np.full(len(take), L, float),
            dtype=jnp.float64,
        )
        res = jax.device_get(_compiled(L, tuple(maps), batch_size)(hp, jnp.float64(q0), jnp.float64(rho0)))
        for k, v in res.items():
            out.setdefault(k, np.full(n, np.nan))[idx] = np.asarray(v, float)[: len(idx)]
    return out


# the block's numbers the tables of a block's maps are sized for (at least): the standard
# blocks' study box reaches sigma = 2.5 and alphas of 1; a point beyond gets larger tables (and
# one more compilation). Sizing every point's tables alike gives every block one pytree
# structure: one compiled program per depth serves every point.
SCALE_NUMBERS = dict(sigma_w=2.5, sigma_a=1.0, alpha_a=1.0, alpha_m=1.0)


def block_specs(cfg, configs, **over):
    from .. import HParams

    return [
        cfg.block_for(
            HParams(
                sigma_w=float(c["sigma_w"]),
                sigma_a=float(c["sigma_a"]),
                alpha_a=float(c["alpha_a"]),
                alpha_m=float(c["alpha_m"]),
            ),
            **over,
        )
        for c in configs
    ]


def table_scales_of(cfg, blocks, **over):
    from .. import HParams
    from ..layers.sweep import block_scales

    ref = cfg.block_for(HParams(**SCALE_NUMBERS), **over)
    return tuple(max(a, b) for a, b in zip(block_scales(blocks), block_scales([ref])))


def block_theory(cfg, configs: list[dict], attention: str | None = None) -> dict:
    """The collapsed-point theory of :func:`phasefield.vit.sweep.block_theory` (``lambda_a``: the
    angle exponent where the block has a finite fixed point, NaN without one; ``angle_rate``: the
    finite-depth angle rate from collapsed tokens, at every point; ``lambda_g_collapse`` =
    lambda_g(L) from (1, 1); ``lambda_g_inf``, ``rho_star`` at the stable fixed point, NaN
    without one), computed with every block's
    tables sized alike (:data:`SCALE_NUMBERS`): one compiled program per depth, not per point.
    ``attention``: the attention map (default: the preset's)."""
    import jax
    import jax.numpy as jnp

    from .. import layers
    from ..layers.state import Kernel

    over = {} if attention is None else dict(attention=attention)
    blocks = block_specs(cfg, configs, **over)
    scales = table_scales_of(cfg, blocks, **over)
    keys = ("lambda_a", "angle_rate", "lambda_g_collapse", "lambda_g_inf", "rho_star")
    out = {k: np.full(len(configs), np.nan) for k in keys}
    with jax.enable_x64(True):
        one = jnp.asarray(1.0, jnp.float64)
        for i, (c, blk) in enumerate(zip(configs, blocks)):
            L = int(c["depth"])
            pb, ctx = layers.prepare(blk, cfg.n_tokens, scales=scales)
            fd = layers.compiled("finite_depth")(pb, ctx, Kernel(one, one), depth=L)
            out["lambda_g_collapse"][i] = float(fd["lambda_g_collapse"])
            out["angle_rate"][i] = float(fd["angle_rate"])
            if bool(jnp.isfinite(layers.compiled("norm_fixed_point")(pb, ctx, one))):
                # the fixed point's quantities do not depend on depth: one program for every depth
                ex = layers.compiled("fixed_point_exponents")(pb, ctx, depth=1)
                out["lambda_a"][i], out["lambda_g_inf"][i] = float(ex["lambda_a"]), float(ex["lambda_g_inf"])
                out["rho_star"][i] = float(ex["rho_star"])
    return out


def block_features(cfg, configs: list[dict], q0: float, rho0: float, maps=MAPS, attention: str | None = None) -> dict:
    """The features of :func:`features` for the :mod:`phasefield.layers` block of ``cfg``
    (``cfg.block_for``: sigma = sigma_w, alpha_attn = alpha_A, alpha_mlp = alpha_M): at the collapsed point
    ``lambda_a``, ``angle_rate``, ``lambda_g_collapse``, ``lambda_g_inf``, ``rho_star`` as
    :func:`phasefield.vit.sweep.block_theory` gives them per run (:func:`block_theory`: the angle
    exponent where the block has a finite fixed point, NaN without one, and the finite-depth angle
    rate at every point); from the input geometry (q0, rho0), per attention map, the trajectory's
    ``rho_out``, ``angle_rate_in`` and ``lambda_g_in`` without and with (``_corr``) the
    softmax-derivative term
    (:func:`phasefield.layers.finite_depth`); a map whose features are not finite at every
    configuration is left out. ``attention``: the attention map of the collapsed-point features
    (default: the preset's; at rho = 1 attention is uniform, so the maps agree there). Every
    block's tables are sized alike (:data:`SCALE_NUMBERS`): one compiled program per depth."""
    import jax
    import jax.numpy as jnp

    from .. import layers
    from ..layers.state import Kernel

    n = len(configs)
    out = block_theory(cfg, configs, attention)
    for m in maps:
        for k in (f"rho_out_{m}", f"angle_rate_in_{m}", f"lambda_g_in_{m}", f"lambda_g_in_{m}_corr"):
            out[k] = np.full(n, np.nan)
    with jax.enable_x64(True):
        k0 = Kernel(jnp.asarray(q0, jnp.float64), jnp.asarray(q0 * rho0, jnp.float64))
        for m in maps:
            for corr in (False, True):
                blocks = block_specs(cfg, configs, attention=m, softmax_correction=corr)
                scales = table_scales_of(cfg, blocks, attention=m, softmax_correction=corr)
                for i, (c, blk) in enumerate(zip(configs, blocks)):
                    L = int(c["depth"])
                    pb, ctx = layers.prepare(blk, cfg.n_tokens, scales=scales)
                    fd = layers.compiled("finite_depth")(pb, ctx, k0, depth=L)
                    out[f"lambda_g_in_{m}" + ("_corr" if corr else "")][i] = float(fd["lambda_g_input"])
                    if not corr:
                        rho_l = float(np.asarray(fd["rho"])[-1])
                        out[f"rho_out_{m}"][i] = rho_l
                        out[f"angle_rate_in_{m}"][i] = math.log(max(1.0 - rho_l, 1e-300) / (1.0 - rho0)) / L
    # a map that does not answer here (the exact map needs normalized tokens at the attention:
    # post-LN's first attention reads the raw embedding) gives no features: its models are left out
    for m in maps:
        cols = [k for k in out if k.endswith(f"_{m}") or f"_{m}_" in k]
        if not all(np.all(np.isfinite(out[k])) for k in cols):
            for k in cols:
                del out[k]
    return out


def read_cache(sweep_dir: str, cfg):
    """(input geometry, features, config ids) cached in a sweep directory: the trainability
    study keeps them as input_geometry.json / features.csv. The geometry is measured when
    absent; features are (None, None) when absent (then computed by the caller)."""
    import csv

    from . import data as vdata

    gpath = os.path.join(sweep_dir, "input_geometry.json")
    if os.path.exists(gpath):
        geometry = io.read_json(gpath)
    else:
        geometry = input_geometry(cfg, vdata.load(cfg.dataset, cfg.image_size))
    fpath = os.path.join(sweep_dir, "features.csv")
    if not os.path.exists(fpath):
        return geometry, None, None
    with open(fpath) as f:
        rows = list(csv.DictReader(f))
    order = [r.pop("config") for r in rows]
    feats = {k: np.array([float(r[k]) for r in rows]) for k in rows[0]} if rows else {}
    return geometry, feats, order


def read_caches(sweep_dirs, cfg):
    """:func:`read_cache` of several sweep directories of one training config, pooled: the
    first directory's input geometry, and the features of every configuration when each
    directory has its cache with the same columns ((geometry, None, None) otherwise)."""
    caches = [read_cache(d, cfg) for d in sweep_dirs]
    geometry = caches[0][0]
    if any(c[1] is None for c in caches) or len({tuple(sorted(c[1])) for c in caches}) > 1:
        return geometry, None, None
    order, seen = [], set()
    cols = {k: [] for k in caches[0][1]}
    for _, feats, ids in caches:
        for i, cid in enumerate(ids):
            if cid in seen:
                continue
            seen.add(cid)
            order.append(cid)
            for k in cols:
                cols[k].append(feats[k][i])
    return geometry, {k: np.asarray(v) for k, v in cols.items()}, order
