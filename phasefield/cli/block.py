"""``phasefield block exponents|sweep``: any block (a preset, ``NAME:key=value,...`` or a
JSON spec file) — its rates and exponents at one point; ``block sweep`` is the alias of
``phasefield sweep`` (:mod:`phasefield.cli.sweep`), its phase diagram over its numbers."""

from __future__ import annotations

import click

from .common import check, option

BLOCK_HELP = (
    "a preset (paper, pre-ln, post-ln, rms-swiglu, deepscalelm), NAME:key=value,... "
    '(e.g. pre-ln:sigma=0.55,alpha=0.2,heads=12) or a JSON file {"block": NAME, ...}'
)


def _spec(text):
    from ..layers import spec

    return check(spec.parse, text)


def _geometry_options(f):
    for o in reversed(
        [
            click.option("--n-tokens", type=float, default=32, show_default=True, help="tokens n, [2, 1,000,000]"),
            click.option("--q0", type=float, default=1.0, show_default=True, help="input squared norm per component"),
            click.option(
                "--rho0", type=float, default=0.5, show_default=True, help="input token cosine, [-1/(n-1), 1]"
            ),
        ]
    ):
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

    from .theory import EXPONENTS_HELP, exponents_options, run_exponents

    @block.command("exponents", help="The same command as `phasefield exponents` (an alias). " + EXPONENTS_HELP)
    @exponents_options
    def exponents(block_spec, q0, rho0, as_json, **kw):
        run_exponents(block_spec, q0, rho0, as_json, kw)

    from .sweep import sweep_command

    block.add_command(sweep_command, "sweep")  # the alias of ``phasefield sweep`` (same command)
