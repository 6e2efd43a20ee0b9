"""``phasefield sweep`` (and its alias ``phasefield block sweep``): the theory of any block on a
grid -> netCDF, through the one sweep :func:`phasefield.diagram.sweep`.

The paper block (no ``--block``, or ``--block paper[:...]``) takes its numbers as ``--sigma-w``,
``--alpha`` ... (each a range, a list or a number) or as ``--axis NAME=...``; any other block
takes ``--axis NAME=...`` over the numbers of its preset (``phasefield.layers.spec.NUMBERS``).
``--depth`` and ``--n-tokens`` are a number or a range (an axis) for every block. A causal
block (``NAME:causal=true``; ``gpt2``, ``llama`` unless ``causal=false``) takes ``--axis``
like any other block (the paper's too) and gives the last token's rates and the per-position
q_L_pos, rho_L_pos (dimension ``position``).
"""

from __future__ import annotations

import os

import click
import numpy as np

from .blockopt import PRESET_LIST, parse_axes
from .common import (
    MLP_LAYERS_MAX,
    PAPER_NUMBERS,
    PAPER_OPTIONS,
    UsageError,
    check,
    option,
    output,
    paper_option,
    parse_range,
)

BLOCK_HELP = (
    f"a preset ({PRESET_LIST}), NAME:key=value,... "
    '(e.g. pre-ln:sigma=0.55,alpha=0.2,heads=12) or a JSON file {"block": NAME, ...}; default paper'
)
GENERIC_POINTS_MAX = 1 << 20  # the layers evaluator: ~ms a point
EXACT_POINT_BYTES = 25 << 20  # the exact-softmax map integrates a logit grid per point


def _number_help(k, v):
    if k == "sigma_w":
        return f"paper block: start:stop:count, a,b,c or x [{v}]"
    if k == "alpha":
        return "paper block: sets alpha_a = alpha_m (one axis)"
    return f"paper block [{v}]"


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
        *(
            paper_option(k, default=None, type=str, show_default=False, help=_number_help(k, v))
            for k, v in PAPER_NUMBERS.items()
        ),
        paper_option(
            "n_tokens", default=None, type=str, show_default=False, help="tokens n: a number or a range (an axis) [32]"
        ),
        paper_option(
            "depth", default=None, type=str, show_default=False, help="blocks L: a number or a range (an axis) [16]"
        ),
        paper_option(
            "activation", default=None, show_default=False, help="paper block: tanh, erf, relu, gelu or linear [tanh]"
        ),
        paper_option("mlp_layers", default=None, show_default=False, help=f"paper block: [1, {MLP_LAYERS_MAX}] [1]"),
        paper_option(
            "residual", default=None, show_default=False, help="paper block: unit-norm or identity [unit-norm]"
        ),
        paper_option("attention", default=None, show_default=False, help="paper block: paper or exact [paper]"),
        paper_option(
            "softmax_correction",
            default=None,
            help="paper block: the softmax-derivative path in the backward map (λ_g^∞)",
        ),
        click.option("--q0", type=float, default=None, help="other blocks: input squared norm per component [1]"),
        click.option("--rho0", type=float, default=None, help="other blocks: input token cosine [0.5]"),
        click.option(
            "--chunk",
            type=int,
            default=None,
            help="points per compiled chunk [paper: 65536; other blocks: 1024, 64 integrating the exact map per "
            "point; causal blocks: as many as 128 MiB holds]",
        ),
        click.option("--out", "-o", required=True, help="output netCDF file (.nc)"),
        click.option("--progress/--quiet", default=True, show_default=True, help="progress bar"),
        click.option("--figure", default=None, help="other blocks: PNG of the phase diagram (two axes)"),
        click.option("--sim", default=None, help="with --figure: rows of scripts/validate_blocks.py to draw"),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@click.command("sweep")
@_options
def sweep_command(spec_text, axes, n_tokens, depth, q0, rho0, chunk, out, progress, figure, sim, **flags):
    """The theory of any block on a grid -> netCDF (xarray). Interrupted sweeps resume from
    OUT.chunks/. The paper block (default) gives lambda_a, lambda_g_collapse,
    lambda_g_inf, q_star, rho_star ...; any other block angle_rate, lambda_g_input,
    lambda_g_collapse, lambda_a, rho_L, q_L; a causal block (NAME:causal=true)
    angle_rate_last, lambda_g_last and, per position, q_L_pos, rho_L_pos."""
    from .. import diagram
    from ..layers import registry

    # The options are parsed here; their values, names and combinations are checked once, by
    # phasefield.diagram.sweep, before any work. Checked here: what only the command has
    # (--figure, --sim, the output file) and the limits it alone sets.
    block = check(diagram.block_of, "paper" if spec_text is None else spec_text)
    axes = parse_axes(axes)
    sizes = {k: parse_range(v, k) for k, v in (("n_tokens", n_tokens), ("depth", depth)) if v is not None}
    for k in ("n_tokens", "depth"):  # one value as an --axis: the number, as --n-tokens/--depth give it
        if k in axes and axes[k].size == 1 and k not in sizes:
            sizes[k] = axes.pop(k)
    given = {k: v for k, v in flags.items() if v is not None}
    run = dict(axes=axes, q0=q0, rho0=rho0, chunk_size=chunk, progress=progress)
    if registry.lookup(block[0]).fast_engine and not block.kw.get("causal"):  # the closed-form evaluator
        return _paper(block, given, sizes, run, out, figure, sim)
    return _generic(block, given, sizes, run, out, figure, sim)


def _scalars(values: dict) -> dict:
    """Single values as numbers (scalar coordinates), the others as arrays (dimensions)."""
    return {k: (float(v[0]) if isinstance(v, np.ndarray) and v.size == 1 else v) for k, v in values.items()}


def _generic(block, given, sizes, run, out, figure, sim):
    from .. import grid, io
    from ..layers import sweep as layers_sweep

    dims = [len(v) for v in run["axes"].values()] + [v.size for v in sizes.values() if v.size > 1]
    npts = grid.grid_size(dims)
    if npts > GENERIC_POINTS_MAX:
        raise UsageError(f"sweeps of block {block[0]} take at most {GENERIC_POINTS_MAX:,} points (got {npts:,})")
    if figure is not None and len(dims) != 2:
        raise UsageError("--figure needs two axes")
    if sim is not None and figure is None:
        raise UsageError("--sim draws on --figure; give both")
    causal = bool(block.kw.get("causal"))
    if sim is not None and causal:
        raise UsageError(
            f"--sim: its rows measure the (q, p) rates of blocks without the mask; block {block[0]} is causal "
            "(its diagram draws the last token's rates)"
        )
    per_point = len(layers_sweep.VARIABLES)
    if causal:  # two numbers and two values per position
        n_max = np.max(sizes.get("n_tokens", run["axes"].get("n_tokens", 32)))
        per_point = 2 + 2 * int(max(n_max, 1))
    output(out, need_bytes=2 * per_point * 8 * npts)
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
    ds = _run(out, block=block, **given, **_scalars(sizes), **run)
    if ds is not None and figure is not None:
        from ..figures.blocks import phase_diagram

        base = os.path.splitext(os.path.basename(figure))[0]
        phase_diagram(ds, os.path.dirname(os.path.abspath(figure)), base, sim=rows)
        click.echo(f"wrote {figure}")


def _paper(block, given, sizes, run, out, figure, sim):
    from .. import grid
    from ..layers import registry

    evaluator = registry.lookup("paper").engine.namespace.sweep  # the paper block's grid evaluator
    for opt, v in (("--figure", figure), ("--sim", sim)):
        if v is not None:
            raise UsageError(f"{opt} is an option of the other blocks (the paper block's figures: phasefield figures)")
    if "mlp_layers" in given:  # its lower end and type: the numbers class's check
        option("--mlp-layers", given["mlp_layers"], hi=MLP_LAYERS_MAX, integer=True)
    fixed = block.kw
    numbers = {k: parse_range(v, k) if k in PAPER_NUMBERS else v for k, v in given.items()}
    values = [v for v in (*numbers.values(), *run["axes"].values(), *sizes.values()) if isinstance(v, np.ndarray)]
    total = grid.grid_size(v.size for v in values)
    numbers, run["axes"] = _scalars(numbers), _scalars(run["axes"])
    given_at = [d for d in (fixed, numbers, run["axes"]) if "sigma_w" in d]
    if total == 1 and len(given_at) <= 1:  # one point: sigma_w stays a dimension (of one value)
        fixed = dict(fixed)
        sigma_w = given_at[0].pop("sigma_w") if given_at else PAPER_NUMBERS["sigma_w"]
        numbers["sigma_w"] = np.atleast_1d(float(sigma_w))
    if given.get("attention", fixed.get("attention", PAPER_OPTIONS["attention"])) == "exact":
        per_chunk = min(total, run["chunk_size"] or 64)  # a logit grid per point
        check(
            grid.check_memory,
            per_chunk * EXACT_POINT_BYTES,
            f"a chunk of {per_chunk} points with --attention exact",
            "use a smaller --chunk",
        )
    # the file and, while it runs, the chunks: about 2 x 8 float64 per point (a grid over the
    # library's limit is refused by it, naming its size)
    points = total if total <= grid.GRID_POINTS_MAX else 0
    output(out, need_bytes=2 * (len(evaluator.VARIABLES) + 1) * 8 * points)
    _run(out, block=block._replace(kw=fixed), **numbers, **_scalars(sizes), **run)


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
