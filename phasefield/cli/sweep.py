"""``phasefield sweep`` (and its alias ``phasefield block sweep``): the theory of any block on a
grid -> netCDF, through the one sweep :func:`phasefield.diagram.sweep`.

The paper block (no ``--block``, or ``--block paper[:...]``) takes its numbers as ``--sigma-w``,
``--alpha`` ... (each a range, a list or a number) or as ``--axis NAME=...``; any other block
takes ``--axis NAME=...`` over the numbers of its preset (``phasefield.layers.spec.NUMBERS``).
``--depth`` and ``--n-tokens`` are a number or a range (an axis) for every block.
"""

from __future__ import annotations

import os

import click
import numpy as np

from .blockopt import PRESET_LIST, parse_axes
from .common import UsageError, check, check_hparams_values, option, output, parse_range

BLOCK_HELP = (
    f"a preset ({PRESET_LIST}), NAME:key=value,... "
    '(e.g. pre-ln:sigma=0.55,alpha=0.2,heads=12) or a JSON file {"block": NAME, ...}; default paper'
)
PAPER_FLAGS = ("sigma_w", "sigma_a", "alpha", "alpha_a", "alpha_m", "sigma_v")
PAPER_STATIC = ("activation", "mlp_layers", "residual", "attention", "softmax_correction")
GENERIC_POINTS_MAX = 1 << 20  # the layers evaluator: ~ms a point


def _flag(k):
    return "--" + k.replace("_", "-")


def _options(f):
    opts = [
        click.option("--block", "spec_text", default=None, help=BLOCK_HELP),
        click.option(
            "--axis",
            "axes",
            multiple=True,
            help="NAME=start:stop:count or NAME=a,b,c: a number of the block (or depth, n_tokens) "
            "as an axis; repeat for more",
        ),
        click.option("--sigma-w", default=None, help="paper block: start:stop:count, a,b,c or x [1.0]"),
        click.option("--sigma-a", default=None, help="paper block [1.0]"),
        click.option("--alpha", default=None, help="paper block: sets alpha_a = alpha_m (one axis)"),
        click.option("--alpha-a", default=None, help="paper block [0.5]"),
        click.option("--alpha-m", default=None, help="paper block [0.5]"),
        click.option("--sigma-v", default=None, help="paper block [1.0]"),
        click.option("--n-tokens", default=None, help="tokens n: a number or a range (an axis) [32]"),
        click.option("--depth", default=None, help="blocks L: a number or a range (an axis) [16]"),
        click.option("--activation", default=None, help="paper block: tanh, erf, relu, gelu or linear [tanh]"),
        click.option("--mlp-layers", type=int, default=None, help="paper block: [1, 16] [1]"),
        click.option("--residual", default=None, help="paper block: unit-norm or identity [unit-norm]"),
        click.option("--attention", default=None, help="paper block: paper or exact [paper]"),
        click.option(
            "--softmax-correction",
            is_flag=True,
            default=None,
            help="paper block: the softmax-derivative path in the backward map (λ_g^∞)",
        ),
        click.option("--q0", type=float, default=None, help="other blocks: input squared norm per component [1]"),
        click.option("--rho0", type=float, default=None, help="other blocks: input token cosine [0.5]"),
        click.option(
            "--chunk",
            type=int,
            default=None,
            help="points per compiled chunk [paper: 65536; other blocks: 1024, 64 integrating the exact map per point]",
        ),
        click.option("--out", "-o", required=True, help="output netCDF file (.nc)"),
        click.option("--progress/--quiet", default=True, show_default=True, help="progress bar"),
        click.option("--figure", default=None, help="other blocks: PNG of the phase diagram (two axes)"),
        click.option("--sim", default=None, help="with --figure: rows of scripts/validate_blocks.py to draw"),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _put(values, where, key, arr, src):
    if key in values:
        raise UsageError(f"{key} is given twice ({where[key]} and {src})")
    values[key], where[key] = arr, src


@click.command("sweep")
@_options
def sweep_command(spec_text, axes, n_tokens, depth, q0, rho0, chunk, out, progress, figure, sim, **paper):
    """The theory of any block on a grid -> netCDF (xarray). Interrupted sweeps resume from
    OUT.chunks/. The paper block (default) gives lambda_a, lambda_g_collapse,
    lambda_g_inf, q_star, rho_star ...; any other block angle_rate, lambda_g_input,
    lambda_g_collapse, lambda_a, rho_L, q_L."""
    from .. import grid

    name, kw = ("paper", {}) if spec_text is None else _spec(spec_text)
    parsed = parse_axes(axes)
    option("--chunk", chunk, 1, grid.CHUNK_MAX, integer=True)
    for k, text in (("n_tokens", n_tokens), ("depth", depth)):
        if text is not None:
            if k in parsed:
                raise UsageError(f"{k} is both an --axis and {_flag(k)}")
            parsed[k] = parse_range(text, k)
    from ..layers import registry

    if registry.lookup(name).fast_engine:  # the closed-form evaluator (phasefield.diagram)
        return _paper(kw, parsed, chunk, out, progress, q0, rho0, figure, sim, **paper)
    given = [_flag(k) for k, v in paper.items() if v is not None]
    if given:
        raise UsageError(
            f"{', '.join(given)}: options of the paper block; block {name} takes --axis NAME=... over its numbers"
        )
    return _generic(name, kw, parsed, chunk, out, progress, q0, rho0, figure, sim)


def _spec(text):
    from ..layers import spec

    return check(spec.parse, text)


def _generic(name, kw, parsed, chunk, out, progress, q0, rho0, figure, sim):
    from .. import grid, io
    from ..layers import sweep as layers_sweep

    check_hparams_values({k: parsed[k] for k in ("n_tokens", "depth") if k in parsed})
    q0 = 1.0 if q0 is None else q0
    rho0 = 0.5 if rho0 is None else rho0
    option("--q0", q0, 0.0, 1e6, lo_open=True)
    n_min = float(parsed["n_tokens"].min()) if "n_tokens" in parsed else 32.0
    option("--rho0", rho0, -1.0 / (n_min - 1), 1.0)
    scalars = {k: int(parsed.pop(k)[0]) for k in ("n_tokens", "depth") if k in parsed and parsed[k].size == 1}
    if set(kw) & set(parsed):
        raise UsageError(f"{', '.join(sorted(set(kw) & set(parsed)))}: both in --block and an --axis")
    check(layers_sweep.check, name, parsed, kw)
    npts = check(grid.check_grid, [len(v) for v in parsed.values()], 8 * 8)
    if npts > GENERIC_POINTS_MAX:
        raise UsageError(f"sweeps of block {name} take at most {GENERIC_POINTS_MAX:,} points (got {npts:,})")
    if figure is not None and len(parsed) != 2:
        raise UsageError("--figure needs two axes")
    if sim is not None and figure is None:
        raise UsageError("--sim draws on --figure; give both")
    output(out, need_bytes=2 * len(layers_sweep.VARIABLES) * 8 * npts)
    if figure is not None:
        output(figure, "--figure")
    rows = None
    if sim is not None:
        if not os.path.isfile(sim):
            raise UsageError(f"--sim {sim}: no such file")
        try:
            with open(sim) as f:
                rows = [io.loads_json(line, f"line {i + 1}") for i, line in enumerate(f) if line.strip()]
        except (OSError, ValueError) as exc:
            raise UsageError(f"--sim {sim}: {exc}") from None
    ds = _run(out, block=(name, kw), axes=parsed, q0=q0, rho0=rho0, chunk_size=chunk, progress=progress, **scalars)
    if ds is not None and figure is not None:
        from ..figures.blocks import phase_diagram

        base = os.path.splitext(os.path.basename(figure))[0]
        phase_diagram(ds, os.path.dirname(os.path.abspath(figure)), base, sim=rows)
        click.echo(f"wrote {figure}")


def _paper(kw, parsed, chunk, out, progress, q0, rho0, figure, sim, **flags):
    from .. import HParams, grid
    from ..layers import registry

    evaluator = registry.lookup("paper").engine.namespace.sweep  # the paper block's grid evaluator
    PAPER_NUMBERS, VARIABLES = evaluator.PAPER_NUMBERS, evaluator.VARIABLES

    for opt, v in (("--q0", q0), ("--rho0", rho0), ("--figure", figure), ("--sim", sim)):
        if v is not None:
            raise UsageError(
                f"{opt} is an option of the other blocks (the paper block's sweep starts from its "
                f"collapsed fixed point; its figures: phasefield figures)"
            )
    values, where = {}, {}
    for k, v in kw.items():
        if k in PAPER_NUMBERS:
            _put(values, where, k, np.array([float(v)]), "--block")
    for k in PAPER_FLAGS:
        if flags[k] is not None:
            _put(values, where, k, parse_range(flags[k], k), _flag(k))
    for k, v in parsed.items():
        if k not in PAPER_NUMBERS and k not in ("n_tokens", "depth"):
            raise UsageError(
                f"block paper has no number {k!r} to sweep; it has {', '.join(PAPER_NUMBERS + ('n_tokens', 'depth'))}"
            )
        _put(values, where, k, v, "--axis" if k not in ("n_tokens", "depth") else "--axis or " + _flag(k))
    static = {k: kw[k] for k in PAPER_STATIC if k in kw}
    for k in PAPER_STATIC:
        if flags[k] is not None:
            if k in static:
                raise UsageError(f"{k} is given twice (--block and {_flag(k)})")
            static[k] = flags[k]
    static = dict(
        dict(activation="tanh", mlp_layers=1, residual="unit-norm", attention="paper", softmax_correction=False),
        **static,
    )
    try:
        weights = grid.branch_weights(
            values.pop("alpha", None),
            values.pop("alpha_a", None),
            values.pop("alpha_m", None),
            default=np.array([grid.DEFAULT_BRANCH_WEIGHT]),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    vals = dict(
        dict(
            sigma_w=np.array([1.0]),
            sigma_a=np.array([1.0]),
            sigma_v=np.array([1.0]),
            n_tokens=np.array([32.0]),
            depth=np.array([16.0]),
        ),
        **values,
        **weights,
    )
    check_hparams_values(vals)
    option("--mlp-layers", static["mlp_layers"], 1, 16, integer=True)
    try:
        HParams(**static).validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    total = check(grid.check_grid, [v.size for v in vals.values()], 8 * 8, "grid")
    if static["attention"] == "exact":  # the exact-softmax map integrates a logit grid per point
        per_chunk = min(total, chunk or 64)
        check(
            grid.check_memory,
            per_chunk * (25 << 20),
            f"a chunk of {per_chunk} points with --attention exact",
            "use a smaller --chunk",
        )
    # the file and, while it runs, the chunks: about 2 x 8 float64 per point
    output(out, need_bytes=2 * (len(VARIABLES) + 1) * 8 * total)
    # multi-valued axes are dimensions, single values scalar coordinates
    axes = {k: (v if v.size > 1 else float(v[0])) for k, v in vals.items()}
    if all(v.size == 1 for v in vals.values()):
        axes["sigma_w"] = vals["sigma_w"]
    _run(out, **axes, **static, chunk_size=chunk, progress=progress)


def _run(out, **kw):
    import time

    from .. import diagram

    d = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(d):
        raise UsageError(f"directory of --out does not exist: {d}")
    t0 = time.perf_counter()
    ds = diagram.sweep(**kw, out=out)
    dt = max(time.perf_counter() - t0, 1e-9)
    if ds is None:  # a multi-process sweep: another process assembles the file
        import jax

        click.echo(f"process {jax.process_index()}: chunks done; process 0 writes {out}")
        return None
    n = int(ds[next(iter(ds.data_vars))].size)
    click.echo(
        f"wrote {out}: {' x '.join(f'{k}={ds.sizes[k]}' for k in ds.dims) or 'one point'} "
        f"({n} points, {dt:.1f} s, {n / dt:,.0f} points/s)"
    )
    return ds
