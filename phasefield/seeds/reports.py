"""What each ``phasefield seeds`` command computes at one point, checked before any work.

Each function checks its inputs (one-line ``ValueError`` naming the command's option, e.g.
``--width``), the memory its draws need and that its figure can be written, then computes
the result as a JSON-ready dict and, given a ``figure`` path, draws the module's figure there
(key ``figure``). :func:`write_figures` writes the three figures into one folder.
"""

from __future__ import annotations

import os

import numpy as np

from .. import grid, io

DRAWS_MAX = 100_000
SEED_MAX = 2**31 - 1
FIGURE_BYTES = 16 << 20  # free space a figure needs
QUANTITIES = ("var", "r", "g_var", "g_r", "kappa")  # the DeepScaleLM moments reported


def _draws(draws, allow_zero=True) -> None:
    if allow_zero and draws == 0:
        return
    hint = " (or 0: formulas only)" if allow_zero else ""
    grid.check_option("--draws", draws, 2, DRAWS_MAX, integer=True, hint=hint)


def _figure_out(figure) -> None:
    if figure is not None:
        io.check_output(figure, "--figure", need_bytes=FIGURE_BYTES)


def write_figure(fn, path, **kw):
    """``fn(image_path, **kw)`` written atomically to ``path`` (its extension, or .png, names
    the format); returns what ``fn`` returns (the data it plotted)."""
    with io.atomic_path(path) as tmp:
        ext = os.path.splitext(path)[1]
        tmp_img = tmp + (ext or ".png")
        try:
            data = fn(tmp_img, **kw)
            os.replace(tmp_img, tmp)
        finally:
            if os.path.exists(tmp_img):
                os.remove(tmp_img)
    return data


def rank_collapse(sigma_x, rho, n_tokens, width, draws, mode, seed, depth, alpha_tilde, figure=None) -> dict:
    """Eqs. 17, 18, 47 and Lemmas 3.2-3.3 at one point (:mod:`.rank_collapse`), with an
    autodiff check over ``draws`` draws (0: formulas only) and the forward recursion over
    ``depth`` blocks with alpha^2 = ``alpha_tilde`` / L."""
    grid.check_option("--sigma-x", sigma_x, 0.0, 1000.0, lo_open=True)
    grid.check_option("--rho", rho, 0.0, 1.0, hi_open=True)
    grid.check_option("--n-tokens", n_tokens, 2, 4096, integer=True)
    grid.check_option("--width", width, 1, 256, integer=True)
    _draws(draws)
    grid.check_option("--seed", seed, 0, SEED_MAX, integer=True)
    # the alpha = 1 recursion grows as 4^L: float64 overflows beyond L ~ 500
    grid.check_option("--depth", depth, 1, 256, integer=True)
    grid.check_option("--alpha-tilde", alpha_tilde, 0.0, 100.0)
    _figure_out(figure)
    n, d = n_tokens, width
    if draws:
        what = f"{draws:,} draws at --n-tokens {n} and --width {d}"
        grid.check_memory(draws * 16 * 8 * n * (n + d), what, "use fewer --draws or smaller sizes")
    import jax

    from . import rank_collapse as rc

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
        mc = rc.mc_gradient_norms(jax.random.PRNGKey(seed), n=n, d=d, sigma_x=sigma_x, rho=rho, draws=draws, mode=mode)
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
        from .figures import rank_collapse_figure

        write_figure(rank_collapse_figure, figure, n=n, d=d, draws=max(draws, 16), seed=seed)
        res["figure"] = figure
    return res


def _remedy(exc, hint) -> ValueError:
    """The library's message with the command's remedy."""
    return ValueError(str(exc).split(" (use ")[0] + f" ({hint})")


def _check_deepscalelm(layers, width, seq_len, dropout, k, alpha_exp, r0, draws, seed, figure) -> None:
    grid.check_option("--layers", layers, 1, 1024, integer=True)
    grid.check_option("--width", width, 4, 2048, integer=True)
    grid.check_option("--seq-len", seq_len, 2, 4096, integer=True)
    grid.check_option("--dropout", dropout, 0.0, 1.0, hi_open=True)
    grid.check_option("--k", k, 0.0, 1e6, lo_open=True)
    grid.check_option("--alpha-exp", alpha_exp, 0.0, 10.0)
    grid.check_option("--r0", r0, 0.0, 1.0, hi_open=True)
    _draws(draws)
    grid.check_option("--seed", seed, 0, SEED_MAX, integer=True)
    _figure_out(figure)
    if draws:
        grid.check_memory(
            draws * 4 * 8 * seq_len * (seq_len + 4 * width) + 8 * 8 * width * width,
            f"{draws:,} draws at --seq-len {seq_len} and --width {width}",
            "use fewer --draws or smaller sizes",
        )


def deepscalelm(
    arch, init, layers, width, seq_len, dropout, k, alpha_exp, scaling, r0, kappa, ln_fluct, draws, seed, figure=None
) -> dict:
    """Moments through a pre-LN / post-LN stack (:mod:`.deepscalelm`): the theory per
    sublayer (key ``theory``) and, with ``draws``, the simulation (``sim``) and the largest
    relative errors. ``scaling`` None: the DeepScaleLM residual scaling with the dslm inits;
    ``kappa`` 'auto' or 'iso'; ``ln_fluct`` 'auto', 'on' or 'off'."""
    _check_deepscalelm(layers, width, seq_len, dropout, k, alpha_exp, r0, draws, seed, figure)
    from . import deepscalelm as ds

    scaling = init.startswith("dslm") if scaling is None else scaling
    try:
        lam2, beta2 = ds.dslm_scaling(layers, k, alpha_exp) if scaling else (1.0, 1.0)
    except ValueError as exc:
        raise ValueError(f"{exc} (check --k, --alpha-exp, --layers)") from None
    opts = dict(
        kappa="auto" if kappa == "auto" else None, ln_fluct={"auto": "auto", "on": True, "off": False}[ln_fluct]
    )
    try:
        th = ds.stack(arch, layers, width, seq_len, init, dropout, lam2, beta2, r0=r0, **opts)
    except ValueError as exc:
        raise _remedy(exc, "use a larger --width, or --ln-fluct off") from None
    if figure:  # the figure's own stacks, before any work
        from .figures import DSLM_FIGURE_STACKS, deepscalelm_figure_theory

        try:
            for a, i in DSLM_FIGURE_STACKS:
                deepscalelm_figure_theory(a, i, layers, width, seq_len, dropout)
        except ValueError as exc:
            raise _remedy(exc, f"in the --figure stack {a}, {i}: use a larger --width") from None
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
        theory={q: th[q] for q in QUANTITIES},
    )
    if draws:
        import jax

        key = jax.random.PRNGKey(seed)
        sim = ds.simulate_stack(
            key, arch, layers, width, seq_len, init, dropout, lam2, beta2, r0=r0, draws=draws, kappa=opts["kappa"]
        )
        res["sim"] = {q: sim[q] for q in QUANTITIES}
        res["max_rel_err"] = {q: float(np.max(np.abs(th[q] - sim[q]) / np.abs(sim[q]))) for q in ("var", "r", "g_var")}
    if figure:
        from .figures import deepscalelm_figure

        kw = dict(layers=layers, d=width, L=seq_len, p=dropout, draws=max(draws, 2), seed=seed)
        write_figure(deepscalelm_figure, figure, **kw)
        res["figure"] = figure
    return res


def sensitivity(arch, depth, width, draws, alpha, norm, method, alpha_a, alpha_m, seed, figure=None) -> dict:
    """Measured sensitivity profile of ``arch`` against its closed form (Definition 2 /
    Prop. 5; :mod:`.sensitivity`), or of the seed-001 Block (``arch`` 'block')."""
    from . import sensitivity as sn

    if arch not in sn.ARCHS + ("block",):
        raise ValueError(f"unknown --arch {arch!r}; choose one of {', '.join(sn.ARCHS + ('block',))}")
    grid.check_option("--depth", depth, 1, 128, integer=True)
    grid.check_option("--width", width, 2, 1024, integer=True)
    _draws(draws, allow_zero=False)
    grid.check_option("--alpha", alpha, 0.0, 1.0, hi_open=True)
    for name, v in (("--alpha-a", alpha_a), ("--alpha-m", alpha_m)):
        grid.check_option(name, v, 0.0, 1.0)
    grid.check_option("--seed", seed, 0, SEED_MAX, integer=True)
    _figure_out(figure)
    grid.check_memory(
        draws * 4 * 8 * depth * width * (width + 8),
        f"{draws:,} draws at --depth {depth} and --width {width}",
        "use fewer --draws or smaller sizes",
    )
    import jax

    key = jax.random.PRNGKey(seed)
    if arch == "block":
        S, se = sn.block_sensitivity(alpha_a, alpha_m, width=width, draws=draws, key=key, method=method)
        res = dict(arch=arch, alpha_a=alpha_a, alpha_m=alpha_m, width=width, draws=draws, S=S, se=se)
    else:
        r = sn.profile(arch, depth, width, draws, key=key, alpha=alpha, norm=norm, method=method)
        res = dict(arch=arch, depth=depth, width=width, draws=draws, norm=norm, method=method, S=r["S"], se=r["se"])
        res["theory"] = r["theory"]
    if figure:
        from .figures import sensitivity_figure

        write_figure(sensitivity_figure, figure, depth=depth, width=width, draws=draws, seed=seed)
        res["figure"] = figure
    return res


def write_figures(out: str, quick: bool = False, echo=print) -> list[str]:
    """The three seed figures (rank_collapse.png, deepscalelm.png, sensitivity.png) in the
    folder ``out`` (checked first; a folder this call created is removed again if it fails);
    ``quick``: fewer draws and smaller sizes. ``echo`` gets one line per figure written."""
    io.check_output(out, kind="dir", need_bytes=FIGURE_BYTES)
    from . import figures as fg

    q = (
        dict(
            rank=dict(draws=32),
            dslm=dict(layers=2, d=32, L=8, draws=2),
            sens=dict(depth=4, width=8, draws=32, block_grid=2, block_draws=4),
        )
        if quick
        else dict(rank={}, dslm={}, sens={})
    )
    created = not os.path.exists(out)
    os.makedirs(out, exist_ok=True)
    paths = []
    try:
        for name, fn, kw in (
            ("rank_collapse.png", fg.rank_collapse_figure, q["rank"]),
            ("deepscalelm.png", fg.deepscalelm_figure, q["dslm"]),
            ("sensitivity.png", fg.sensitivity_figure, q["sens"]),
        ):
            path = os.path.join(out, name)
            write_figure(fn, path, **kw)
            echo(f"wrote {path}")
            paths.append(path)
    except BaseException:
        if created:
            io.remove_empty_dirs(out)
        raise
    return paths
