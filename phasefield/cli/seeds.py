"""``phasefield seeds rank-collapse|deepscalelm|sensitivity|figures``: the other seed theories."""

from __future__ import annotations

import os

import click
import numpy as np

from .common import UsageError, atomic_path, check, echo_json, option, output

DRAWS_MAX = 100_000
SEED_MAX = 2**31 - 1


def _check(cond, msg):
    if not cond:
        raise UsageError(msg)


def _draws(draws, allow_zero=True):
    if allow_zero and draws == 0:
        return
    option("--draws", draws, 2, DRAWS_MAX, integer=True, hint=" (or 0: formulas only)" if allow_zero else "")


def _memory(nbytes, what, hint):
    from .. import grid

    check(grid.check_memory, nbytes, what, hint)


def _figure_out(figure):
    if figure is not None:
        output(figure, "--figure", need_bytes=16 << 20)


def _figure(fn, path, **kw):
    with atomic_path(path) as tmp:
        base, ext = os.path.splitext(path)
        tmp_img = tmp + (ext or ".png")
        try:
            data = fn(tmp_img, **kw)
            os.replace(tmp_img, tmp)
        finally:
            if os.path.exists(tmp_img):
                os.remove(tmp_img)
    return data


def register(cli):
    @cli.group("seeds")
    def seeds():
        """The other seed theories: rank-collapse gradients (Noci et al. 2022), DeepScaleLM
        moments (Kedia et al. 2024) and sensitivity (Catformer appendix). See docs/seeds.md."""

    @seeds.command("rank-collapse")
    @click.option("--sigma-x", type=float, default=1.0, show_default=True, help="token std")
    @click.option("--rho", type=float, default=0.0, show_default=True, help="token cosine")
    @click.option("--n-tokens", type=int, default=8, show_default=True)
    @click.option("--width", type=int, default=16, show_default=True, help="d = d_v = d_k")
    @click.option("--draws", type=int, default=256, show_default=True, help="autodiff draws (0: formulas only)")
    @click.option("--mode", type=click.Choice(["uniform", "softmax"]), default="uniform", show_default=True)
    @click.option("--seed", type=int, default=0, show_default=True)
    @click.option("--depth", type=int, default=16, show_default=True, help="forward recursion depth")
    @click.option(
        "--alpha-tilde", type=float, default=1.0, show_default=True, help="alpha^2 = alpha~/L for the forward recursion"
    )
    @click.option("--json", "as_json", is_flag=True, help="print one JSON object")
    @click.option("--figure", default=None, help="write the module's figure to this path")
    def rank_collapse(sigma_x, rho, n_tokens, width, draws, mode, seed, depth, alpha_tilde, as_json, figure):
        """Eqs. 17, 18, 47 and Lemmas 3.2-3.3 at one point, with an autodiff check."""
        option("--sigma-x", sigma_x, 0.0, 1000.0, lo_open=True)
        option("--rho", rho, 0.0, 1.0, hi_open=True)
        option("--n-tokens", n_tokens, 2, 4096, integer=True)
        option("--width", width, 1, 256, integer=True)
        _draws(draws)
        option("--seed", seed, 0, SEED_MAX, integer=True)
        # the alpha = 1 recursion grows as 4^L: float64 overflows beyond L ~ 500
        option("--depth", depth, 1, 256, integer=True)
        option("--alpha-tilde", alpha_tilde, 0.0, 100.0)
        _figure_out(figure)
        if draws:
            _memory(
                draws * 16 * 8 * n_tokens * (n_tokens + width),
                f"{draws:,} draws at --n-tokens {n_tokens} and --width {width}",
                "use fewer --draws or smaller sizes",
            )
        import jax

        from ..seeds import rank_collapse as rc

        n, d = n_tokens, width
        res = dict(
            sigma_x=sigma_x,
            rho=rho,
            n_tokens=n,
            width=d,
            mode=mode,
            value_eq17=float(rc.value_grad_gaussian(sigma_x, rho, n, d)),
            query_eq18=float(rc.query_grad_gaussian(sigma_x, rho, n, d)),
            query_exact=float(rc.query_grad_gaussian(sigma_x, rho, n, d, exact=True)),
            ratio=float(rc.grad_ratio(sigma_x, rho, n, d)),
            tau_eq47=float(rc.temperature(sigma_x, rho, n, d)) if rho < 1 else None,
        )
        if draws:
            mc = rc.mc_gradient_norms(
                jax.random.PRNGKey(seed), n=n, d=d, sigma_x=sigma_x, rho=rho, draws=draws, mode=mode
            )
            res.update({f"autodiff_{k}": v for k, v in mc.items() if not k.startswith("input_")})
        # forward recursion from input Gram geometry (q = sigma_x^2 d, cosine rho), expected
        F0 = n * d * sigma_x**2
        C0 = F0 * (1 + (n - 1) * rho)
        a = float(np.sqrt(alpha_tilde / depth))
        C, F = rc.forward_moments(C0, F0, n, a, a, depth)
        _, _, rho_inf = rc.depth_limit(C0, F0, n, alpha_tilde, alpha_tilde)
        res.update(
            depth=depth,
            alpha_tilde=alpha_tilde,
            rho_depth=float(rc.correlation(C[-1], F[-1], n)),
            rho_limit=float(rho_inf),
            rho_depth_alpha1=float(rc.correlation(*[v[-1] for v in rc.forward_moments(C0, F0, n, 1.0, 1.0, depth)], n)),
        )
        if figure:
            from ..seeds.figures import rank_collapse_figure

            _figure(rank_collapse_figure, figure, n=n, d=d, draws=max(draws, 16), seed=seed)
            res["figure"] = figure
        if as_json:
            echo_json(res)
        else:
            click.echo(f"E||dS/dW_V||^2  Eq.17 = {res['value_eq17']:.6g}")
            click.echo(f"E||dS/dW_Q||^2  Eq.18 = {res['query_eq18']:.6g}   exact = {res['query_exact']:.6g}")
            if draws:
                click.echo(
                    f"autodiff ({mode}): values {res['autodiff_value']:.6g} +- {res['autodiff_value_se']:.3g}, "
                    f"queries {res['autodiff_query']:.6g} +- {res['autodiff_query_se']:.3g}"
                )
            click.echo(f"ratio Q/V = {res['ratio']:.6g}   tau (Eq. 47) = {res['tau_eq47']:.6g}")
            click.echo(
                f"rho after {depth} blocks: alpha^2 = {alpha_tilde:g}/L: {res['rho_depth']:.4f} "
                f"(L->inf {res['rho_limit']:.4f}); alpha = 1: {res['rho_depth_alpha1']:.4f}"
            )

    @seeds.command("deepscalelm")
    @click.option("--arch", type=click.Choice(["pre-ln", "post-ln"]), default="pre-ln", show_default=True)
    @click.option(
        "--init", "init", type=click.Choice(["xavier", "dslm", "dslm-simple"]), default="xavier", show_default=True
    )
    @click.option("--layers", type=int, default=8, show_default=True)
    @click.option("--width", type=int, default=128, show_default=True)
    @click.option("--seq-len", type=int, default=32, show_default=True)
    @click.option("--dropout", type=float, default=0.1, show_default=True)
    @click.option("--k", "k", type=float, default=2.0, show_default=True, help="beta^2 = k / N^alpha")
    @click.option("--alpha-exp", type=float, default=1.0, show_default=True)
    @click.option("--scaling/--no-scaling", default=None, help="DSLM residual scaling (default: with dslm inits)")
    @click.option("--r0", type=float, default=0.2, show_default=True, help="input token correlation")
    @click.option(
        "--kappa",
        type=click.Choice(["auto", "iso"]),
        default="auto",
        show_default=True,
        help="token-covariance anisotropy at the attention inputs: the kappa closure or isotropic",
    )
    @click.option(
        "--ln-fluct",
        type=click.Choice(["auto", "on", "off"]),
        default="auto",
        show_default=True,
        help="LayerNorm backward: tracked norm fluctuation where validated / everywhere / chi^2",
    )
    @click.option("--draws", type=int, default=0, show_default=True, help="simulation draws (0: theory only)")
    @click.option("--seed", type=int, default=0, show_default=True)
    @click.option("--json", "as_json", is_flag=True)
    @click.option("--figure", default=None, help="write the module's figure to this path")
    def deepscalelm(
        arch,
        init,
        layers,
        width,
        seq_len,
        dropout,
        k,
        alpha_exp,
        scaling,
        r0,
        kappa,
        ln_fluct,
        draws,
        seed,
        as_json,
        figure,
    ):
        """Moments through a pre-LN / post-LN stack (theory; simulation with --draws)."""
        option("--layers", layers, 1, 1024, integer=True)
        option("--width", width, 4, 2048, integer=True)
        option("--seq-len", seq_len, 2, 4096, integer=True)
        option("--dropout", dropout, 0.0, 1.0, hi_open=True)
        option("--k", k, 0.0, 1e6, lo_open=True)
        option("--alpha-exp", alpha_exp, 0.0, 10.0)
        option("--r0", r0, 0.0, 1.0, hi_open=True)
        _draws(draws)
        option("--seed", seed, 0, SEED_MAX, integer=True)
        _figure_out(figure)
        if draws:
            _memory(
                draws * 4 * 8 * seq_len * (seq_len + 4 * width) + 8 * 8 * width * width,
                f"{draws:,} draws at --seq-len {seq_len} and --width {width}",
                "use fewer --draws or smaller sizes",
            )
        from ..seeds import deepscalelm as ds

        scaling = init.startswith("dslm") if scaling is None else scaling
        try:
            lam2, beta2 = ds.dslm_scaling(layers, k, alpha_exp) if scaling else (1.0, 1.0)
        except ValueError as exc:
            raise UsageError(f"{exc} (check --k, --alpha-exp, --layers)") from None
        theory_opts = dict(
            kappa="auto" if kappa == "auto" else None, ln_fluct={"auto": "auto", "on": True, "off": False}[ln_fluct]
        )

        def small(exc, hint):  # the library's message with the CLI's remedy
            return UsageError(str(exc).split(" (use ")[0] + f" ({hint})")

        try:
            th = ds.stack(arch, layers, width, seq_len, init, dropout, lam2, beta2, r0=r0, **theory_opts)
        except ValueError as exc:
            raise small(exc, "use a larger --width, or --ln-fluct off") from None
        if figure:  # the figure's own stacks, before any work
            from ..seeds.figures import DSLM_FIGURE_STACKS, deepscalelm_figure_theory

            try:
                for a, i in DSLM_FIGURE_STACKS:
                    deepscalelm_figure_theory(a, i, layers, width, seq_len, dropout)
            except ValueError as exc:
                raise small(exc, f"in the --figure stack {a}, {i}: use a larger --width") from None
        res = dict(
            arch=arch,
            init=init,
            layers=layers,
            width=width,
            seq_len=seq_len,
            dropout=dropout,
            lambda2=lam2,
            beta2=beta2,
            kappa_rule=kappa,
            ln_fluct=ln_fluct,
            theory={q: th[q] for q in ("var", "r", "g_var", "g_r", "kappa")},
        )
        if draws:
            import jax

            sim = ds.simulate_stack(
                jax.random.PRNGKey(seed),
                arch,
                layers,
                width,
                seq_len,
                init,
                dropout,
                lam2,
                beta2,
                r0=r0,
                draws=draws,
                kappa=theory_opts["kappa"],
            )
            res["sim"] = {q: sim[q] for q in ("var", "r", "g_var", "g_r", "kappa")}
            res["max_rel_err"] = {
                q: float(np.max(np.abs(th[q] - sim[q]) / np.abs(sim[q]))) for q in ("var", "r", "g_var")
            }
        if figure:
            from ..seeds.figures import deepscalelm_figure

            _figure(
                deepscalelm_figure, figure, layers=layers, d=width, L=seq_len, p=dropout, draws=max(draws, 2), seed=seed
            )
            res["figure"] = figure
        if as_json:
            echo_json(res)
        else:
            click.echo(
                f"{arch}, {init}, lambda^2 = {lam2:.4g}, beta^2 = {beta2:.4g}, kappa {kappa}, ln-fluct {ln_fluct}"
            )
            click.echo("sublayer    var        r      g_var" + ("   sim var   sim g_var" if draws else ""))
            for i in range(len(th["var"])):
                line = f"{i:8d} {th['var'][i]:8.4g} {th['r'][i]:8.4f} {th['g_var'][i]:10.4g}"
                if draws:
                    line += f" {res['sim']['var'][i]:9.4g} {res['sim']['g_var'][i]:10.4g}"
                click.echo(line)

    @seeds.command("sensitivity")
    @click.option(
        "--arch",
        default="pre-norm",
        show_default=True,
        help="feedforward, pre-norm, post-norm, no-norm, weighted-pre, weighted-post, "
        "rescalenet, admin, catformer, or 'block' (the seed-001 Block)",
    )
    @click.option("--depth", type=int, default=8, show_default=True)
    @click.option("--width", type=int, default=32, show_default=True)
    @click.option("--draws", type=int, default=256, show_default=True)
    @click.option("--alpha", type=float, default=0.5, show_default=True, help="weighted residuals: alpha")
    @click.option(
        "--norm", type=click.Choice(["deterministic", "layernorm"]), default="deterministic", show_default=True
    )
    @click.option("--method", type=click.Choice(["jvp", "fd"]), default="jvp", show_default=True)
    @click.option("--alpha-a", type=float, default=0.5, show_default=True, help="block: alpha_A")
    @click.option("--alpha-m", type=float, default=0.5, show_default=True, help="block: alpha_M")
    @click.option("--seed", type=int, default=0, show_default=True)
    @click.option("--json", "as_json", is_flag=True)
    @click.option("--figure", default=None, help="write the module's figure to this path")
    def sensitivity(arch, depth, width, draws, alpha, norm, method, alpha_a, alpha_m, seed, as_json, figure):
        """Measured sensitivity profile against its closed form (Definition 2 / Prop. 5)."""
        from ..seeds import sensitivity as sn

        _check(
            arch in sn.ARCHS + ("block",), f"unknown --arch {arch!r}; choose one of {', '.join(sn.ARCHS + ('block',))}"
        )
        option("--depth", depth, 1, 128, integer=True)
        option("--width", width, 2, 1024, integer=True)
        _draws(draws, allow_zero=False)
        option("--alpha", alpha, 0.0, 1.0, hi_open=True)
        for name, v in (("--alpha-a", alpha_a), ("--alpha-m", alpha_m)):
            option(name, v, 0.0, 1.0)
        option("--seed", seed, 0, SEED_MAX, integer=True)
        _figure_out(figure)
        _memory(
            draws * 4 * 8 * depth * width * (width + 8),
            f"{draws:,} draws at --depth {depth} and --width {width}",
            "use fewer --draws or smaller sizes",
        )
        import jax

        if arch == "block":
            S, se = sn.block_sensitivity(
                alpha_a, alpha_m, width=width, draws=draws, key=jax.random.PRNGKey(seed), method=method
            )
            res = dict(arch=arch, alpha_a=alpha_a, alpha_m=alpha_m, width=width, draws=draws, S=S, se=se)
        else:
            r = sn.profile(
                arch, depth, width, draws, key=jax.random.PRNGKey(seed), alpha=alpha, norm=norm, method=method
            )
            res = dict(
                arch=arch,
                depth=depth,
                width=width,
                draws=draws,
                norm=norm,
                method=method,
                S=r["S"],
                se=r["se"],
                theory=r["theory"],
            )
        if figure:
            from ..seeds.figures import sensitivity_figure

            _figure(sensitivity_figure, figure, depth=depth, width=width, draws=draws, seed=seed)
            res["figure"] = figure
        if as_json:
            echo_json(res)
        elif arch == "block":
            click.echo(f"S = {res['S']:.4f} +- {res['se']:.4f}")
        else:
            click.echo("layer   measured        se   closed form")
            for i in range(depth):
                click.echo(f"{i + 1:5d} {res['S'][i]:10.4f} {res['se'][i]:9.4f} {res['theory'][i]:12.4f}")

    @seeds.command("figures")
    @click.option("--out", "out", required=True, help="output directory")
    @click.option("--quick", is_flag=True, help="fewer draws and smaller sizes")
    def figures(out, quick):
        """Write the three seed figures (rank_collapse.png, deepscalelm.png, sensitivity.png)."""
        output(out, kind="dir", need_bytes=16 << 20)
        from ..seeds import figures as fg

        created = not os.path.exists(out)
        os.makedirs(out, exist_ok=True)
        try:
            _seed_figures(fg, out, quick)
        except BaseException:
            if created:
                from ..io import remove_empty_dirs

                remove_empty_dirs(out)
            raise


def _seed_figures(fg, out, quick):
    q = (
        dict(
            rank=dict(draws=32),
            dslm=dict(layers=2, d=32, L=8, draws=2),
            sens=dict(depth=4, width=8, draws=32, block_grid=2, block_draws=4),
        )
        if quick
        else dict(rank={}, dslm={}, sens={})
    )
    for name, fn, kw in (
        ("rank_collapse.png", fg.rank_collapse_figure, q["rank"]),
        ("deepscalelm.png", fg.deepscalelm_figure, q["dslm"]),
        ("sensitivity.png", fg.sensitivity_figure, q["sens"]),
    ):
        path = os.path.join(out, name)
        _figure(fn, path, **kw)
        click.echo(f"wrote {path}")
