"""``phasefield gram ...``: the full-Gram mean field (causal mask, any initial Gram), the
exact-softmax map and the softmax-derivative correction (docs/beyond.md)."""

from __future__ import annotations

import click

from .common import UsageError, echo_json, option, options, point_hparams, point_options

MAX_TOKENS = 128
MAX_DEPTH = 4096  # the full-Gram map is iterated L times on an n x n Gram


def _point(f):
    opts = [
        click.option("--activation", default="tanh", show_default=True),
        click.option(
            "--attention",
            type=click.Choice(["paper", "exact"]),
            default="paper",
            show_default=True,
            help="E[A A]: ratio of expectations or exact softmax",
        ),
        click.option("--causal", is_flag=True, help="causal attention mask"),
        click.option("--json", "as_json", is_flag=True, help="print one JSON object"),
    ]
    for o in reversed(opts):
        f = o(f)
    return point_options(n_tokens=16, depth=12)(f)


def _hp(sigma_w, sigma_a, alpha, alpha_a, alpha_m, sigma_v, n_tokens, depth, activation, attention):
    if not 2 <= n_tokens <= MAX_TOKENS:
        raise UsageError(f"--n-tokens must lie in [2, {MAX_TOKENS}] for the full-Gram map (got {n_tokens})")
    option("--depth", depth, 1, MAX_DEPTH, integer=True)
    return point_hparams(
        sigma_w=sigma_w,
        sigma_a=sigma_a,
        alpha=alpha,
        alpha_a=alpha_a,
        alpha_m=alpha_m,
        sigma_v=sigma_v,
        n_tokens=n_tokens,
        depth=depth,
        activation=activation,
        attention=attention,
    )


def _check_input(q0, rho0, n):
    option("--q0", q0, 0.0, 1e6, lo_open=True)
    option("--rho0", rho0)
    if not -1.0 / (n - 1) <= rho0 <= 1.0:
        raise UsageError(f"--rho0 must lie in [-1/(n-1), 1] (got {rho0:g})")


_TRAJECTORY_OPTIONS = (
    click.option("--q0", type=float, default=1.0, show_default=True, help="input squared norm / d"),
    click.option("--rho0", type=float, default=0.3, show_default=True, help="input token cosine"),
    click.option(
        "--rho-inter",
        type=float,
        default=None,
        help="two-group input (paper Eq. 12): cosine across the groups (--rho0 inside)",
    ),
)
_EXPONENTS_OPTIONS = (
    click.option(
        "--softmax-correction", is_flag=True, help="also lambda_g from (q0, rho0) with the query/key-path term"
    ),
    click.option("--q0", type=float, default=1.0, show_default=True),
    click.option("--rho0", type=float, default=0.3, show_default=True),
)
_NUMBERS = (
    "sigma_w",
    "sigma_a",
    "alpha",
    "alpha_a",
    "alpha_m",
    "sigma_v",
    "n_tokens",
    "depth",
    "activation",
    "attention",
)


@click.group("gram")
def gram_group():
    """Full-Gram mean field: causal attention, two-group inputs, exact softmax."""


@gram_group.command("trajectory")
@_point
@options(*_TRAJECTORY_OPTIONS)
def trajectory_cmd(causal, as_json, q0, rho0, rho_inter, **kw):
    """Per-layer token norms and cosines (per position with --causal)."""
    hp = _hp(*(kw[k] for k in _NUMBERS))
    _check_input(q0, rho0, hp.n_tokens)
    if rho_inter is not None:
        option("--rho-inter", rho_inter)
        if not -1.0 <= rho_inter <= rho0:
            raise UsageError(f"--rho-inter must lie in [-1, --rho0] (got {rho_inter:g})")
    res = _engine().gram.geometry_report(hp, q0, rho0, rho_inter, hp.depth, causal=causal)
    if as_json:
        return echo_json(res)
    if rho_inter is not None:
        click.echo(f"{'layer':>5} {'intra':>9} {'inter':>9} {'ratio':>7}")
        for l_ in res["layer"]:
            click.echo(f"{l_:>5d} {res['intra'][l_]:>9.5f} {res['inter'][l_]:>9.5f} {res['ratio'][l_]:>7.4f}")
        return
    click.echo(f"{'layer':>5} {'mean q':>9} {'mean rho':>9}   (per position: --json)")
    for l_ in res["layer"]:
        click.echo(f"{l_:>5d} {res['norms'][l_].mean():>9.5f} {res['mean_cosine'][l_]:>9.5f}")


@gram_group.command("exponents")
@_point
@options(*_EXPONENTS_OPTIONS)
def exponents_cmd(causal, as_json, softmax_correction, q0, rho0, **kw):
    """lambda_a and lambda_g(depth) of the full-Gram map (causal with --causal)."""
    hp = _hp(*(kw[k] for k in _NUMBERS))
    _check_input(q0, rho0, hp.n_tokens)
    res = _engine().gram.exponents_report(hp, q0, rho0, causal=causal, softmax_correction=softmax_correction)
    res.update(n_tokens=hp.n_tokens, depth=hp.depth, causal=causal, attention=kw["attention"], q0=q0, rho0=rho0)
    if as_json:
        return echo_json(res)
    for k in ("lambda_a", "lambda_a_spectral", "lambda_g_collapse", "lambda_g_input", "lambda_g_input_corrected"):
        if k in res:
            click.echo(f"{k:<24} = {res[k]:+.5f}")


def register(cli):
    cli.add_command(gram_group)


def _engine():
    """The paper preset's closed-form engine (its full-Gram mean field: ``.gram``)."""
    from ..layers import registry

    return registry.lookup("paper").engine.namespace
