"""``phasefield simulate exponents|sweep`` and ``phasefield compare``."""
from __future__ import annotations

import os

import click
import numpy as np

from .common import (UsageError, atomic_path, check, echo_json, grid_options, grid_values, option,
                     output, point_hparams, point_options)

DTYPES = ("float32", "float64")
WIDTH_MAX = {"dense": 8192, "lazy": 65536}  # lazy keeps n x d slabs, not d x d matrices
SEEDS_MAX = 100_000
MLP_HIDDEN_MAX = 65_536


def _sim_options(f):
    opts = [
        click.option("--width", type=int, default=512, show_default=True, help=f"embedding width d [2, {WIDTH_MAX['dense']}] dense, [2, {WIDTH_MAX['lazy']}] lazy"),
        click.option("--seeds", type=int, default=16, show_default=True, help=f"independent draws [2, {SEEDS_MAX:,}]"),
        click.option("--seed", type=int, default=0, show_default=True, help="base random seed"),
        click.option("--causal", is_flag=True, help="causal attention mask"),
        click.option("--eps", type=float, default=1e-3, show_default=True,
                     help="1 - rho of the lambda_a input"),
        click.option("--mlp-hidden", type=int, default=None, help="MLP hidden width (default d)"),
        click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True),
        click.option("--activation", default="tanh", show_default=True),
        click.option("--mlp-layers", type=int, default=1, show_default=True, help="[1, 16]"),
        click.option("--residual", type=click.Choice(["unit-norm", "identity"]), default="unit-norm",
                     show_default=True),
        click.option("--weights", type=click.Choice(["lazy", "dense"]), default="lazy",
                     show_default=True, help="lazily sampled linear maps (exact in distribution, "
                     "O(n^2 d) per block) or every d x d matrix drawn (the reference)"),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _check_sim(width, seeds, eps, mlp_hidden, residual, seed=0, mlp_layers=1, weights="dense"):
    option("--width", width, 2, WIDTH_MAX[weights], integer=True, hint=f" with --weights {weights}")
    option("--seeds", seeds, 2, SEEDS_MAX, integer=True, hint=" (>= 2 to give a standard error)")
    option("--eps", eps, 0.0, 1.0, lo_open=True, hi_open=True)
    option("--mlp-hidden", mlp_hidden, 1, MLP_HIDDEN_MAX, integer=True)
    option("--seed", seed, 0, 2**31 - 1, integer=True)
    option("--mlp-layers", mlp_layers, 1, 16, integer=True)
    if residual != "unit-norm":
        raise UsageError("the exponents need the collapsed fixed point, which exists only for "
                         "--residual unit-norm")


def _check_memory(width, n_tokens, depth, mlp_hidden, dtype, points, weights):
    """The least memory of one draw (points vmapped together), before anything runs."""
    from .. import grid

    itemsize = 8 if dtype == "float64" else 4
    check(grid.check_memory, grid.simulation_bytes(width, n_tokens, depth, mlp_hidden, itemsize, points, weights),
          f"a simulation with --width {width}, --n-tokens {n_tokens}, --depth {depth}"
          + (f" ({points} points at once)" if points > 1 else ""),
          "use a smaller --width, --n-tokens, --depth" + (" or --chunk" if points > 1 else ""))


def register(cli):
    @cli.group("simulate")
    def simulate():
        """Finite-width simulations of random transformers (docs/theory.md §1, §6, §7)."""

    @simulate.command("exponents")
    @point_options()
    @_sim_options
    @click.option("--json", "as_json", is_flag=True, help="print one JSON object")
    def exponents(sigma_w, sigma_a, alpha, alpha_a, alpha_m, sigma_v, n_tokens, depth, width, seeds,
                  seed, causal, eps, mlp_hidden, dtype, activation, mlp_layers, residual, weights,
                  as_json):
        """Numerical lambda_a and lambda_g(depth) with standard errors at one point."""
        _check_sim(width, seeds, eps, mlp_hidden, residual, seed, mlp_layers, weights)
        hp = point_hparams(sigma_w, sigma_a, alpha, alpha_a, alpha_m, sigma_v, n_tokens, depth,
                           activation=activation, mlp_layers=int(mlp_layers), residual=residual)
        _check_memory(width, n_tokens, depth, mlp_hidden, dtype, 1, weights)
        import jax.numpy as jnp

        from ..simulate import measure

        res = measure.exponents(hp, width=width, seeds=seeds, eps=eps, causal=causal,
                                mlp_hidden=mlp_hidden, dtype=jnp.dtype(dtype), seed=seed,
                                weights=weights)
        res.update(width=width, seeds=seeds, depth=depth, n_tokens=n_tokens, causal=causal,
                   weights=weights)
        if as_json:
            echo_json(res)
        else:
            click.echo(f"lambda_a = {res['lambda_a']:+.4f} +- {res['lambda_a_se']:.4f}")
            click.echo(f"lambda_g = {res['lambda_g']:+.4f} +- {res['lambda_g_se']:.4f}  (L = {depth})")
            click.echo(f"q*       = {res['q_star']:.6g}")

    @simulate.command("sweep")
    @grid_options
    @_sim_options
    @click.option("--chunk", type=int, default=16, show_default=True,
                  help="points vmapped together (sharing their random draws)")
    @click.option("--out", "-o", required=True, help="output netCDF file")
    def sweep_cmd(sigma_w, sigma_a, alpha_a, alpha_m, alpha, sigma_v, n_tokens, depth, width, seeds,
                  seed, causal, eps, mlp_hidden, dtype, activation, mlp_layers, residual, weights,
                  chunk, out):
        """Simulated exponents on a grid, in the theory sweep's format plus *_se variables.

        Finished chunks are kept in OUT.parts/ and reused when the command is rerun."""
        _check_sim(width, seeds, eps, mlp_hidden, residual, seed, mlp_layers, weights)
        from .. import grid

        option("--chunk", chunk, 1, 4096, integer=True)
        vals = grid_values(sigma_w, sigma_a, alpha, alpha_a, alpha_m, sigma_v, n_tokens, depth)
        total = check(grid.check_grid, [v.size for v in vals.values()], 8 * 8, "simulated grid")
        _check_memory(width, int(vals["n_tokens"].max()), int(vals["depth"].max()), mlp_hidden, dtype,
                      min(chunk, total), weights)
        output(out, need_bytes=2 * 8 * 8 * total)
        from ..config import HParams

        base = HParams(activation=activation, mlp_layers=mlp_layers, residual=residual)
        base.validate()
        # every multi-valued axis is a dimension; single values are fixed (attributes)
        axes = {k: v for k, v in vals.items() if v.size > 1}
        fixed = {k: float(v[0]) for k, v in vals.items() if v.size == 1}
        if "alpha" in fixed:
            fixed["alpha_a"] = fixed["alpha_m"] = fixed.pop("alpha")
        base = base.replace(**fixed)
        if not axes:  # a single point: keep sigma_w as a length-1 dimension
            axes = {"sigma_w": vals["sigma_w"]}
        import jax.numpy as jnp

        from ..simulate import sweep as simsweep

        parts = os.fspath(out) + ".parts"
        ds = simsweep.sweep(width=width, seeds=seeds, eps=eps, causal=causal, mlp_hidden=mlp_hidden,
                            dtype=jnp.dtype(dtype), seed=seed, base=base, chunk=chunk,
                            parts_dir=parts, progress=True, weights=weights, **axes)
        with atomic_path(out) as tmp:
            ds.to_netcdf(tmp, engine="h5netcdf")
        import shutil

        shutil.rmtree(parts, ignore_errors=True)
        click.echo(f"wrote {out} ({' x '.join(f'{k}={ds.sizes[k]}' for k in ds.dims)} points)")

    @cli.command("compare")
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
