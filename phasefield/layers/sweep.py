"""Grids over any numbers of a block, by name (``sigma``, ``alpha``, ``k``, ``sigma_w`` ...,
and ``depth``): the finite-depth rates and, where the block has a finite fixed point, the
angle exponent, as an ``xarray.Dataset``.

    from phasefield.layers import sweep
    ds = sweep.sweep_grid("pre-ln", {"sigma": np.linspace(0.1, 2, 64), "alpha": np.linspace(0.05, 1, 64)},
                     fixed={"heads": 12}, n_tokens=64, depth=16)

A sweep runs through the chunk driver of every sweep (:mod:`phasefield.driver`: chunk
store, resume, lock, sharding, multi-host, progress; ``phasefield.sweep(block=...)`` calls it
for every block but the paper's); a chunk is :func:`evaluate_chunk` of the sweep's
:func:`plan`. The block is built inside ``jax.vmap`` from the traced numbers (its pytree leaves), so one
compiled program serves a whole chunk of points; ``depth`` is the scan length (static): one
program per depth value. The tables the maps read are built once per sweep, outside the
trace (:func:`plan`), and each point reads its own by an index (:func:`evaluate_chunk`), as
the paper engine does: the standard blocks' branches read normalized tokens, so the MLP/GLU
Gaussian-integral kernels depend on the input scale sigma alone (one per distinct sigma)
and the exact map's and the softmax term's values on a cosine mesh on the logit scale and n
alone (one per distinct logit scale, :func:`mesh_tables`). ``mesh=False`` builds them per
point inside the trace (sized for the grid's corners, :func:`table_scales`) and integrates
the exact map per point: the reference path, the same numbers to ~1e-13.

The sweep knows no layer kind: it walks a block through its containers' ``children`` and
asks each leaf the questions of the layer protocol (:mod:`.base`: ``logit_scale``,
``logit_tables``, ``kernel_scale``, ``kernel_at``, ``prepare_for``, ``with_kernel``,
``with_logit_tables``); a layer without tables answers with the protocol's defaults.

    p = sweep.plan("pre-ln", {"attention": "exact"}, {"sigma": s, "alpha": a}, 16, [16])
    out = sweep.evaluate_chunk(p, {"sigma": flat_s, "alpha": flat_a}, 16)   # OUTPUTS -> arrays

A causal block (``NAME:causal=true``, or a decoder's preset: ``fixed["causal"]``) has no
(q, p) numbers: each point is :func:`phasefield.layers.causal.causal_rates_traced` on the
full Gram, vmapped over the chunk through the same plan, chunks and driver, and the dataset
holds :data:`CAUSAL_OUTPUTS`: ``angle_rate_last`` and ``lambda_g_last`` over the grid's
dimensions, ``q_L_pos`` and ``rho_L_pos`` over them and ``position`` (0 .. n - 1; with an
``n_tokens`` axis, up to the largest n, NaN past a point's own n). Its Gram maps read the
MLP/GLU kernels (built per distinct input scale as above) and no logit tables; a chunk holds
as many points as :data:`CAUSAL_CHUNK_BYTES` allows (:func:`causal_point_bytes`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from .. import schema
from ..theory.precision import float64
from . import depth as depth_fns
from . import registry, spec
from .state import Context, Kernel

OUTPUTS = ("angle_rate", "lambda_g_input", "lambda_g_collapse", "lambda_a", "rho_L", "q_L")  # a point's results
VARIABLES = {k: schema.NAMES[k] for k in OUTPUTS}
SYMBOLS = {k: schema.SYMBOLS[k] for k in OUTPUTS}
CAUSAL_OUTPUTS = ("angle_rate_last", "lambda_g_last", "q_L_pos", "rho_L_pos")  # a causal block's point
POSITION_OUTPUTS = ("q_L_pos", "rho_L_pos")  # a value per position (dimension ``position``)
CAUSAL_VARIABLES = {k: schema.NAMES[k] for k in CAUSAL_OUTPUTS}
# a causal chunk's working set (points x causal_point_bytes): small chunks run fastest on a CPU
# (pre-LN, exact map, n = 16, L = 16, one CPU device, warm: 43 CPU-ms a point in chunks of one
# point, 62-67 in chunks of 2-8; two devices, chunks of 2: 44 CPU-ms, 24 ms wall a point)
CAUSAL_CHUNK_BYTES = 128 << 20
MC_FIELDS = 4096  # the exact map's Monte-Carlo logit fields on the full Gram (a memory estimate)
CHUNK = 1024
MESH_TABLES = 97  # mesh of the per-logit-scale interpolants (the stable-point search's 33 reach
# rounding only up to sigma_A ~ 1; 97 nodes up to sigma_A = 4, tail <= 1e-13)
CHUNK_EXACT = 64  # the exact-softmax map and the softmax correction integrate a logit grid
# per point and layer (~30 MB a point): 1024 points would need ~30 GB


def map_leaves(layer, fn):
    """``layer`` with ``fn`` applied to every leaf layer (a layer without ``children``),
    through every container."""
    if layer.children():
        return layer.map_children(lambda x: map_leaves(x, fn))
    return fn(layer)


def leaf_layers(layer):
    out = []
    map_leaves(layer, lambda x: out.append(x) or x)
    return out


def block_scales(blocks) -> tuple:
    """(largest logit scale, largest kernel input scale: the MLP/GLU's) over concrete
    ``blocks``: tables sized for them serve every block of the list, so the prepared blocks
    share one pytree structure (stackable, vmappable)."""
    att, mlp = 0.0, 0.0
    for block in blocks:
        for leaf in leaf_layers(block):
            if (s := leaf.logit_scale()) is not None:
                att = max(att, float(s))
            if (s := leaf.kernel_scale()) is not None:
                mlp = max(mlp, float(s))
    return att, mlp


def table_scales(name, fixed, axes) -> tuple:
    """:func:`block_scales` over the corners of the grid ``axes`` of preset ``name``: the
    traced tables are sized for them, not for the defaults."""
    keys = [k for k in axes if k != "depth"]
    corners = itertools.product(*[(float(np.min(axes[k])), float(np.max(axes[k]))) for k in keys])
    return block_scales(spec.build(name, dict(fixed, **dict(zip(keys, c)))) for c in corners)


def prepare_traced(block, ctx, att_max, mlp_max, kernels=None):
    """``block`` with tables sized for scales up to (att_max, mlp_max), not for its own
    numbers (each leaf's ``prepare_for``): callable under a trace, and every block prepared
    with the same scales has the same pytree structure. ``kernels``: leaf position
    (:func:`leaf_layers` order) -> the kernel to attach there (gathered from a plan's
    per-scale tables) instead of building it."""
    kernels = kernels or {}
    pos = iter(range(1 << 30))

    def prep(leaf):
        i = next(pos)
        if i in kernels:
            return leaf.with_kernel(kernels[i])
        return leaf.prepare_for(ctx, att_max, mlp_max)

    return map_leaves(block, prep)


def _logit_scales(block, npts):
    """The logit scales of the leaves with logits at each of ``npts`` points (a block built
    from per-point arrays): ``[n_attention, npts]``."""
    return [
        np.broadcast_to(np.asarray(s, np.float64), (npts,))
        for s in (x.logit_scale() for x in leaf_layers(block))
        if s is not None
    ]


def _kernel_scales(block, npts):
    """(leaf position, input scale per point, leaf) of each leaf with a kernel: the number
    its tables depend on (the MLP/GLU's input scale; the output scale is a factor)."""
    out = []
    for i, leaf in enumerate(leaf_layers(block)):
        if (s := leaf.kernel_scale()) is not None:
            out.append((i, np.broadcast_to(np.asarray(s, np.float64), (npts,)), leaf))
    return out


def mesh_tables(name, fixed, keys, flat, n_tokens, att_max):
    """The exact map's (S_1, S_rho) and the softmax term's (T_1, T_rho) on a
    :data:`MESH_TABLES`-point cosine mesh (and at RHO0), once per distinct logit scale of the
    grid (as :func:`phasefield.diagram.build_exact_tables` does for the paper block; every
    scale by one compiled program, each mesh point on the grid its numbers need; more
    scales than SCALE_NODES[-1] read from the tables' interpolant in the scale,
    :func:`phasefield.theory.attention.exact_table.scale_tables`):
    ``(index per point, S [U, 2, M + 1], T [U, 2, M + 1], static)`` with
    ``static = (interp, interp_t)``, or None where they do not
    serve (no leaf reading logit tables, a point with two logit scales, interpolants that
    are not the maps to rounding). Valid at unit input norm (the attention of every preset
    reads normalized tokens when q0 = 1); the layer turns other norms into NaN. The leaves
    read them at the table sizes of ``prepare_for`` (sized for ``att_max``)."""
    from ..theory.attention import exact_table

    npts = len(flat[0]) if flat else 1
    # one block holding every point's numbers (the leaves are arrays): its logit scales at once
    block = spec.build(name, dict(fixed, **dict(zip(keys, flat))))
    if not any(x.logit_tables() for x in leaf_layers(block)):
        return None
    scales = _logit_scales(block, npts)
    if any(not np.array_equal(s_, scales[0]) for s_ in scales[1:]):
        return None  # two logit scales at a point: one table each would be needed
    uniq, index = np.unique(scales[0], return_inverse=True)
    s, t, interp, interp_t = exact_table.scale_tables(uniq, float(n_tokens))
    if not (interp or interp_t):
        return None
    return index.astype(np.int32), s, t, (interp, interp_t)


def _with_tables(block, idx, s, t, static):
    """``block`` with every leaf reading the logit tables at index ``idx`` of (``s``, ``t``)."""
    return map_leaves(block, lambda x: x.with_logit_tables(s[idx], t[idx], *static))


def _gathered_kernels(values, mlp) -> tuple[list, dict]:
    """(the values before the kernels, {leaf position: its kernels gathered for this point}):
    per kernel leaf position of ``mlp``, the last two values are its kernel index and the
    stacked kernels."""
    values = list(values)
    kernels = {}
    for pos in reversed(mlp):
        kidx, kerns = values.pop(-2), values.pop(-1)
        kernels[pos] = jax.tree_util.tree_map(lambda x: x[kidx], kerns)  # gathered per point
    return values, kernels


def _point(name, fixed, keys, n_tokens, depth, q0, rho0, scales=(None, None), tables=None, mlp=()):
    """The point function of values ``keys`` (then, with ``tables``, the logit mesh tables'
    index and (S, T); then, per kernel leaf position of ``mlp``, its kernel index and
    stacked kernels)."""

    def f(*values):
        values, kernels = _gathered_kernels(values, mlp)
        if tables is not None:
            *values, idx, s, t = values
        kw = dict(fixed, **dict(zip(keys, values)))
        block = spec.build(name, kw)
        if scales[0] is None:
            block = block.prepare(Context(n_tokens))
        else:
            block = prepare_traced(block, Context(n_tokens), *scales, kernels=kernels)
        if tables is not None:
            block = _with_tables(block, idx, s, t, tables)
        ctx = Context(jnp.asarray(n_tokens, jnp.result_type(float)))
        dt = jnp.result_type(float)
        k0 = Kernel(jnp.asarray(q0, dt), jnp.asarray(q0 * rho0, dt))
        fd = depth_fns.finite_depth(block, ctx, k0, depth)
        out = {k: fd[k] for k in OUTPUTS if k in fd}
        out["lambda_a"] = depth_fns.angle_exponent(block, ctx)
        return out

    return f


def causal_point_bytes(name: str, fixed: dict, n_tokens: int) -> int:
    """An estimate of one causal point's working set: its attention's pair weights
    ``[n, n, n, n]`` (the paper map) or its Monte-Carlo attention matrices ``[fields, n, n]``
    (where the maps integrate on a logit grid: the exact map, the softmax term), a few live
    copies (forward, backward, the angle rate's tangent)."""
    n = int(n_tokens)
    grid = any(x.logit_grid() for x in leaf_layers(spec.build(name, fixed)))
    return 8 * 8 * n * n * (n * n + (MC_FIELDS if grid else 0))


def causal_chunk(name: str, fixed: dict, n_tokens: int) -> int:
    """The points of a causal chunk: as many as :data:`CAUSAL_CHUNK_BYTES` holds (at least
    one, at most :data:`CHUNK`)."""
    return int(min(CHUNK, max(1, CAUSAL_CHUNK_BYTES // causal_point_bytes(name, fixed, n_tokens))))


def _causal_point(name, fixed, keys, n_tokens, depth, q0, rho0, scales=(None, None), mlp=()):
    """The causal point function of values ``keys`` (then, per kernel leaf position of
    ``mlp``, its kernel index and stacked kernels): :func:`.causal.causal_rates_traced` of the
    block with its MLP/GLU kernels (its Gram maps read no logit tables)."""
    from . import causal, gram

    def f(*values):
        values, kernels = _gathered_kernels(values, mlp)
        block = spec.build(name, dict(fixed, **dict(zip(keys, values))))
        if scales[1] is None:
            block = gram.prepare_kernels(block, Context(n_tokens))
        else:
            pos = iter(range(1 << 30))

            def prep(leaf):
                i = next(pos)
                if i in kernels:
                    return leaf.with_kernel(kernels[i])
                if leaf.kernel_scale() is None:
                    return leaf
                return leaf.with_kernel(leaf.kernel_at(leaf.kernel_scale(), scales[1]))

            block = map_leaves(block, prep)
        dt = jnp.result_type(float)
        ctx = Context(jnp.asarray(n_tokens, dt))
        return causal.causal_rates_traced(
            block, ctx, jnp.asarray(q0, dt), jnp.asarray(rho0, dt), n=int(n_tokens), depth=int(depth)
        )

    return f


@functools.lru_cache(maxsize=64)
def _compiled(name, fixed_items, keys, n_tokens, depth, q0, rho0, scales, tables=None, mlp=(), causal=False):
    if causal:
        f = _causal_point(name, dict(fixed_items), keys, n_tokens, depth, q0, rho0, scales, mlp)
    else:
        f = _point(name, dict(fixed_items), keys, n_tokens, depth, q0, rho0, scales, tables, mlp)
    axes = (0,) * len(keys) + ((0, None, None) if tables is not None else ()) + (0, None) * len(mlp)
    return jax.jit(jax.vmap(f, in_axes=axes))


@functools.cache
def _kernels_fn(template, mlp_max):
    """Compiled kernels of a vector of input scales for leaves like ``template`` (a leaf with
    its numbers zeroed: its static fields, hashable), as the per-point path builds them under
    the trace (tables sized for ``mlp_max``): the same numbers, built once per scale."""
    return jax.jit(jax.vmap(lambda s: template.kernel_at(s, mlp_max)))


def _template(leaf):
    """``leaf`` with every number 0: its static fields, the key of :func:`_kernels_fn`."""
    return jax.tree_util.tree_map(lambda _: 0.0, leaf)


def _padded(x, size):
    """``x`` with its last entry repeated to ``size`` entries (one program per padded size)."""
    return np.concatenate([x, np.repeat(x[-1:], size - len(x), axis=0)])


def _pow2(n, least=8):
    return max(least, 1 << (int(n) - 1).bit_length())


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """What a sweep computes once: the block's static numbers, the table scales, the logit
    mesh tables per distinct logit scale (``att``: distinct scales, S, T as device arrays,
    static) and the kernels (MLP/GLU) per distinct input scale (``mlp``: per leaf position,
    (distinct scales, stacked kernels)); ``chunk``: the preferred chunk size (points);
    ``causal``: a causal block (per-position results, :data:`CAUSAL_OUTPUTS`)."""

    name: str
    fixed: dict
    keys: tuple
    n_tokens: int
    depth_values: tuple
    q0: float
    rho0: float
    scales: tuple
    att: tuple | None
    mlp: tuple
    mesh: bool
    chunk: int
    causal: bool = False


@float64
def plan(
    name: str,
    fixed: dict,
    axes: dict,
    n_tokens: int,
    depth_values: list,
    q0: float = 1.0,
    rho0: float = 0.5,
    mesh: bool = True,
) -> Plan:
    """Everything computed once per sweep; ``axes``: number name -> 1-D values of the grid (no
    ``depth``). With ``mesh`` (default), the tables the points read are built here, once per
    distinct scale, outside any trace, and gathered per point by an index
    (:func:`evaluate_chunk`), as :func:`phasefield.sweep` does for the paper block: the leaves'
    kernels (MLP/GLU) once per distinct input scale, and, with leaves reading logit tables
    (the exact map, the softmax term) and q0 = 1, their values on a cosine mesh once per
    distinct logit scale (:func:`mesh_tables`).
    ``mesh=False``: every point builds its tables inside the trace and integrates the exact
    map (the reference path; same numbers to ~1e-13). A causal block (``fixed["causal"]``)
    gets the kernels alone (its Gram maps read no logit tables) and a chunk of
    :func:`causal_chunk` points."""
    causal = bool(fixed.get("causal"))
    keys = tuple(k for k in axes if k != "depth")
    grids = [np.asarray(axes[k], float) for k in keys]
    flat = [m.ravel() for m in np.meshgrid(*grids, indexing="ij")] if grids else []
    scales = table_scales(name, fixed, {k: axes[k] for k in keys})
    if float(q0) > 1.0:  # an attention reading the input (post-LN's first) sees sigma_A q0
        scales = (scales[0] * float(q0), scales[1])
    leaves = leaf_layers(spec.build(name, fixed))
    exact = any(x.logit_tables() for x in leaves)
    grid = any(x.logit_grid() for x in leaves)
    att, mlp = None, ()
    if flat and mesh:
        # distinct values per axis suffice: every table scale is a function of the numbers
        uniq_flat = [np.unique(g) for g in grids]
        ug = [m.ravel() for m in np.meshgrid(*uniq_flat, indexing="ij")]
        if exact and float(q0) == 1.0 and not causal:
            tab = mesh_tables(name, fixed, keys, ug, n_tokens, scales[0])
            if tab is not None:
                uniq = np.unique(_logit_scales(spec.build(name, dict(fixed, **dict(zip(keys, ug)))), len(ug[0]))[0])
                size = _pow2(len(uniq))
                att = (uniq, jnp.asarray(_padded(tab[1], size)), jnp.asarray(_padded(tab[2], size)), tab[3])
        out = []
        for pos, sig, leaf in _kernel_scales(spec.build(name, dict(fixed, **dict(zip(keys, ug)))), len(ug[0])):
            uniq = np.unique(sig)
            kern = _kernels_fn(_template(leaf), float(scales[1]))(jnp.asarray(_padded(uniq, _pow2(len(uniq)))))
            out.append((pos, uniq, kern))
        mlp = tuple(out)
    chunk = CHUNK_EXACT if grid and att is None else CHUNK  # mesh values: no logit grid per point
    if causal:
        chunk = causal_chunk(name, fixed, n_tokens)
    return Plan(
        name,
        dict(fixed),
        keys,
        int(n_tokens),
        tuple(int(d) for d in depth_values),
        float(q0),
        float(rho0),
        scales,
        att,
        mlp,
        bool(mesh),
        chunk,
        causal,
    )


def _index(uniq, x):
    """Positions of ``x`` in the sorted ``uniq`` (ValueError for a value off the plan's grid)."""
    idx = np.minimum(np.searchsorted(uniq, x), len(uniq) - 1)
    if not np.array_equal(uniq[idx], x):
        raise ValueError("evaluate_chunk: a value that is not on the plan's grid")
    return idx.astype(np.int32)


@float64
def evaluate_chunk(plan: Plan, values: dict, depth: int) -> dict:
    """``values``: number name -> flat per-point values (the driver pads the last chunk);
    returns :data:`OUTPUTS` name -> float64 array of the same length (a causal plan:
    :data:`CAUSAL_OUTPUTS`, those of :data:`POSITION_OUTPUTS` ``[points, n]``). The points
    read the plan's tables through per-point indices (computed here, on the host). No
    numbers (a grid of depth alone): one point."""
    p = plan
    names = CAUSAL_OUTPUTS if p.causal else OUTPUTS
    fixed_items = tuple(sorted(p.fixed.items()))
    if not p.keys:
        out = _compiled_point(p.name, fixed_items, p.n_tokens, int(depth), p.q0, p.rho0, p.causal)()
        return {v: np.asarray(out[v], np.float64)[None] for v in names}
    from ..driver import place_like  # a sharded chunk's placement (loaded with the driver)

    args = [values[k] if hasattr(values[k], "sharding") else jnp.asarray(values[k], jnp.float64) for k in p.keys]
    if p.att is not None or p.mlp:
        host = [np.asarray(a, np.float64) for a in args]
        block = spec.build(p.name, dict(p.fixed, **dict(zip(p.keys, host))))
        npts = len(host[0])
    if p.att is not None:
        uniq, s, t, _ = p.att
        args += [place_like(_index(uniq, _logit_scales(block, npts)[0]), args[0]), s, t]
    by_pos = {pos: sig for pos, sig, _ in _kernel_scales(block, npts)} if p.mlp else {}
    for pos, uniq, kern in p.mlp:
        args += [place_like(_index(uniq, by_pos[pos]), args[0]), kern]
    f = _compiled(
        p.name,
        fixed_items,
        p.keys,
        p.n_tokens,
        int(depth),
        p.q0,
        p.rho0,
        p.scales,
        None if p.att is None else p.att[3],
        tuple(pos for pos, _, _ in p.mlp),
        causal=p.causal,
    )
    out = f(*args)
    return {v: np.asarray(out[v], np.float64) for v in names}


@functools.lru_cache(maxsize=16)
def _compiled_point(name, fixed_items, n_tokens, depth, q0, rho0, causal=False):
    point = _causal_point if causal else _point
    return jax.jit(point(name, dict(fixed_items), (), n_tokens, depth, q0, rho0))


def check(name: str, axes: dict, fixed: dict) -> tuple[dict, list]:
    """(checked fixed keywords, depth values); ValueError (one line) for bad axes (``depth``
    and ``n_tokens`` may be axes too)."""
    nums = spec.NUMBERS.get(name)
    if nums is None:
        spec.check(name, {})
    depths = None
    for key, values in axes.items():
        values = np.asarray(values, float)
        if values.ndim != 1 or values.size == 0:
            raise ValueError(f"axis {key} must be a non-empty list of values")
        if key == "depth":
            if registry.lookup(name).stack_depth is not None:
                raise ValueError(
                    f"{name}'s depth sets its numbers (its option {registry.lookup(name).stack_depth!r}): "
                    "run one depth at a time"
                )
            depths = [int(v) for v in values]
            if any(v != int(v) or not 1 <= v <= 10_000 for v in values):
                raise ValueError("axis depth must hold integers in [1, 10000]")
            continue
        if key == "n_tokens":
            if any(v != int(v) or not 2 <= v <= 1_000_000 for v in values):
                raise ValueError("axis n_tokens must hold integers in [2, 1000000]")
            continue
        if key not in nums:
            raise ValueError(
                f"block {name} has no number {key!r} to sweep; it has {', '.join(list(nums) + ['depth', 'n_tokens'])}"
            )
        for v in (values.min(), values.max()):
            spec.check(name, dict(fixed, **{key: v}))
    fixed = spec.check(name, fixed)
    for key in axes:
        if key in fixed:
            raise ValueError(f"{key} is both an axis and a fixed value")
    return fixed, depths


Q0_MAX = 1e6  # the input's squared norm per component


def check_input(q0: float, rho0: float, n_tokens) -> None:
    """ValueError (one line) for an input geometry (q0, rho0) out of range at the token counts
    ``n_tokens`` (a number or the values of an axis): q0 in (0, Q0_MAX], rho0 in
    [-1/(n-1), 1] for the smallest n."""
    from .. import grid

    grid.check_option("q0", q0, 0.0, Q0_MAX, lo_open=True)
    grid.check_option("rho0", rho0, -1.0 / (float(np.min(n_tokens)) - 1.0), 1.0)


@float64
def sweep_grid(
    name: str,
    axes: dict,
    fixed: dict | None = None,
    n_tokens: int = 32,
    depth: int = 16,
    q0: float = 1.0,
    rho0: float = 0.5,
    chunk: int | None = None,
    progress: bool = False,
    mesh: bool = True,
    out=None,
    devices=None,
    wait: float = 24 * 3600.0,
    log=None,
):
    """The grid ``axes`` (name -> values; ``depth`` and ``n_tokens`` may be axes) of block
    ``name`` through the chunk driver (:mod:`phasefield.driver`: ``out`` -> chunk store,
    resume, lock, multi-host, atomic netCDF write; the chunk's points split over ``devices``,
    default every local device). Each chunk is :func:`evaluate_chunk` of the sweep's
    :func:`plan` (one per ``n_tokens``). With the exact map or the softmax term, ``mesh``
    (default) evaluates them from their values on a cosine mesh, computed once per distinct
    logit scale when q0 = 1 (:func:`mesh_tables`; the interpolants equal the maps to
    rounding, else the grid integrates them per point as ``mesh=False`` does; so does an
    attention reading tokens of norm != 1, at its own logit scale sigma_A q, on grids sized
    for the grid's largest logit scale, times q0 where q0 > 1: NaN beyond).
    A causal block (``fixed["causal"]``: ``NAME:causal=true``, a decoder's preset) gives
    :data:`CAUSAL_OUTPUTS` (module docstring), its chunks' memory checked first
    (:func:`phasefield.grid.check_memory`).
    ``phasefield.sweep(block=...)`` calls this for every block but the paper's (and for the
    paper's too where it is causal)."""

    from .. import driver, grid

    fixed, depths = check(name, axes, dict(fixed or {}))
    grid.check_values({"n_tokens": n_tokens, "depth": depth})
    check_input(q0, rho0, axes.get("n_tokens", n_tokens))
    num_keys = tuple(k for k in axes if k not in ("depth", "n_tokens"))
    grids = [np.asarray(axes[k], float) for k in num_keys]
    n_axis = "n_tokens" in axes
    n_list = [int(v) for v in np.asarray(axes["n_tokens"], float)] if n_axis else [int(n_tokens)]
    depth_list = depths if depths is not None else [int(depth)]
    # n_tokens and depth are static in a compiled chunk: outer axes, one slab per pair
    outer = {"n_tokens": np.asarray(n_list)} if n_axis else {}
    if depths is not None:
        outer["depth"] = np.asarray(depths)
    points = driver.Grid({**outer, **dict(zip(num_keys, grids))}, outer=("n_tokens", "depth"))
    causal = bool(fixed.get("causal"))
    n_max = max(n_list)
    variables = CAUSAL_VARIABLES if causal else VARIABLES
    symbols = {k: schema.SYMBOLS[k] for k in variables}
    shapes = {k: (n_max,) for k in POSITION_OUTPUTS} if causal else {}
    grid.check_grid(points.shape, 8 * sum(int(np.prod(shapes.get(k, ()))) for k in variables), "grid")
    if chunk is not None and not 1 <= int(chunk) <= grid.CHUNK_MAX:
        raise ValueError(f"chunk must lie in [1, {grid.CHUNK_MAX:,}] (got {chunk})")
    devices = list(devices) if devices is not None else jax.local_devices()
    ndev = len(devices) if grids else 1
    if causal:  # its memory checked before any work
        chunks = points.chunks(int(chunk or causal_chunk(name, fixed, n_max)), multiple=ndev)
        grid.check_memory(
            chunks.size * causal_point_bytes(name, fixed, n_max),
            f"a causal chunk of {chunks.size} points at n_tokens = {n_max}",
            "use fewer tokens or a smaller chunk",
        )
    plans = [plan(name, fixed, dict(zip(num_keys, grids)), n, depth_list, q0, rho0, mesh) for n in n_list]
    if not causal:
        chunks = points.chunks(int(chunk or plans[0].chunk), multiple=ndev)  # whole points per device

    def evaluate(c):
        i, j = divmod(chunks.slab(c), len(depth_list))
        values = points.values(chunks.index(c), inner=True)  # the last chunk padded by wrapping
        values = driver.shard({k: jnp.asarray(values[k]) for k in num_keys}, devices[:ndev])
        out = evaluate_chunk(plans[i], values, depth_list[j])
        for k in shapes:  # positions past this slab's n: NaN
            out[k] = np.pad(out[k], ((0, 0), (0, n_max - out[k].shape[-1])), constant_values=np.nan)
        return out

    store_spec = dict(
        source="phasefield.layers.sweep",
        block=name,
        fixed={k: (v if isinstance(v, (bool, int, float)) else str(v)) for k, v in fixed.items()},
        axes={k: g.tolist() for k, g in zip(num_keys, grids)},
        n_tokens=n_list,
        depth=depth_list,
        q0=float(q0),
        rho0=float(rho0),
        mesh=bool(mesh),
        chunk=chunks.size,
        version=1,
    )
    if causal:
        store_spec["outputs"] = list(variables)
    with driver.Driver(out, store_spec, log=log) as drv:
        results = drv.run(
            evaluate,
            chunks.count,
            chunks.span,
            points.size,
            tuple(variables),
            progress=progress,
            desc=f"{name} sweep",
            wait=wait,
            shapes=shapes,
        )
        if results is None:
            return None
        attrs = dict(
            block=name,
            q0=float(q0),
            rho0=float(rho0),
            **{f"fixed_{k}": (str(v) if isinstance(v, (str, bool)) else v) for k, v in fixed.items()},
        )
        if not n_axis:
            attrs["n_tokens"] = int(n_tokens)
        if depths is None:
            attrs["depth"] = int(depth)
        ds = points.dataset(
            results,
            {v: dict(long_name=variables[v], symbol=symbols[v]) for v in variables},
            attrs,
            coords={"position": ("position", np.arange(n_max))} if causal else None,
            trailing={k: ("position",) for k in shapes},
        )
        drv.write(ds)
        return ds
