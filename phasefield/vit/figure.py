"""The paper's Fig. 7 from a sweep and its fit: loss vs lambda_a, loss vs lambda_g, and
predicted vs measured loss (matplotlib, Agg backend)."""
from __future__ import annotations

import numpy as np


def fig7(rows: list[dict], fit: dict, path: str, fmt: str | None = None, dpi: int = 120) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .predict import predict_loss

    target = fit.get("target", "test_loss")
    ok = [r for r in rows if not r.get("diverged") and r.get(target) is not None
          and r.get("lambda_a") is not None and r.get("lambda_g") is not None]
    la = np.array([float(r["lambda_a"]) for r in ok])
    lg = np.array([float(r["lambda_g"]) for r in ok])
    y = np.array([float(r[target]) for r in ok])
    yhat = predict_loss(fit, la, lg)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    label = target.replace("_", " ")
    for ax, x, c, name, cname in ((axes[0], la, lg, r"$\lambda_a$", r"$\lambda_g$"),
                                  (axes[1], lg, la, r"$\lambda_g$", r"$\lambda_a$")):
        sc = ax.scatter(x, y, c=c, cmap="coolwarm", s=22, edgecolor="k", linewidth=0.3)
        ax.axvline(0.0, color="0.6", lw=0.8, ls="--")
        if y.size and y.max() > 0.6 * fit["L_sat"]:  # chance level only where it is in view
            ax.axhline(fit["L_sat"], color="0.6", lw=0.8, ls=":")
        ax.set_xlabel(name)
        ax.set_ylabel(f"{label} (chance {fit['L_sat']:.2f})")
        fig.colorbar(sc, ax=ax, label=cname)
    ax = axes[2]
    ax.scatter(y, yhat, s=22, c="tab:blue", edgecolor="k", linewidth=0.3)
    lo, hi = float(min(y.min(), yhat.min())), float(max(y.max(), yhat.max()))
    ax.plot([lo, hi], [lo, hi], color="0.4", lw=0.8)
    m = fit["models"]["max"]
    ax.set_title(f"max model: $R^2$ = {m['r2']:.3f}, CV $R^2$ = {m['cv_r2']:.3f}", fontsize=10)
    ax.set_xlabel(f"measured {label}")
    ax.set_ylabel(f"predicted {label}")
    fig.suptitle(f"{fit.get('context', {}).get('dataset', '')} ViT, {len(ok)} runs; "
                 f"loss = min(log C, b + max(w_a|λ_a - c_a|, w_g|λ_g - c_g|))", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi, format=fmt)
    plt.close(fig)
