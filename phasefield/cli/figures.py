"""``phasefield figures`` and ``phasefield demo``."""

from __future__ import annotations

import os

import click

from .blockopt import PRESET_LIST, block_option, given, resolve
from .common import UsageError, output

FIGURES_BYTES = 256 << 20  # free space a figures/demo run needs (PNG, PDF, sweep.nc, sim.nc)


def _check_out(out):
    """A directory we can write about 256 MiB to, checked before any work (a full disk
    otherwise fails deep inside HDF5)."""
    output(out, kind="dir", need_bytes=FIGURES_BYTES)


def _check_file(path, flag):
    if path is not None and not os.path.isfile(path):
        raise UsageError(f"{flag}: no such file: {path}")


def _block_diagram(out, quick, from_path, sim_path, block_spec, axis_texts, depth, n_tokens):
    """``figures --block SPEC --axis A --axis B``: :func:`phasefield.figures.blocks.block_phase_diagram`."""
    for flag, v in (("--quick", quick), ("--from", from_path), ("--sim", sim_path)):
        if v:
            raise UsageError(f"{flag} is for the paper's figures, not a --block phase diagram")
    name, fixed, axes = resolve(block_spec, axis_texts, {}, extra_axes=("depth",), grid=True, causal=True)
    from ..figures.blocks import block_phase_diagram

    paths = block_phase_diagram(name, axes, fixed, out, n_tokens=n_tokens, depth=depth)
    click.echo(f"wrote {', '.join(paths[:-1])} and {paths[-1]}")


def _paper_figures(out, quick, from_path, sim_path):
    """The paper's figures: :func:`phasefield.figures.make_figures`."""
    for opt in given("depth", "n_tokens"):
        raise UsageError(
            f"--{opt.replace('_', '-')} sets a --block diagram's theory; the paper's figures use their own settings"
        )
    _check_out(out)
    _check_file(from_path, "--from")
    _check_file(sim_path, "--sim")
    from ..figures import load_inputs, make_figures

    theory, sim = load_inputs(from_path, sim_path, echo=click.echo)
    if theory is not None and "alpha_sigma_w" not in theory and "sigma_a_alpha" not in theory:
        raise UsageError(f"{from_path}: no (alpha, sigma_w) or (sigma_a, alpha) theory grid")
    res = make_figures(out, quick=quick, from_path=from_path, sim_path=sim_path, echo=click.echo, inputs=(theory, sim))
    n = len([p for p in res["paths"] if p.endswith(".png")])
    click.echo(f"wrote {n} figures (PNG + PDF) to {out} in {res['seconds']:.0f} s")


@click.command("figures")
@click.option("--out", "-o", required=True, help="output directory (PNG, PDF and the .nc data)")
@click.option("--quick", is_flag=True, help="coarse grids and small simulations (a few minutes on a CPU)")
@click.option(
    "--from", "from_path", default=None, metavar="SWEEP.nc", help="redraw from a saved theory file (no recomputation)"
)
@click.option(
    "--sim",
    "sim_path",
    default=None,
    metavar="SIM.nc",
    help="saved simulations (default with --from: sim.nc beside it, if any)",
)
@block_option(
    default=None,
    axes=True,
    help=f"draw the phase diagram of this block (a preset: {PRESET_LIST}; NAME:k=v,... or a JSON "
    "file) over two --axis instead of the paper's figures",
)
@click.option("--depth", type=int, default=16, show_default=True, help="blocks L of a --block diagram")
@click.option("--n-tokens", type=int, default=32, show_default=True, help="tokens n of a --block diagram")
def figures_cmd(out, quick, from_path, sim_path, block_spec, axis_texts, depth, n_tokens):
    """The paper's figures 2-6 and the phase diagram, as PNG and PDF in OUT.

    Without --from the theory is swept and the simulations run (full settings: about
    9 min on 2 CPU cores; --quick: about 3 min); the datasets are saved to OUT/sweep.nc
    and OUT/sim.nc, so `phasefield figures --from OUT/sweep.nc --out NEW` redraws them.

    With --block and two --axis: the phase diagram (angle rate, gradient rate) of any block
    over two of its numbers (or one and depth), OUT/phase_<block>.png and its data
    OUT/phase_<block>.nc, e.g. `figures --block pre-ln --axis sigma=0.3:2:16 --axis
    alpha=0.1:1:16 --out OUT`; a causal block (pre-ln:causal=true, gpt2, llama) draws the
    last token's rates (angle_rate_last, lambda_g_last).
    """
    if block_spec is not None or axis_texts:
        return _block_diagram(out, quick, from_path, sim_path, block_spec or "paper", axis_texts, depth, n_tokens)
    _paper_figures(out, quick, from_path, sim_path)


@click.command("demo")
@click.option("--out", "-o", default="out/demo", show_default=True, help="output directory")
@click.option("--full", is_flag=True, help="full settings (about 9 min on 2 cores) instead of quick")
def demo_cmd(out, full):
    """Theory sweep, a quick finite-width check and every figure (CPU, a few minutes),
    then a summary: where lambda_a = lambda_g = 0 and the theory-vs-simulation
    agreement. Also written to OUT/summary.txt and OUT/summary.json."""
    _check_out(out)
    from ..figures import demo, settings

    demo.run(out, settings=settings.FULL if full else settings.QUICK, echo=click.echo)


def register(cli):
    cli.add_command(figures_cmd)
    cli.add_command(demo_cmd)
