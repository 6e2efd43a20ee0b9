"""``phasefield seeds rank-collapse|deepscalelm|sensitivity|figures``: the other seed theories.

Each command calls one function of :mod:`phasefield.seeds.reports` (which checks its inputs
before any work) and prints its result.
"""

from __future__ import annotations

import click

from .common import echo_json, options

FIGURE = click.option("--figure", default=None, help="write the module's figure to this path")


@click.group("seeds")
def seeds():
    """The other seed theories: rank-collapse gradients (Noci et al. 2022), DeepScaleLM
    moments (Kedia et al. 2024) and sensitivity (Catformer appendix). See docs/seeds.md."""


@seeds.command("rank-collapse")
@options(
    click.option("--sigma-x", type=float, default=1.0, show_default=True, help="token std"),
    click.option("--rho", type=float, default=0.0, show_default=True, help="token cosine"),
    click.option("--n-tokens", type=int, default=8, show_default=True),
    click.option("--width", type=int, default=16, show_default=True, help="d = d_v = d_k"),
    click.option("--draws", type=int, default=256, show_default=True, help="autodiff draws (0: formulas only)"),
    click.option("--mode", type=click.Choice(["uniform", "softmax"]), default="uniform", show_default=True),
    click.option("--seed", type=int, default=0, show_default=True),
    click.option("--depth", type=int, default=16, show_default=True, help="forward recursion depth"),
    click.option(
        "--alpha-tilde", type=float, default=1.0, show_default=True, help="alpha^2 = alpha~/L for the forward recursion"
    ),
    click.option("--json", "as_json", is_flag=True, help="print one JSON object"),
    FIGURE,
)
def rank_collapse(as_json, **kw):
    """Eqs. 17, 18, 47 and Lemmas 3.2-3.3 at one point, with an autodiff check."""
    from ..seeds import reports

    res = reports.rank_collapse(**kw)
    if as_json:
        return echo_json(res)
    click.echo(f"E||dS/dW_V||^2  Eq.17 = {res['value_eq17']:.6g}")
    click.echo(f"E||dS/dW_Q||^2  Eq.18 = {res['query_eq18']:.6g}   exact = {res['query_exact']:.6g}")
    if kw["draws"]:
        click.echo(
            f"autodiff ({res['mode']}): values {res['autodiff_value']:.6g} +- {res['autodiff_value_se']:.3g}, "
            f"queries {res['autodiff_query']:.6g} +- {res['autodiff_query_se']:.3g}"
        )
    click.echo(f"ratio Q/V = {res['ratio']:.6g}   tau (Eq. 47) = {res['tau_eq47']:.6g}")
    click.echo(
        f"rho after {res['depth']} blocks: alpha^2 = {res['alpha_tilde']:g}/L: {res['rho_depth']:.4f} "
        f"(L->inf {res['rho_limit']:.4f}); alpha = 1: {res['rho_depth_alpha1']:.4f}"
    )


@seeds.command("deepscalelm")
@options(
    click.option("--arch", type=click.Choice(["pre-ln", "post-ln"]), default="pre-ln", show_default=True),
    click.option(
        "--init", "init", type=click.Choice(["xavier", "dslm", "dslm-simple"]), default="xavier", show_default=True
    ),
    click.option("--layers", type=int, default=8, show_default=True),
    click.option("--width", type=int, default=128, show_default=True),
    click.option("--seq-len", type=int, default=32, show_default=True),
    click.option("--dropout", type=float, default=0.1, show_default=True),
    click.option("--k", "k", type=float, default=2.0, show_default=True, help="beta^2 = k / N^alpha"),
    click.option("--alpha-exp", type=float, default=1.0, show_default=True),
    click.option("--scaling/--no-scaling", default=None, help="DSLM residual scaling (default: with dslm inits)"),
    click.option("--r0", type=float, default=0.2, show_default=True, help="input token correlation"),
    click.option(
        "--kappa",
        type=click.Choice(["auto", "iso"]),
        default="auto",
        show_default=True,
        help="token-covariance anisotropy at the attention inputs: the kappa closure or isotropic",
    ),
    click.option(
        "--ln-fluct",
        type=click.Choice(["auto", "on", "off"]),
        default="auto",
        show_default=True,
        help="LayerNorm backward: tracked norm fluctuation where validated / everywhere / chi^2",
    ),
    click.option("--draws", type=int, default=0, show_default=True, help="simulation draws (0: theory only)"),
    click.option("--seed", type=int, default=0, show_default=True),
    click.option("--json", "as_json", is_flag=True),
    FIGURE,
)
def deepscalelm(as_json, **kw):
    """Moments through a pre-LN / post-LN stack (theory; simulation with --draws)."""
    from ..seeds import reports

    res = reports.deepscalelm(**kw)
    if as_json:
        return echo_json(res)
    th, sim = res["theory"], res.get("sim")
    click.echo(
        f"{res['arch']}, {res['init']}, lambda^2 = {res['lambda2']:.4g}, beta^2 = {res['beta2']:.4g}, "
        f"kappa {res['kappa_rule']}, ln-fluct {res['ln_fluct']}"
    )
    click.echo("sublayer    var        r      g_var" + ("   sim var   sim g_var" if sim else ""))
    for i in range(len(th["var"])):
        line = f"{i:8d} {th['var'][i]:8.4g} {th['r'][i]:8.4f} {th['g_var'][i]:10.4g}"
        if sim:
            line += f" {sim['var'][i]:9.4g} {sim['g_var'][i]:10.4g}"
        click.echo(line)


@seeds.command("sensitivity")
@options(
    click.option(
        "--arch",
        default="pre-norm",
        show_default=True,
        help="feedforward, pre-norm, post-norm, no-norm, weighted-pre, weighted-post, "
        "rescalenet, admin, catformer, or 'block' (the seed-001 Block)",
    ),
    click.option("--depth", type=int, default=8, show_default=True),
    click.option("--width", type=int, default=32, show_default=True),
    click.option("--draws", type=int, default=256, show_default=True),
    click.option("--alpha", type=float, default=0.5, show_default=True, help="weighted residuals: alpha"),
    click.option(
        "--norm", type=click.Choice(["deterministic", "layernorm"]), default="deterministic", show_default=True
    ),
    click.option("--method", type=click.Choice(["jvp", "fd"]), default="jvp", show_default=True),
    click.option("--alpha-a", type=float, default=0.5, show_default=True, help="block: alpha_A"),
    click.option("--alpha-m", type=float, default=0.5, show_default=True, help="block: alpha_M"),
    click.option("--seed", type=int, default=0, show_default=True),
    click.option("--json", "as_json", is_flag=True),
    FIGURE,
)
def sensitivity(as_json, **kw):
    """Measured sensitivity profile against its closed form (Definition 2 / Prop. 5)."""
    from ..seeds import reports

    res = reports.sensitivity(**kw)
    if as_json:
        echo_json(res)
    elif res["arch"] == "block":
        click.echo(f"S = {res['S']:.4f} +- {res['se']:.4f}")
    else:
        click.echo("layer   measured        se   closed form")
        for i in range(res["depth"]):
            click.echo(f"{i + 1:5d} {res['S'][i]:10.4f} {res['se'][i]:9.4f} {res['theory'][i]:12.4f}")


@seeds.command("figures")
@click.option("--out", "out", required=True, help="output directory")
@click.option("--quick", is_flag=True, help="fewer draws and smaller sizes")
def figures(out, quick):
    """Write the three seed figures (rank_collapse.png, deepscalelm.png, sensitivity.png)."""
    from ..seeds import reports

    reports.write_figures(out, quick, echo=click.echo)


def register(cli):
    cli.add_command(seeds)
