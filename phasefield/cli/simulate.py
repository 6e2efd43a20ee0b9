"""``phasefield simulate exponents|sweep`` and ``phasefield compare``.

Without ``--block`` the commands simulate the paper block (``--sigma-w`` ... options, its
``lambda_a, lambda_g_collapse`` at the collapsed fixed point:
``phasefield.simulate.measure.fixed_point_exponents``); with ``--block SPEC`` any block
(``phasefield.simulate.measure.rates``: the quantities of its theory under the same names)."""

from __future__ import annotations

import os

import click
import numpy as np

from .blockopt import PRESET_LIST, parse_axes, refuse_causal
from .common import (
    MLP_LAYERS_MAX,
    PAPER_CONTEXT,
    PAPER_NUMBERS,
    UsageError,
    check,
    echo_json,
    grid_options,
    grid_values,
    option,
    output,
    paper_option,
    parse_range,
    point_hparams,
    point_options,
)

DTYPES = ("float32", "float64")
WIDTH_MAX = {"dense": 8192, "lazy": 65536}  # lazy keeps n x d slabs, not d x d matrices
SEEDS_MAX = 100_000
MLP_HIDDEN_MAX = 65_536


def _sim_options(f):
    opts = [
        click.option(
            "--width",
            type=int,
            default=512,
            show_default=True,
            help=f"embedding width d [2, {WIDTH_MAX['dense']}] dense, [2, {WIDTH_MAX['lazy']}] lazy",
        ),
        click.option(
            "--seeds",
            "--draws",
            "seeds",
            type=int,
            default=16,
            show_default=True,
            help=f"independent draws [2, {SEEDS_MAX:,}]",
        ),
        click.option("--seed", type=int, default=0, show_default=True, help="base random seed"),
        click.option("--causal", is_flag=True, help="causal attention mask"),
        click.option(
            "--eps",
            type=float,
            default=None,
            help="1 - rho of the nearby tokens of lambda_a (and angle_rate) [1e-3; 1e-4 with --block]",
        ),
        click.option("--mlp-hidden", type=int, default=None, help="MLP hidden width (default d)"),
        click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True),
        paper_option("activation", help=None),
        paper_option("mlp_layers", help=f"[1, {MLP_LAYERS_MAX}]"),
        paper_option("residual", type=click.Choice(["unit-norm", "identity"]), help=None),
        click.option(
            "--weights",
            type=click.Choice(["lazy", "dense"]),
            default="lazy",
            show_default=True,
            help="lazily sampled linear maps (exact in distribution, "
            "O(n^2 d) per block) or every d x d matrix drawn (the reference)",
        ),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _check_sim(width, seeds, eps, mlp_hidden, residual, seed=0, mlp_layers=1, weights="dense"):
    eps = 1e-3 if eps is None else eps
    option("--width", width, 2, WIDTH_MAX[weights], integer=True, hint=f" with --weights {weights}")
    option("--seeds", seeds, 2, SEEDS_MAX, integer=True, hint=" (>= 2 to give a standard error)")
    option("--eps", eps, 0.0, 1.0, lo_open=True, hi_open=True)
    option("--mlp-hidden", mlp_hidden, 1, MLP_HIDDEN_MAX, integer=True)
    option("--seed", seed, 0, 2**31 - 1, integer=True)
    option("--mlp-layers", mlp_layers, hi=MLP_LAYERS_MAX, integer=True)  # its lower end: the numbers class's
    if residual != "unit-norm":
        raise UsageError("the exponents need the collapsed fixed point, which exists only for --residual unit-norm")


def _check_memory(width, n_tokens, depth, mlp_hidden, dtype, points, weights):
    """The least memory of one draw (points vmapped together), before anything runs."""
    from .. import grid

    itemsize = 8 if dtype == "float64" else 4
    check(
        grid.check_memory,
        grid.simulation_bytes(width, n_tokens, depth, mlp_hidden, itemsize, points, weights),
        f"a simulation with --width {width}, --n-tokens {n_tokens}, --depth {depth}"
        + (f" ({points} points at once)" if points > 1 else ""),
        "use a smaller --width, --n-tokens, --depth" + (" or --chunk" if points > 1 else ""),
    )


# ---------------------------------------------------------------- any block (--block)
BLOCK_HELP = (
    f"simulate any block: a preset ({PRESET_LIST}), "
    "NAME:key=value,... (e.g. pre-ln:sigma=0.55,alpha=0.2,heads=12) or a JSON file "
    '{"block": NAME, ...}; its theory\'s quantities under the same names'
)
PAPER_ONLY = (
    "sigma_w",
    "sigma_a",
    "alpha",
    "alpha_a",
    "alpha_m",
    "sigma_v",
    "causal",
    "mlp_hidden",
    "activation",
    "mlp_layers",
    "residual",
)


def _block_options(f):
    for o in reversed(
        [
            click.option("--block", "spec_text", default=None, help=BLOCK_HELP),
            click.option("--q0", type=float, default=None, help="with --block: input squared norm per component [1]"),
            click.option("--rho0", type=float, default=None, help="with --block: input token cosine [0.5]"),
        ]
    ):
        f = o(f)
    return f


def _given(names) -> list:
    """The options among ``names`` given on the command line (not defaults)."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    return [n for n in names if ctx.get_parameter_source(n) not in (None, ParameterSource.DEFAULT)]


def _flag(name):
    return "--" + name.replace("_", "-")


def _block_setup(
    spec_text, q0, rho0, n_tokens, depth, width, seeds, seed, eps, weights, dtype, depth_axis=False, causal=False
):
    """Checked (name, keywords, n, depth, q0, rho0, eps) of a --block command; one-line
    UsageError for paper-only options and values out of range (``causal``: the command
    takes a causal block)."""
    from ..layers import spec
    from ..simulate import measure

    extra = _given(PAPER_ONLY)
    if extra:
        raise UsageError(
            f"{', '.join(_flag(n) for n in extra)}: options of the paper block; with --block "
            "give a block's numbers in its spec (e.g. --block paper:sigma_w=2)"
        )
    name, kw = check(spec.parse, spec_text)
    if not causal:
        refuse_causal(name, kw)  # its measurements are the (q, p) ones
    option("--width", width, 2, WIDTH_MAX[weights], integer=True, hint=f" with --weights {weights}")
    option("--seeds", seeds, 2, SEEDS_MAX, integer=True, hint=" (>= 2 to give a standard error)")
    option("--seed", seed, 0, 2**31 - 1, integer=True)
    eps = measure.GAP_EPS if eps is None else eps
    option("--eps", eps, 0.0, 1.0, lo_open=True, hi_open=True)
    n = parse_range(n_tokens, "n_tokens") if isinstance(n_tokens, str) else np.asarray([n_tokens])
    L = parse_range(depth, "depth") if isinstance(depth, str) else np.asarray([depth])
    if n.size != 1 or (L.size != 1 and not depth_axis):
        raise UsageError(
            "with --block, --n-tokens and --depth take one value each"
            + (" (sweep the depth with --axis depth=...)" if depth_axis else "")
        )
    n, L = float(n[0]), float(L[0])
    option("--n-tokens", n, 2, 4096, integer=True)
    option("--depth", L, 1, 10_000, integer=True)
    q0 = 1.0 if q0 is None else q0
    rho0 = 0.5 if rho0 is None else rho0
    option("--q0", q0, 0.0, 1e6, lo_open=True)
    option("--rho0", rho0, -1.0 / (n - 1), 1.0)
    _check_memory(width, int(n), int(L), 4 * int(width), dtype, 1, weights)
    return name, kw, int(n), int(L), float(q0), float(rho0), float(eps)


def _block_exponents(
    spec_text, q0, rho0, n_tokens, depth, width, seeds, seed, eps, weights, dtype, as_json, with_theory
):
    import jax.numpy as jnp

    from ..simulate import compare, measure

    name, kw, n, L, q0, rho0, eps = _block_setup(
        spec_text, q0, rho0, n_tokens, depth, width, seeds, seed, eps, weights, dtype, causal=True
    )
    if kw.get("causal"):
        return _causal_exponents(
            name, kw, n, L, q0, rho0, width, seeds, seed, eps, weights, dtype, as_json, with_theory
        )
    th = compare.theory((name, kw), n_tokens=n, depth=L, q0=q0, rho0=rho0)
    res = measure.rates(
        (name, kw),
        width=width,
        draws=seeds,
        n_tokens=n,
        depth=L,
        q0=q0,
        rho0=rho0,
        eps=eps,
        weights=weights,
        dtype=jnp.dtype(dtype),
        seed=seed,
        q_star=th["q_star"],
    )
    out = dict(
        block=name,
        spec=kw,
        width=width,
        draws=seeds,
        seed=seed,
        n_tokens=n,
        depth=L,
        q0=q0,
        rho0=rho0,
        eps=eps,
        weights=weights,
        dtype=dtype,
    )
    out.update({k: res[k] for k in measure.QUANTITIES + tuple(k + "_se" for k in measure.QUANTITIES)})
    out["q_star"] = res["q_star"]
    for k in ("q", "q_se", "rho", "rho_se"):
        out[k] = [float(v) for v in np.asarray(res[k])]
    if with_theory:
        out["theory"] = {k: th[k] for k in measure.QUANTITIES}
        out["z"] = compare.z_scores(res, th)
    if as_json:
        echo_json(out)
        return
    click.echo(
        f"block = {name} {', '.join(f'{k}={v}' for k, v in kw.items())}   (width {width}, "
        f"{seeds} draws, {weights} weights, n = {n}, L = {L}, q0 = {q0:g}, rho0 = {rho0:g})"
    )
    for k in measure.QUANTITIES:
        line = f"{k:<17} = {res[k]:+.4f} +- {res[k + '_se']:.4f}"
        if k == "lambda_a" and not np.isfinite(res[k]):
            line = f"{k:<17} = nan   (no finite collapsed fixed point)"
        if with_theory and np.isfinite(th[k]):
            line += f"   theory {th[k]:+.4f}  z = {out['z'][k]:+.1f}"
        click.echo(line)


def _causal_exponents(name, kw, n, L, q0, rho0, width, seeds, seed, eps, weights, dtype, as_json, with_theory):
    """``simulate exponents --block NAME:causal=true``: the per-position measurements
    (:func:`phasefield.simulate.causal_positions`), with the causal theory and z beside them."""
    import jax.numpy as jnp

    from .. import layers
    from ..layers import spec
    from ..simulate import causal_positions
    from ..simulate.compare import z_of
    from ..simulate.positions import POSITION_QUANTITIES

    block = spec.build(name, kw)
    sim = causal_positions(
        block,
        n_tokens=n,
        width=width,
        depth=L,
        draws=seeds,
        seed=seed,
        q0=q0,
        rho0=rho0,
        eps=eps,
        weights=weights,
        dtype=jnp.dtype(dtype),
    )
    out = dict(block=name, spec=kw, width=width, draws=seeds, seed=seed, n_tokens=n, depth=L, q0=q0, rho0=rho0)
    out.update(eps=eps, weights=weights, dtype=dtype)
    for k in POSITION_QUANTITIES:
        for key in (k, k + "_se"):
            out[key] = np.asarray(sim[key], float).tolist()
    if with_theory:
        th = {k: np.asarray(v, float) for k, v in layers.causal_rates(block, n, L, q0, rho0).items()}
        out["theory"] = {k: th[k].tolist() for k in POSITION_QUANTITIES}
        z = {}
        for k in POSITION_QUANTITIES:
            v = z_of(sim[k], sim[k + "_se"], th[k])
            if k == "rho_L_pos":  # position 0 has no earlier token: 0 by definition, no z
                v = np.where(np.arange(n) == 0, np.nan, v)
            z[k] = [None if not np.isfinite(x) else float(x) for x in np.atleast_1d(v)]
        out["z"] = {k: (v if k.endswith("_pos") else v[0]) for k, v in z.items()}
    if as_json:
        return echo_json(out)
    click.echo(
        f"block = {name} {', '.join(f'{k}={v}' for k, v in kw.items())}   (width {width}, "
        f"{seeds} draws, {weights} weights, n = {n}, L = {L}, q0 = {q0:g}, rho0 = {rho0:g}; per position)"
    )
    for k in ("angle_rate_last", "lambda_g_last"):
        line = f"{k:<16} = {out[k]:+.4f} +- {out[k + '_se']:.4f}"
        if with_theory:
            line += f"   theory {out['theory'][k]:+.4f}  z = {out['z'][k]:+.1f}"
        click.echo(line)
    click.echo("position  q_L_pos (+- se)   rho_L_pos (+- se)" + ("   theory q, rho" if with_theory else ""))
    for i in range(n):
        line = f"{i:>8}  {out['q_L_pos'][i]:.4f} ({out['q_L_pos_se'][i]:.4f})   "
        line += f"{out['rho_L_pos'][i]:+.4f} ({out['rho_L_pos_se'][i]:.4f})"
        if with_theory:
            line += f"   {out['theory']['q_L_pos'][i]:.4f}, {out['theory']['rho_L_pos'][i]:+.4f}"
        click.echo(line)


def _no_block_options(**given):
    bad = [k for k, v in given.items() if v not in (None, False)]
    if bad:
        raise UsageError(f"{', '.join(_flag(k) for k in bad)}: needs --block")


def _block_sweep(spec_text, axes, q0, rho0, n_tokens, depth, width, seeds, seed, eps, weights, dtype, out):
    import jax.numpy as jnp

    from .. import grid
    from ..simulate import sweep as simsweep

    if not axes:
        raise UsageError("--block needs at least one --axis NAME=start:stop:count")
    name, kw, n, L, q0, rho0, eps = _block_setup(
        spec_text, q0, rho0, n_tokens, depth, width, seeds, seed, eps, weights, dtype, causal=True
    )
    parsed = parse_axes(axes)  # checked with the block by simsweep.rates_grid, before any work
    total = check(grid.check_grid, [len(v) for v in parsed.values()], 8 * 8, "simulated grid")
    if "depth" in parsed:
        _check_memory(width, n, int(max(parsed["depth"])), 4 * int(width), dtype, 1, weights)
    output(out, need_bytes=2 * 8 * 16 * total)
    ds = check(
        simsweep.rates_grid,
        name,
        parsed,
        kw,
        n_tokens=n,
        depth=L,
        q0=q0,
        rho0=rho0,
        width=width,
        draws=seeds,
        eps=eps,
        weights=weights,
        dtype=jnp.dtype(dtype),
        seed=seed,
        out=out,
        progress=True,
    )
    _wrote(out, ds)


def _wrote(out, ds):
    """The line a simulated sweep ends with (the driver wrote ``out``, or, on a multi-host
    process other than 0, stored its chunks for process 0 to write)."""
    if ds is None:
        import jax

        click.echo(f"process {jax.process_index()}: chunks done; process 0 writes {out}")
        return
    click.echo(f"wrote {out} ({' x '.join(f'{k}={ds.sizes[k]}' for k in ds.dims)} points)")


_THEORY = click.option(
    "--theory", "with_theory", is_flag=True, help="with --block: also the theory's values and z = (sim - theory)/se"
)
_CHUNK = click.option(
    "--chunk", type=int, default=16, show_default=True, help="points vmapped together (sharing their random draws)"
)
_AXIS = click.option(
    "--axis",
    "axes",
    multiple=True,
    help="with --block: NAME=start:stop:count or NAME=a,b,c (a number of the block or depth)",
)


@click.group("simulate")
def simulate():
    """Finite-width simulations of random transformers (docs/theory.md §1, §6, §7)."""


@simulate.command("exponents")
@point_options()
@_sim_options
@_block_options
@_THEORY
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def exponents_cmd(n_tokens, depth, width, seeds, seed, causal, eps, mlp_hidden, dtype, weights, as_json, **kw):
    """Numerical lambda_a and lambda_g(depth) of the paper block with standard errors at
    one point; with --block, any block's angle_rate, lambda_g_input, lambda_g_collapse,
    lambda_a, rho_L, q_L (the names of its theory) with standard errors."""
    if kw["spec_text"] is not None:
        return _block_exponents(
            kw["spec_text"],
            kw["q0"],
            kw["rho0"],
            n_tokens,
            depth,
            width,
            seeds,
            seed,
            eps,
            weights,
            dtype,
            as_json,
            kw["with_theory"],
        )
    _no_block_options(q0=kw["q0"], rho0=kw["rho0"], theory=kw["with_theory"])
    eps = 1e-3 if eps is None else eps
    _check_sim(width, seeds, eps, mlp_hidden, kw["residual"], seed, kw["mlp_layers"], weights)
    hp = point_hparams(
        n_tokens=n_tokens,
        depth=depth,
        **{k: kw[k] for k in PAPER_NUMBERS},
        activation=kw["activation"],
        mlp_layers=int(kw["mlp_layers"]),
        residual=kw["residual"],
    )
    _check_memory(width, n_tokens, depth, mlp_hidden, dtype, 1, weights)
    import jax.numpy as jnp

    from ..layers import presets
    from ..simulate import measure

    res = measure.fixed_point_exponents(
        presets.paper(hp, mult=1.0 if mlp_hidden is None else mlp_hidden / width),
        n_tokens=int(hp.n_tokens),
        depth=int(hp.depth),
        width=width,
        draws=seeds,
        eps=eps,
        causal=causal,
        dtype=jnp.dtype(dtype),
        seed=seed,
        weights=weights,
    )
    res.update(width=width, seeds=seeds, depth=depth, n_tokens=n_tokens, causal=causal, weights=weights)
    if as_json:
        return echo_json(dict(res))
    click.echo(f"lambda_a          = {res['lambda_a']:+.4f} +- {res['lambda_a_se']:.4f}")
    click.echo(
        f"lambda_g_collapse = {res['lambda_g_collapse']:+.4f} +- {res['lambda_g_collapse_se']:.4f}  (L = {depth})"
    )
    click.echo(f"q*       = {res['q_star']:.6g}")


@simulate.command("sweep")
@grid_options
@_sim_options
@_CHUNK
@_block_options
@_AXIS
@click.option("--out", "-o", required=True, help="output netCDF file")
def sweep_cmd(width, seeds, seed, causal, eps, mlp_hidden, dtype, weights, chunk, spec_text, q0, rho0, axes, out, **kw):
    """Simulated exponents on a grid, in the theory sweep's format plus *_se variables;
    with --block and --axis, any block's quantities in the block sweep's format (the same
    variable names) plus *_se.

    Finished chunks (points) are kept in OUT.parts/ and reused when the command is rerun."""
    if spec_text is not None:
        if _given(("chunk",)):
            raise UsageError("--chunk: the paper block's sweep only (a block sweep runs point by point)")
        return _block_sweep(
            spec_text, axes, q0, rho0, kw["n_tokens"], kw["depth"], width, seeds, seed, eps, weights, dtype, out
        )
    _no_block_options(q0=q0, rho0=rho0, axis=axes or None)
    eps = 1e-3 if eps is None else eps
    _check_sim(width, seeds, eps, mlp_hidden, kw["residual"], seed, kw["mlp_layers"], weights)
    option("--chunk", chunk, 1, 4096, integer=True)
    vals = grid_values(**{k: kw[k] for k in (*PAPER_NUMBERS, *PAPER_CONTEXT)})
    axes, sizes, base = _paper_grid(vals, kw, width, mlp_hidden, dtype, chunk, weights, out)
    import jax.numpy as jnp

    from ..simulate import sweep as simsweep

    ds = simsweep.fixed_point_grid(
        ("paper", base),
        **sizes,
        width=width,
        draws=seeds,
        eps=eps,
        causal=causal,
        mlp_hidden=mlp_hidden,
        dtype=jnp.dtype(dtype),
        seed=seed,
        chunk=chunk,
        out=out,
        progress=True,
        weights=weights,
        **axes,
    )
    _wrote(out, ds)


def _paper_grid(vals, kw, width, mlp_hidden, dtype, chunk, weights, out):
    """(axes, sizes, checked fixed numbers) of the paper block's simulated grid, its size,
    memory and output checked: every multi-valued axis is a dimension, single values are
    fixed (attributes)."""
    from .. import grid

    total = check(grid.check_grid, [v.size for v in vals.values()], 8 * 8, "simulated grid")
    _check_memory(
        width, int(vals["n_tokens"].max()), int(vals["depth"].max()), mlp_hidden, dtype, min(chunk, total), weights
    )
    output(out, need_bytes=2 * 8 * 8 * total)
    axes = {k: v for k, v in vals.items() if v.size > 1}
    fixed = {k: float(v[0]) for k, v in vals.items() if v.size == 1}
    if "alpha" in fixed:
        fixed["alpha_a"] = fixed["alpha_m"] = fixed.pop("alpha")
    sizes = {k: fixed.pop(k) for k in ("n_tokens", "depth") if k in fixed}  # checked whole by fixed_point_grid
    static = {k: kw[k] for k in ("activation", "mlp_layers", "residual")}
    base = dict(fixed, **static)  # checked by simsweep.fixed_point_grid, before any work
    if not axes:  # a single point: keep sigma_w as a length-1 dimension
        axes = {"sigma_w": vals["sigma_w"]}
    return axes, sizes, base


@click.command("compare")
@click.argument("theory_nc")
@click.argument("sim_nc")
@click.option("--json", "as_json", is_flag=True, help="print the rows as JSON")
@click.option("--markdown", is_flag=True, help="print a Markdown table")
def compare(theory_nc, sim_nc, as_json, markdown):
    """Agreement table of a theory grid and a simulated grid: median, 90th percentile and
    maximum |sim - theory| of each common quantity, overall and by the theory's phase."""
    for name, path in (("THEORY_NC", theory_nc), ("SIM_NC", sim_nc)):
        if not os.path.isfile(path):
            raise UsageError(f"{name}: no such file: {path!r}")
    from ..simulate import compare as cmp

    rows = cmp.agreement(cmp.open_grid(theory_nc), cmp.open_grid(sim_nc))
    if as_json:
        echo_json(rows)
    elif markdown:
        click.echo(cmp.format_markdown(rows))
    else:
        click.echo(cmp.format_table(rows))


def register(cli):
    cli.add_command(simulate)
    cli.add_command(compare)
