"""``phasefield block exponents|sweep``: any block (a preset, ``NAME:key=value,...`` or a
JSON spec file) — its rates and exponents at one point, and its phase diagram over any two
of its numbers (or one number and depth)."""
from __future__ import annotations

import os

import click

from .common import UsageError, check, echo_json, option, output, parse_range

BLOCK_HELP = ("a preset (paper, pre-ln, post-ln, rms-swiglu, deepscalelm), NAME:key=value,... "
              "(e.g. pre-ln:sigma=0.55,alpha=0.2,heads=12) or a JSON file {\"block\": NAME, ...}")


def _spec(text):
    from ..layers import spec
    return check(spec.parse, text)


def _geometry_options(f):
    for o in reversed([
        click.option("--n-tokens", type=float, default=32, show_default=True, help="tokens n, [2, 1,000,000]"),
        click.option("--q0", type=float, default=1.0, show_default=True, help="input squared norm per component"),
        click.option("--rho0", type=float, default=0.5, show_default=True, help="input token cosine, [-1/(n-1), 1]"),
    ]):
        f = o(f)
    return f


def _check_geometry(n_tokens, q0, rho0):
    option("--n-tokens", n_tokens, 2, 1_000_000, integer=True)
    option("--q0", q0, 0.0, 1e6, lo_open=True)
    option("--rho0", rho0, -1.0 / (n_tokens - 1), 1.0)
    return int(n_tokens)


def _phase(angle, grad):
    a = "chaotic" if angle > 0 else "ordered" if angle < 0 else "edge"
    g = "exploding" if grad > 0 else "vanishing" if grad < 0 else "edge"
    return f"{a}/{g}"


def register(cli):
    @cli.group("block")
    def block():
        """Any block: its rates at one point (exponents) and phase diagrams (sweep)."""

    from .theory import exponents_options, run_exponents, EXPONENTS_HELP

    @block.command("exponents", help="The same command as `phasefield exponents` (an alias). " + EXPONENTS_HELP)
    @exponents_options
    def exponents(block_spec, q0, rho0, as_json, **kw):
        run_exponents(block_spec, q0, rho0, as_json, kw)

    @block.command("sweep")
    @click.option("--block", "spec_text", required=True, help=BLOCK_HELP)
    @click.option("--axis", "axes", multiple=True, required=True,
                  help="NAME=start:stop:count or NAME=a,b,c (one or two; NAME a number of the block or depth)")
    @click.option("--depth", type=float, default=16, show_default=True, help="blocks L (unless an axis)")
    @_geometry_options
    @click.option("--out", required=True, help="netCDF file")
    @click.option("--figure", default=None, help="PNG of the phase diagram (two axes)")
    @click.option("--sim", default=None, help="rows of scripts/validate_blocks.py to draw beside the theory")
    def sweep_cmd(spec_text, axes, depth, n_tokens, q0, rho0, out, figure, sim):
        """Rates over a grid of the block's numbers by name (xarray netCDF, optional figure)."""
        import json

        from .. import grid, io
        from ..layers import sweep

        name, kw = _spec(spec_text)
        option("--depth", depth, 1, 10_000, integer=True)
        n = _check_geometry(n_tokens, q0, rho0)
        parsed = {}
        for a in axes:
            key, eq, rng = a.partition("=")
            if not eq:
                raise UsageError(f"--axis expects NAME=start:stop:count, got {a!r}")
            key = key.strip().replace("-", "_")
            if key in parsed:
                raise UsageError(f"--axis {key} given twice")
            parsed[key] = parse_range(rng, f"--axis {key}")
        if len(parsed) > 2:
            raise UsageError("at most two --axis")
        fixed = {k: v for k, v in kw.items() if k not in parsed}
        if set(kw) & set(parsed):
            raise UsageError(f"{', '.join(sorted(set(kw) & set(parsed)))}: both in --block and an --axis")
        check(sweep.check, name, parsed, fixed)
        npts = check(grid.check_grid, [len(v) for v in parsed.values()], 8 * 8)
        if npts > 1 << 20:
            raise UsageError(f"block sweeps take at most {1 << 20:,} points (got {npts:,})")
        if figure is not None and len(parsed) != 2:
            raise UsageError("--figure needs two --axis")
        output(out)
        if figure is not None:
            output(figure)
        rows = None
        if sim is not None:
            if not os.path.isfile(sim):
                raise UsageError(f"--sim {sim}: no such file")
            try:
                with open(sim) as f:
                    rows = [json.loads(line) for line in f if line.strip()]
            except (OSError, ValueError) as exc:
                raise UsageError(f"--sim {sim}: {exc}") from None
        ds = sweep.sweep(name, parsed, fixed, n_tokens=n, depth=int(depth), q0=q0, rho0=rho0, progress=True)
        io.write_netcdf(ds, out)
        click.echo(f"wrote {out}")
        if figure is not None:
            from ..figures.blocks import phase_diagram
            base = os.path.splitext(os.path.basename(figure))[0]
            phase_diagram(ds, os.path.dirname(os.path.abspath(figure)), base, sim=rows)
            click.echo(f"wrote {figure}")

