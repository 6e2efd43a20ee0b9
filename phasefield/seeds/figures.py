"""One figure per seed module (matplotlib, Agg). Each returns the data it plotted."""

from __future__ import annotations

import numpy as np


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def rank_collapse_figure(path, n=8, d=16, draws=256, seed=0):
    """Left: E||dS/dW_Q||^2 and E||dS/dW_V||^2 vs rho (Eqs. 17-18, exact form, autodiff).
    Right: token correlation vs depth (Lemmas 3.2-3.3) for alpha = 1 and alpha^2 = 1/L."""
    import jax

    from . import rank_collapse as rc

    plt = _plt()
    rhos = np.linspace(0.0, 0.9, 7)
    mc = [
        rc.mc_gradient_norms(jax.random.PRNGKey(seed + i), n=n, d=d, rho=float(r), draws=draws)
        for i, r in enumerate(rhos)
    ]
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    rr = np.linspace(0, 0.95, 100)
    ax[0].plot(rr, rc.value_grad_gaussian(1.0, rr, n, d), "C0-", label="Eq. 17 (values)")
    ax[0].plot(rr, rc.query_grad_gaussian(1.0, rr, n, d), "C1--", label="Eq. 18 (queries)")
    ax[0].plot(rr, rc.query_grad_gaussian(1.0, rr, n, d, exact=True), "C1-", label="queries, exact")
    ax[0].errorbar(rhos, [m["value"] for m in mc], [2 * m["value_se"] for m in mc], fmt="C0o", label="autodiff")
    ax[0].errorbar(rhos, [m["query"] for m in mc], [2 * m["query_se"] for m in mc], fmt="C1s", label="autodiff")
    ax[0].set_yscale("log")
    ax[0].set_xlabel("token cosine rho")
    ax[0].set_ylabel("E ||dS/dW||_F^2")
    ax[0].set_title(f"uniform attention, n={n}, d={d}")
    ax[0].legend(fontsize=7)
    L = 16
    X = rc.gaussian_tokens(jax.random.PRNGKey(seed + 99), n, d, 1.0, 0.2)
    C0, F0 = float(rc.C_of(X)), float(rc.frob2(X))
    for j, (a, lab) in enumerate([(1.0, "alpha = 1"), (np.sqrt(1.0 / L), "alpha^2 = 1/L")]):
        C, F = rc.forward_moments(C0, F0, n, a, a, L)
        sim = rc.mc_stack_forward(jax.random.PRNGKey(seed + 7 + j), X, L, a, a, draws=draws)
        ax[1].plot(np.arange(L + 1), rc.correlation(np.asarray(C), np.asarray(F), n), f"C{j}-", label=lab)
        ax[1].plot(np.arange(L + 1), sim["rho"], f"C{j}o", ms=4)
    _, _, rlim = rc.depth_limit(C0, F0, n, 1.0, 1.0)
    ax[1].axhline(float(rlim), color="C1", ls=":", label="L -> inf limit (Eq. 15)")
    ax[1].set_xlabel("layer")
    ax[1].set_ylabel("average token correlation")
    ax[1].set_title("no LN, linear MLP (lines: Lemmas 3.2-3.3; dots: simulation)")
    ax[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return dict(rho=rhos.tolist(), query=[m["query"] for m in mc], value=[m["value"] for m in mc])


DSLM_FIGURE_STACKS = (("pre-ln", "xavier"), ("post-ln", "xavier"), ("pre-ln", "dslm"))


def _dslm_scaling(init, layers):
    from . import deepscalelm as ds

    return ds.dslm_scaling(layers, 2.0) if init == "dslm" else (1.0, 1.0)


def deepscalelm_figure_theory(arch, init, layers, d, L, p):
    """The theory of one panel curve (raises ValueError where the finite-width rules do not apply)."""
    from . import deepscalelm as ds

    return ds.stack(arch, layers, d, L, init, p, *_dslm_scaling(init, layers), kappa="auto")


def deepscalelm_figure(path, layers=8, d=128, L=32, p=0.1, draws=8, seed=0):
    """Forward variance and backward gradient variance through pre-LN / post-LN stacks,
    Xavier vs DeepScaleLM, theory (lines) against simulation (dots)."""
    import jax

    from . import deepscalelm as ds

    plt = _plt()
    fig, ax = plt.subplots(1, 3, figsize=(14, 4))
    out = {}
    for c, (arch, init) in enumerate(DSLM_FIGURE_STACKS):
        lam2, beta2 = _dslm_scaling(init, layers)  # simulate_stack computes the theory once
        sim = ds.simulate_stack(
            jax.random.PRNGKey(seed + c),
            arch,
            layers,
            d,
            L,
            init,
            p,
            lam2,
            beta2,
            draws=draws,
            qk_grad=True,
            kappa="auto",
        )
        th = sim["theory"]
        x = np.arange(2 * layers + 1) / 2
        lab = f"{arch}, {init}"
        ax[0].plot(x, th["var"], f"C{c}-", label=lab)
        ax[0].plot(x, sim["var"], f"C{c}o", ms=4)
        ax[1].plot(x, th["r"], f"C{c}-", label=lab)
        ax[1].plot(x, sim["r"], f"C{c}o", ms=4)
        ax[2].plot(x, th["g_var"], f"C{c}-", label=lab)
        ax[2].plot(x, sim["g_var"], f"C{c}o", ms=4)
        out[lab] = dict(
            theory={k: np.asarray(v).tolist() for k, v in th.items() if k != "inits"},
            sim={k: np.asarray(sim[k]).tolist() for k in ("var", "r", "g_var")},
        )
    for a, t in zip(ax, ("forward variance", "token correlation r", "gradient variance")):
        a.set_xlabel("layer")
        a.set_title(t)
    ax[2].set_yscale("log")
    ax[0].legend(fontsize=7)
    fig.suptitle(
        f"DeepScaleLM moments, d={d}, L={L}, p={p} (lines: theory with the kappa closure; "
        "dots: simulation incl. Q/K gradient)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return out


def sensitivity_figure(path, depth=16, width=32, draws=256, seed=0, block_grid=5, block_draws=32):
    """Left: sensitivity profiles vs closed forms. Right: seed-001 block sensitivity over
    (alpha_A, alpha_M)."""
    import jax

    from . import sensitivity as sn

    plt = _plt()
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    out = {}
    i = np.arange(1, depth + 1)
    for c, arch in enumerate(("feedforward", "post-norm", "weighted-pre", "rescalenet", "pre-norm", "catformer")):
        r = sn.profile(arch, depth, width, draws, key=jax.random.PRNGKey(seed + c))
        ax[0].plot(i, r["theory"], f"C{c}-", label=arch)
        ax[0].errorbar(i, r["S"], 2 * r["se"], fmt=f"C{c}o", ms=3)
        out[arch] = dict(S=r["S"].tolist(), theory=r["theory"].tolist())
    ax[0].set_xlabel("layer i")
    ax[0].set_ylabel("S[x_hat_i]")
    ax[0].set_yscale("log")
    ax[0].set_title(f"sensitivity profiles, d={width} (lines: App. C)")
    ax[0].legend(fontsize=7)
    a = np.linspace(0, 1, block_grid)
    S, se = sn.block_grid(a, a, draws=block_draws, key=jax.random.PRNGKey(seed + 50))
    im = ax[1].imshow(S, origin="lower", extent=(0, 1, 0, 1), aspect="auto", cmap="viridis")
    fig.colorbar(im, ax=ax[1])
    ax[1].set_xlabel("alpha_M")
    ax[1].set_ylabel("alpha_A")
    ax[1].set_title("seed-001 Block: S (tanh, sigma_w = sigma_A = 1)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    out["block"] = dict(alpha=a.tolist(), S=S.tolist(), se=se.tolist())
    return out
