"""``phasefield block exponents|sweep``: any block (a preset, ``NAME:key=value,...`` or a
JSON spec file) — its rates and exponents at one point; ``block sweep`` is the alias of
``phasefield sweep`` (:mod:`phasefield.cli.sweep`), its phase diagram over its numbers."""
from __future__ import annotations

import click

from .common import check, echo_json, option

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

    @block.command("exponents")
    @click.option("--block", "spec_text", required=True, help=BLOCK_HELP)
    @click.option("--depth", type=float, default=16, show_default=True, help="blocks L, [1, 10000]")
    @_geometry_options
    @click.option("--json", "as_json", is_flag=True, help="one JSON object (NaN as null)")
    def exponents(spec_text, depth, n_tokens, q0, rho0, as_json):
        """Finite-depth rates from the input geometry (q0, rho0) and, where the block has a
        finite fixed point, the exponents lambda_a, lambda_g_inf. ``lambda_g_input`` is
        lambda_g(L) from (q0, rho0), ``lambda_g_collapsed`` from collapsed tokens of norm q0;
        ``phasefield exponents`` reports the paper block's lambda_g(L) from its collapsed
        fixed point (``lambda_g_collapse``), another quantity."""

        import numpy as np

        from .. import layers
        from ..layers import spec

        name, kw = _spec(spec_text)
        option("--depth", depth, 1, 10_000, integer=True)
        n = _check_geometry(n_tokens, q0, rho0)
        blk = spec.build(name, kw)
        r = layers.rates(blk, q0=q0, rho0=rho0, n_tokens=n, depth=int(depth))
        res = dict(block=name, **{k: v for k, v in kw.items()}, n_tokens=n, depth=int(depth), q0=q0, rho0=rho0,
                   lambda_g_input=float(r["lambda_g"]),
                   **{k: float(r[k]) for k in ("angle_rate", "lambda_g_collapsed", "lambda_a",
                                               "lambda_g_inf", "q_star", "rho_star", "rho_star_min",
                                               "rho_star_max")}, n_stable=int(r["n_stable"]),
                   rho_L=float(r["rho"][-1]), q_L=float(r["q"][-1]),
                   q=[float(v) for v in np.asarray(r["q"])], rho=[float(v) for v in np.asarray(r["rho"])])
        fixed = res["has_fixed_point"] = r["has_fixed_point"]
        res["phase"] = _phase(res["lambda_a"] if fixed else res["angle_rate"], res["lambda_g_input"])
        if as_json:
            echo_json(res)
            return
        L = int(depth)
        click.echo(f"block        = {name} {', '.join(f'{k}={v}' for k, v in kw.items())}")
        click.echo(f"angle_rate   = {res['angle_rate']:+.6f}   ((1/L) log[(1-rho_L)/(1-rho_0)], rho_0 -> 1, L = {L})")
        click.echo(f"lambda_g_input = {res['lambda_g_input']:+.6f}   (L = {L}, from q0 = {q0:g}, rho0 = {rho0:g})")
        click.echo(f"rho_L, q_L   = {res['rho_L']:.6g}, {res['q_L']:.6g}")
        if fixed:
            click.echo(f"lambda_a     = {res['lambda_a']:+.6f}   (exponent at the collapsed fixed point, q* = {res['q_star']:.6g})")
            click.echo(f"lambda_g_inf = {res['lambda_g_inf']:+.6f}   (at rho_star = {res['rho_star']:.6g})")
            if res["n_stable"] > 1:
                click.echo(f"attractors   = {res['n_stable']} stable cosines in [{res['rho_star_min']:.6g}, "
                           f"{res['rho_star_max']:.6g}] (multistable: the start geometry picks one)")
        else:
            click.echo("no finite fixed point (the norm grows with depth): the rates above are "
                       "finite-depth rates, not exponents")
        click.echo(f"phase        = {res['phase']}")

    from .sweep import sweep_command
    block.add_command(sweep_command, "sweep")   # the alias of ``phasefield sweep`` (same command)
