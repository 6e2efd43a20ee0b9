"""``phasefield gram ...``: the full-Gram mean field (causal mask, any initial Gram), the
exact-softmax map and the softmax-derivative correction (docs/beyond.md)."""

from __future__ import annotations

import click

from .common import UsageError, echo_json, option, point_hparams, point_options

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
        sigma_w, sigma_a, alpha, alpha_a, alpha_m, sigma_v, n_tokens, depth, activation=activation, attention=attention
    )


def _check_input(q0, rho0, n):
    option("--q0", q0, 0.0, 1e6, lo_open=True)
    option("--rho0", rho0)
    if not -1.0 / (n - 1) <= rho0 <= 1.0:
        raise UsageError(f"--rho0 must lie in [-1/(n-1), 1] (got {rho0:g})")


def register(cli):
    @cli.group("gram")
    def gram_group():
        """Full-Gram mean field: causal attention, two-group inputs, exact softmax."""

    @gram_group.command("trajectory")
    @_point
    @click.option("--q0", type=float, default=1.0, show_default=True, help="input squared norm / d")
    @click.option("--rho0", type=float, default=0.3, show_default=True, help="input token cosine")
    @click.option(
        "--rho-inter",
        type=float,
        default=None,
        help="two-group input (paper Eq. 12): cosine across the groups (--rho0 inside)",
    )
    def trajectory(
        sigma_w,
        sigma_a,
        alpha,
        alpha_a,
        alpha_m,
        sigma_v,
        n_tokens,
        depth,
        activation,
        attention,
        causal,
        as_json,
        q0,
        rho0,
        rho_inter,
    ):
        """Per-layer token norms and cosines (per position with --causal)."""
        hp = _hp(sigma_w, sigma_a, alpha, alpha_a, alpha_m, sigma_v, n_tokens, depth, activation, attention)
        _check_input(q0, rho0, n_tokens)
        import numpy as np

        gram = _engine().gram

        if rho_inter is not None:
            option("--rho-inter", rho_inter)
            if not -1.0 <= rho_inter <= rho0:
                raise UsageError(f"--rho-inter must lie in [-1, --rho0] (got {rho_inter:g})")
            intra, inter = gram.two_group_trajectory(hp, q0, rho0, rho_inter, depth, causal=causal)
            res = dict(
                layer=list(range(depth + 1)),
                intra=np.asarray(intra),
                inter=np.asarray(inter),
                ratio=np.asarray(inter) / np.asarray(intra),
            )
            if as_json:
                echo_json(res)
            else:
                click.echo(f"{'layer':>5} {'intra':>9} {'inter':>9} {'ratio':>7}")
                for l_ in range(depth + 1):
                    click.echo(f"{l_:>5d} {res['intra'][l_]:>9.5f} {res['inter'][l_]:>9.5f} {res['ratio'][l_]:>7.4f}")
            return
        geo = gram.causal_geometry(hp, q0, rho0, depth, causal=causal)
        norms, cos = np.asarray(geo["norms"]), np.asarray(geo["cosines"])
        iu = np.triu_indices(n_tokens, 1)
        mean_prev = np.array([[c[i, :i].mean() if i else np.nan for i in range(n_tokens)] for c in cos])
        res = dict(
            layer=list(range(depth + 1)),
            causal=causal,
            norms=norms,
            cosines=cos,
            mean_cosine=cos[:, iu[0], iu[1]].mean(-1),
            mean_cosine_with_earlier=mean_prev,
        )
        if as_json:
            echo_json(res)
        else:
            click.echo(f"{'layer':>5} {'mean q':>9} {'mean rho':>9}   (per position: --json)")
            for l_ in range(depth + 1):
                click.echo(f"{l_:>5d} {norms[l_].mean():>9.5f} {res['mean_cosine'][l_]:>9.5f}")

    @gram_group.command("exponents")
    @_point
    @click.option(
        "--softmax-correction", is_flag=True, help="also lambda_g from (q0, rho0) with the query/key-path term"
    )
    @click.option("--q0", type=float, default=1.0, show_default=True)
    @click.option("--rho0", type=float, default=0.3, show_default=True)
    def exponents(
        sigma_w,
        sigma_a,
        alpha,
        alpha_a,
        alpha_m,
        sigma_v,
        n_tokens,
        depth,
        activation,
        attention,
        causal,
        as_json,
        softmax_correction,
        q0,
        rho0,
    ):
        """lambda_a and lambda_g(depth) of the full-Gram map (causal with --causal)."""
        hp = _hp(sigma_w, sigma_a, alpha, alpha_a, alpha_m, sigma_v, n_tokens, depth, activation, attention)
        _check_input(q0, rho0, n_tokens)
        gram = _engine().gram

        res = {k: float(v) for k, v in gram.causal_exponents(hp, causal=causal).items()}
        c0 = gram.symmetric_gram(n_tokens, q0, rho0 * q0)
        res["lambda_g_input"] = float(gram.gradient_exponent(hp, c0, depth, causal))
        if softmax_correction:
            res["lambda_g_input_corrected"] = float(
                gram.gradient_exponent(hp.replace(softmax_correction=True), c0, depth, causal)
            )
        res.update(n_tokens=n_tokens, depth=depth, causal=causal, attention=attention, q0=q0, rho0=rho0)
        if as_json:
            echo_json(res)
        else:
            for k in (
                "lambda_a",
                "lambda_a_spectral",
                "lambda_g_collapse",
                "lambda_g_input",
                "lambda_g_input_corrected",
            ):
                if k in res:
                    click.echo(f"{k:<24} = {res[k]:+.5f}")


def _engine():
    """The paper preset's closed-form engine (its full-Gram mean field: ``.gram``)."""
    from ..layers import registry

    return registry.lookup("paper").engine.namespace
