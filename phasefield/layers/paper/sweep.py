"""The paper block's phase diagrams: its closed-form evaluator of a grid, the ``sweep`` of its
engine (:func:`phasefield.diagram.sweep` with ``block="paper"`` comes here).

Every hyperparameter given as a 1-D sequence becomes a dimension (in the order sigma_w,
sigma_a, alpha | alpha_a, alpha_m, sigma_v, n_tokens, depth); scalars become scalar
coordinates. ``alpha`` ties alpha_A = alpha_M. Variables: lambda_a, lambda_g_collapse (finite
depth, input at the collapsed fixed point), lambda_g_inf, q_star, rho_star (the attractor
reached from rho_0 = 1/2), n_stable (the number of stable fixed points: >= 2 marks a
bistable point), rho_star_min, rho_star_max (the smallest and largest stable cosines) —
float64, each with ``long_name`` and ``symbol`` attributes.

How it runs:

* the MLP kernel (Gaussian-integral tables) depends on sigma_w alone, so it is built once
  per unique sigma_w and reused across every other axis; with ``attention='exact'`` the
  exact map's values on the stable-point mesh depend on (sigma_A, n) alone, so they are
  computed once per unique pair (:func:`build_exact_tables`), on grids sized to the
  largest sigma_A and n of the sweep;
* the flattened grid is cut into fixed-size chunks (one compiled program, bounded memory;
  the chunk driver :mod:`phasefield.driver` runs them, writes each finished chunk, resumes
  and shares the chunks between hosts); each chunk is ``jax.vmap`` of
  :func:`.lyapunov.exponents_of`, its leading axis sharded over every local device
  (:mod:`phasefield.driver.shard`); where a CPU device holds several TILEs of points it runs
  them one after the other (an accelerator evaluates its share of the chunk in one ``vmap``,
  :func:`_tiled_on`): a tile refines only the root brackets its points have, and skips the
  stable-point search altogether when every point of it provably has none
  (:func:`.fixed_points.no_roots`); same numbers; small chunks are evaluated at a
  power-of-two width and the kernels padded to a power-of-two count, so small sweeps share
  compiled programs.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ... import driver, grid
from ...theory import mlp
from ...theory.attention import exact, exact_table
from ...theory.precision import float64
from . import fixed_points
from .lyapunov import exponents_of
from .numbers import STATIC_FIELDS, HParams

VARIABLES = (
    "lambda_a",
    "lambda_g_collapse",
    "lambda_g_inf",
    "q_star",
    "rho_star",
    "n_stable",
    "rho_star_min",
    "rho_star_max",
)
ATTRS = {
    "lambda_a": dict(long_name="angle exponent", symbol="λ_a"),
    "lambda_g_collapse": dict(long_name="gradient exponent at finite depth (collapsed input)", symbol="λ_g(L)"),
    "lambda_g_inf": dict(long_name="gradient exponent at infinite depth (stable fixed point)", symbol="λ_g^∞"),
    "q_star": dict(long_name="squared norm per component at the collapsed fixed point", symbol="q*"),
    "rho_star": dict(long_name="token cosine at the attractor reached from rho_0 = 1/2", symbol="ρ*"),
    "n_stable": dict(long_name="number of stable fixed points (rho = 1 included; >= 2: bistable)", symbol="n_stable"),
    "rho_star_min": dict(long_name="smallest stable token cosine", symbol="ρ*_min"),
    "rho_star_max": dict(long_name="largest stable token cosine (1: the collapsed point)", symbol="ρ*_max"),
}
DEFAULT_CHUNK = 1 << 16


def _axes(sigma_w, sigma_a, alpha, alpha_a, alpha_m, sigma_v, n_tokens, depth):
    raw = dict(
        sigma_w=sigma_w,
        sigma_a=sigma_a,
        sigma_v=sigma_v,
        n_tokens=n_tokens,
        depth=depth,
        **grid.branch_weights(alpha, alpha_a, alpha_m),
    )
    dims, scalars = {}, {}
    for name in grid.AXES:
        if name not in raw:
            continue
        v = np.asarray(raw[name], dtype=np.float64)
        grid.check_values({name: v})
        (dims if v.ndim == 1 else scalars)[name] = v
    return dims, scalars


# compiled once per activation (run eagerly, this vmap compiled every primitive on its own)
@functools.cache
def _layer_scales_fn(activation: str, mlp_layers: int):
    return jax.jit(jax.vmap(lambda s: mlp.layer_scales(s, activation, mlp_layers)))


@float64
def build_kernels(sigma_w: np.ndarray, activation: str = "tanh", mlp_layers: int = 1, devices: Sequence | None = None):
    """Stacked :class:`MLPKernel` for each sigma_w (tables sized per resolution bucket,
    each bucket's sigma_w sharded over ``devices``)."""
    devices = tuple(devices) if devices is not None else tuple(jax.local_devices())
    sigma_w = np.asarray(sigma_w, np.float64).reshape(-1)
    if activation in mlp.CLOSED_FORMS:
        return _kernel_fn(activation, int(mlp_layers), 0, 0)(jnp.asarray(sigma_w))  # no tables
    q_l, _, _ = _layer_scales_fn(activation, int(mlp_layers))(jnp.asarray(sigma_w))
    s_max = np.sqrt(np.max(np.asarray(q_l), axis=-1))
    sizes = [mlp.table_sizes(s) for s in s_max]
    k_max = max(c for _, c in sizes)
    out = None
    for size in sorted(set(sizes)):
        sel = np.array([i for i, s in enumerate(sizes) if s == size])
        vals = sigma_w[sel]
        nd = len(devices)
        padded = np.concatenate([vals, np.repeat(vals[-1:], -len(vals) % nd)])
        arg = driver.shard(jnp.asarray(padded), devices)
        kb = jax.device_get(_kernel_fn(activation, int(mlp_layers), *size)(arg))
        pad = k_max - size[1]
        kb = kb.replace(
            c_pp=np.pad(kb.c_pp, [(0, 0)] * (kb.c_pp.ndim - 1) + [(0, pad)]),
            c_dd=np.pad(kb.c_dd, [(0, 0)] * (kb.c_dd.ndim - 1) + [(0, pad)]),
        )
        if out is None:
            out = jax.tree.map(lambda x: np.zeros((sigma_w.size,) + x.shape[1:], x.dtype), kb)
        out = jax.tree.map(lambda o, x: _assign(o, sel, x[: len(vals)]), out, kb)
    return out


def _assign(o, sel, x):
    o[sel] = x
    return o


@functools.cache
def _kernel_fn(activation, mlp_layers, n_grid, n_cheb):
    return jax.jit(jax.vmap(lambda s: mlp.kernel(s, activation, mlp_layers, n_grid=n_grid, n_cheb=n_cheb)))


EXACT_TABLE_BATCH = 4  # (sigma_A, n) pairs of exact-map mesh values computed at once (memory)


@float64
def build_exact_tables(pairs: np.ndarray):
    """Grid sizes (n_a, n_z) resolving every (sigma_A, n) of ``pairs`` [k, 2], whether the
    interpolant of the mesh values is exact for all of them, and the exact map's mesh values
    [k, 2, MESH + 1] of each pair (:mod:`phasefield.theory.attention.exact_table`)."""
    pairs = np.asarray(pairs, np.float64).reshape(-1, 2)
    n_a, n_z = exact.sizes(sigma_max=float(pairs[:, 0].max()), n_max=float(pairs[:, 1].max()))
    fn = exact_table.values_fn(n_a, n_z)
    b = min(EXACT_TABLE_BATCH, len(pairs))  # (not padded to a full batch: one pair is one)
    padded = np.concatenate([pairs, np.repeat(pairs[-1:], -len(pairs) % b, 0)])
    vals = [
        np.asarray(fn(jnp.asarray(padded[i : i + b, 0]), jnp.asarray(padded[i : i + b, 1])))
        for i in range(0, len(padded), b)
    ]
    vals = np.concatenate(vals)[: len(pairs)]
    return (n_a, n_z, exact_table.interpolant_exact(vals)), vals


SMALL_WIDTH = 128  # points a device at least evaluates (small sweeps share programs)
SMALL_CHEB = 129  # Chebyshev terms at least, in a small sweep (same)
TILE = 256  # points evaluated together (their arrays stay in cache; the root refinement
# loops for the most roots of a point in the tile)


def _tiled_on(devices) -> bool:
    """Whether a sweep's chunks run tile by tile on ``devices``: on CPU devices,
    which run a chunk's points in order, so a tile's arrays stay in cache and a tile whose
    points provably have no root skips the stable-point search. An accelerator runs all of a
    chunk's points at once; there the tiles' ``lax.map`` serializes small batches, and one
    ``vmap`` over the chunk (the thorough path: the same numbers, tests/test_sweep.py) is
    ~21x faster (NVIDIA H100, 128 x 1024 paper grid: 2.42 M against 0.116 M
    points/s)."""
    return all(d.platform == "cpu" for d in devices)


@functools.cache
def _evaluate_fn(
    activation, mlp_layers, residual, attention, softmax_correction, devices, att_sizes=None, thorough=False, tile=TILE
):
    """The compiled chunk evaluator. Each device runs its points tile by tile (``lax.map``
    over ``tile``-point ``vmap`` batches). ``thorough``: one ``vmap`` over the whole chunk with
    every root bracket refined at every point (the reference path: same numbers)."""
    hp_static = dict(
        activation=activation,
        mlp_layers=int(mlp_layers),
        residual=residual,
        attention=attention,
        softmax_correction=bool(softmax_correction),
    )

    def setup(fields, index, kernels, att_index, att_values):
        hp = HParams(**fields, **hp_static)
        kern = jax.tree.map(lambda x: x[index], kernels)  # gather on device, per point
        if att_sizes is not None:
            kern = kern.replace(att=exact_table.ExactKernel(att_values[att_index], *att_sizes))
        return hp, kern

    def point(*args, search=True):
        out = exponents_of(*setup(*args), not thorough, search)
        return {k: out[k] for k in VARIABLES}

    vfn = jax.vmap(point, in_axes=(0, 0, None, 0, None))
    if thorough:
        fn = vfn
    else:
        # a tile's points skip the stable-point search when every one of them provably has
        # no root (fixed_points.no_roots: the search would report the collapsed point alone)
        certain = jax.vmap(lambda *a: fixed_points.no_roots(*setup(*a)), in_axes=(0, 0, None, 0, None))
        collapsed = jax.vmap(functools.partial(point, search=False), in_axes=(0, 0, None, 0, None))

        def searched(fields, index, kernels, att_index, att_values):
            k = kernels.c_pp.shape[-1]
            if k < 129:
                return vfn(fields, index, kernels, att_index, att_values)
            # tables of the next smaller size (padded with zeros to this one's) are summed
            # over their own terms only: trailing zero coefficients leave Clenshaw unchanged
            half = (k + 1) // 2
            short = jnp.all(kernels.c_pp[index][..., half:] == 0) & jnp.all(kernels.c_dd[index][..., half:] == 0)
            cut = kernels.replace(c_pp=kernels.c_pp[..., :half], c_dd=kernels.c_dd[..., :half])
            return jax.lax.cond(
                short,
                lambda *a: vfn(a[0], a[1], cut, a[2], a[3]),
                lambda *a: vfn(a[0], a[1], kernels, a[2], a[3]),
                fields,
                index,
                att_index,
                att_values,
            )

        def one_tile(x, kernels, att_values):
            args = (x[0], x[1], kernels, x[2], att_values)
            return jax.lax.cond(jnp.all(certain(*args)), collapsed, searched, *args)

        def fn(fields, index, kernels, att_index, att_values):
            n = index.shape[0]
            t = min(tile, n)
            if n % t:  # (sweep() gives whole tiles; anything else: one tile)
                t = n
            tiles = jax.tree.map(lambda v: v.reshape((n // t, t) + v.shape[1:]), (fields, index, att_index))
            out = jax.lax.map(lambda x: one_tile(x, kernels, att_values), tiles)
            return jax.tree.map(lambda v: v.reshape((n,) + v.shape[2:]), out)

    # fields, index and att_index carry the points; without ``thorough`` each device tiles its own
    return driver.over_points(fn, devices, (True, True, False, True, False), per_device=not thorough)


# the numbers a grid can range over besides n_tokens and depth, in the order of its dimensions
PAPER_NUMBERS = tuple(k for k in grid.AXES if k not in ("n_tokens", "depth"))
PAPER_OPTIONS = {k: HParams.__dataclass_fields__[k].default for k in STATIC_FIELDS}


def sweep_grid(
    fixed: dict,
    axes: dict,
    numbers: dict,
    *,
    n_tokens=None,
    depth=None,
    q0=None,
    rho0=None,
    chunk_size=None,
    _thorough: bool = False,
    **run,
):
    """The paper block's grid: ``fixed`` (its spec's keywords), ``axes`` ({name: values}, with
    ``n_tokens`` and ``depth``) and ``numbers`` (the keywords ``sigma_w=``, ``alpha=`` ...
    ``activation=``: sequences are axes, numbers scalars) -> ``xarray.Dataset`` of
    :data:`VARIABLES` (see the module docstring); ``run``: the chunk driver's ``out``,
    ``progress``, ``devices``, ``wait``, ``log``. ValueError (one line) for a number the block
    does not have, one given twice, or an input geometry (its grid starts from the collapsed
    fixed point)."""
    if q0 is not None or rho0 is not None:
        raise ValueError(
            "q0=/rho0= set the input of the layers evaluator; the paper block's sweep starts "
            "from its collapsed fixed point (lambda_g_collapse)"
        )
    kw = dict(fixed)
    for source in (axes, numbers):
        for k, v in source.items():
            if k in ("n_tokens", "depth"):
                continue
            if k not in PAPER_NUMBERS and (source is axes or k not in PAPER_OPTIONS):
                raise ValueError(
                    f"block paper has no number {k!r} to sweep; it has "
                    f"{', '.join(PAPER_NUMBERS + ('n_tokens', 'depth'))}"
                )
            if k in kw:  # (alpha with alpha_a or alpha_m: grid.branch_weights says "not both")
                raise ValueError(f"{k} is given twice (the block spec, axes= or {k}=)")
            kw[k] = v
    kw.setdefault("sigma_w", 1.0)
    kw.setdefault("sigma_a", 1.0)
    kw.setdefault("sigma_v", 1.0)
    for k, v in PAPER_OPTIONS.items():
        kw.setdefault(k, v)
    kw["n_tokens"] = axes.get("n_tokens", 32 if n_tokens is None else n_tokens)
    kw["depth"] = axes.get("depth", 16 if depth is None else depth)
    return _evaluate_grid(**kw, **run, chunk_size=chunk_size, _thorough=_thorough)


@float64
def _evaluate_grid(
    *,
    sigma_w,
    sigma_a=1.0,
    alpha=None,
    alpha_a=None,
    alpha_m=None,
    sigma_v=1.0,
    n_tokens=32,
    depth=16,
    activation: str = "tanh",
    mlp_layers: int = 1,
    residual: str = "unit-norm",
    attention: str = "paper",
    softmax_correction: bool = False,
    out: str | None = None,
    chunk_size: int | None = None,
    progress: bool = False,
    devices: Sequence | None = None,
    wait: float = 24 * 3600.0,
    log=None,
    _thorough: bool = False,
):
    """The grid through the chunk driver, every option checked (the keywords as :func:`sweep_grid`'s)."""
    HParams(
        activation=activation,
        mlp_layers=mlp_layers,
        residual=residual,
        attention=attention,
        softmax_correction=bool(softmax_correction),
    ).validate()
    dims, scalars = _axes(sigma_w, sigma_a, alpha, alpha_a, alpha_m, sigma_v, n_tokens, depth)
    points = driver.Grid(dims, scalars)
    total = grid.check_grid(points.shape, 8 * 8, "grid")
    if chunk_size is not None and not 1 <= int(chunk_size) <= grid.CHUNK_MAX:
        raise ValueError(f"chunk_size must lie in [1, {grid.CHUNK_MAX:,}] (got {chunk_size})")
    devices = list(devices) if devices is not None else jax.local_devices()
    ndev = len(devices)
    # the exact-softmax map integrates over a logit grid per point (~25 MB): small chunks
    chunk = int(chunk_size or (DEFAULT_CHUNK if attention == "paper" else 64))
    chunk = max(ndev, min(chunk, -(-total // ndev) * ndev))
    chunk = -(-chunk // ndev) * ndev
    if chunk > ndev * TILE:  # whole tiles per device (a partial one would compile a second program)
        chunk = -(-chunk // (ndev * TILE)) * ndev * TILE
    n_chunks = -(-total // chunk)
    # a small chunk is evaluated at a power-of-two width (>= SMALL_WIDTH points a device,
    # wrapping onto the grid's next points): small sweeps of other sizes share one program
    # (the exact map's points are large: its chunks keep their size)
    least = SMALL_WIDTH if attention == "paper" else 8
    width = chunk if chunk >= ndev * TILE else ndev * min(TILE, _pow2(max(chunk // ndev, least)))
    # tiles where a device has several (a smaller sweep: one vmap, quicker to compile), on
    # CPU devices only (_tiled_on)
    small = width < ndev * TILE
    thorough = bool(_thorough) or small or not _tiled_on(devices)
    static = dict(
        activation=activation,
        mlp_layers=int(mlp_layers),
        residual=residual,
        attention=attention,
        softmax_correction=bool(softmax_correction),
        chunk=chunk,
        version=3,
    )

    pairs = None
    if attention == "exact":  # its logit grids, sized to the largest sigma_A and n: checked before any work
        pairs = _exact_pairs(dims, scalars)
        exact.sizes(sigma_max=float(pairs[:, 0].max()), n_max=float(pairs[:, 1].max()))

    spec = dict(
        source="phasefield.sweep",
        dims={k: v.tolist() for k, v in dims.items()},
        scalars={k: float(v) for k, v in scalars.items()},
        n_chunks=n_chunks,
        **static,
    )
    with driver.Driver(out, spec, log=log) as drv:
        sw_values = dims.get("sigma_w", scalars.get("sigma_w"))
        sw_all = np.atleast_1d(sw_values)
        # 2-D tables for every sigma_w: the stable-point search evaluates p_M(rho) at every
        # point, and a stable rho* < 1 can coexist with a stable rho = 1 (lambda_a < 0), so
        # the sign of lambda_a does not tell where they can be skipped
        kernels = build_kernels(sw_all, activation, mlp_layers, devices)
        # shared programs: a power-of-two count of kernels (>= 16); in a small sweep, tables of
        # at least SMALL_CHEB Chebyshev terms (trailing zeros: the Clenshaw sums are unchanged)
        pad = _pow2(max(sw_all.size, 16)) - sw_all.size
        kernels = jax.tree.map(lambda x: np.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1), mode="edge"), kernels)
        k_pad = max(SMALL_CHEB - kernels.c_pp.shape[-1], 0) if small and kernels.c_pp.shape[-1] else 0
        if k_pad:
            kernels = kernels.replace(
                **{
                    k: np.pad(getattr(kernels, k), [(0, 0)] * (kernels.c_pp.ndim - 1) + [(0, k_pad)])
                    for k in ("c_pp", "c_dd")
                }
            )
        kernels = jax.tree.map(jnp.asarray, kernels)
        att_sizes, att_values, pair_index = None, jnp.zeros((1,)), {}
        if pairs is not None:
            pair_index = {tuple(p): i for i, p in enumerate(pairs.tolist())}
            att_sizes, att_values = build_exact_tables(pairs)
            att_values = jnp.asarray(att_values)
        fn = _evaluate_fn(
            activation,
            mlp_layers,
            residual,
            attention,
            softmax_correction,
            tuple(devices),
            att_sizes,
            thorough,
            int(TILE),
        )

        chunks = points.chunks(chunk)

        def evaluate(c):
            index = chunks.index(c, width)  # pad (the last chunk) by wrapping
            fields = points.values(index)
            if "alpha" in fields:
                fields["alpha_a"] = fields["alpha_m"] = fields.pop("alpha")
            sw_index = points.indices(index, "sigma_w") if "sigma_w" in dims else np.zeros(index.shape, np.int64)
            att_index = np.zeros(index.shape, np.int64)
            if att_sizes is not None:
                att_index[:] = [pair_index[p] for p in zip(fields["sigma_a"].tolist(), fields["n_tokens"].tolist())]
            fields = {k: jnp.asarray(v, jnp.float64) for k, v in fields.items()}
            sw_index, att_index = jnp.asarray(sw_index), jnp.asarray(att_index)
            fields, sw_index, att_index = driver.shard((fields, sw_index, att_index), devices)
            return fn(fields, sw_index, kernels, att_index, att_values)

        results = drv.run(evaluate, n_chunks, chunks.span, total, VARIABLES, progress=progress, wait=wait)
        if results is None:
            return None  # process 0 assembles
        ds = points.dataset(
            results,
            {k: ATTRS[k] for k in VARIABLES},
            attrs=dict(
                title="phasefield theory sweep",
                block="paper",
                activation=activation,
                mlp_layers=int(mlp_layers),
                residual=residual,
                attention=attention,
                softmax_correction=int(bool(softmax_correction)),
                note="lambda_g_collapse: depth-L exponent from the collapsed fixed point; "
                "lambda_g_inf: stable fixed point",
            ),
        )
        drv.write(ds)
        return ds


def _pow2(n: int) -> int:
    return 1 << (int(n) - 1).bit_length()


def _exact_pairs(dims, scalars):
    """The unique (sigma_A, n) pairs of the grid, [k, 2]."""
    sa = np.atleast_1d(dims.get("sigma_a", scalars.get("sigma_a")))
    n = np.atleast_1d(dims.get("n_tokens", scalars.get("n_tokens")))
    return np.unique(np.stack(np.meshgrid(sa, n, indexing="ij"), -1).reshape(-1, 2), axis=0)
