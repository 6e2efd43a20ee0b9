"""``phasefield demo``: the theory sweep, a quick finite-width check and every figure on
the CPU in a few minutes, then a short summary:

* where λ_a = λ_g(L) = 0 on the (α, σ_w) slice at σ_A = 1, n = 32, L = 16 (interpolated
  intersection of the two zero contours, :func:`phase.critical_point`);
* the measured theory-vs-simulation agreement (median / max |error| of λ_a and λ_g on
  the quick simulated grid).

The summary is printed and written to ``OUT/summary.json`` and ``OUT/summary.txt``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from . import phase


def summarize(result: dict) -> dict:
    """The numbers the demo reports, from :func:`phasefield.figures.make_figures`'s result."""
    from . import agreement

    theory, sim = result["theory"], result["sim"]
    out = {"seconds": round(float(result["seconds"]), 1), "settings": result["settings"].name}
    if "alpha_sigma_w" in theory:
        ds = theory["alpha_sigma_w"]
        cp = phase.critical_point(ds, "alpha", "sigma_w")
        fixed = {k: float(ds[k].values) for k in ("sigma_a", "n_tokens", "depth") if k in ds.coords and ds[k].size == 1}
        out["critical_point"] = cp
        out["critical_point_text"] = phase.describe(cp, fixed)
        # the edge of chaos and lambda_g along it, for context
        edge = []
        for line, gv in phase.zero_crossings(
            phase.slice2d(ds, "alpha", "sigma_w", "lambda_a").values,
            phase.slice2d(ds, "alpha", "sigma_w", "lambda_g_collapse").values,
            ds["alpha"].values,
            ds["sigma_w"].values,
        )[1]:
            for a in (0.25, 0.5, 0.75):
                i = int(abs(line[:, 0] - a).argmin())
                if abs(line[i, 0] - a) < 0.03:
                    edge.append(
                        dict(
                            alpha=round(float(line[i, 0]), 3),
                            sigma_w=round(float(line[i, 1]), 3),
                            lambda_g_collapse=round(float(gv[i]), 4),
                        )
                    )
        out["edge_of_chaos"] = edge
    agree = {}
    for name in ("alpha_sigma_w", "sigma_a_alpha"):
        a = agreement.agreement(theory, sim, name)
        if a is not None:
            agree[name] = a
    if "causal" in sim and "causal" in theory:
        a = agreement.agreement({"causal": theory["causal"]}, sim, "causal")
        if a is not None:
            agree["causal"] = a
    out["agreement"] = agree
    return out


def format_summary(summary: dict) -> str:
    lines = ["", "summary", "-------"]
    if "critical_point_text" in summary:
        lines.append(summary["critical_point_text"])
        cp = summary.get("critical_point") or {}
        if cp.get("kind") == "closest":
            lines.append(
                "  (on lambda_a = 0, lambda_g(L) > 0 for every alpha > 0: the mean-token "
                "gradient mode grows, docs/theory.md §7)"
            )
        for e in summary.get("edge_of_chaos", []):
            lines.append(
                f"  on lambda_a = 0 at alpha = {e['alpha']:.2f}: sigma_w = {e['sigma_w']:.3f}, "
                f"lambda_g(L) = {e['lambda_g_collapse']:+.4f}"
            )
    names = {
        "alpha_sigma_w": "(alpha, sigma_w) grid",
        "sigma_a_alpha": "(sigma_A, alpha) grid",
        "causal": "causal (alpha, sigma_w) grid vs full-Gram theory",
    }
    for name, a in summary.get("agreement", {}).items():
        lines.append(
            f"theory vs simulation, {names.get(name, name)}: {a['points']} points, "
            f"width {a['width']}, {a['seeds']} draws"
        )
        for v in ("lambda_a", "lambda_g_collapse"):
            r = a[v]
            se = f", median se {r['median_se']:.3f}" if "median_se" in r else ""
            lines.append(f"  {v:<8} |sim - theory| median {r['median']:.4f}, max {r['max']:.4f}{se}")
    lines.append(f"wall time {summary['seconds']:.0f} s ({summary['settings']} settings)")
    return "\n".join(lines)


def run(out_dir: str, settings=None, echo: Callable = print, progress: bool = True) -> dict:
    """Run the demo into ``out_dir``; returns the summary dict."""
    from . import make_figures
    from . import settings as presets

    t0 = time.time()
    res = make_figures(out_dir, settings=settings or presets.QUICK, echo=echo, progress=progress)
    res["seconds"] = time.time() - t0
    summary = summarize(res)
    text = format_summary(summary)
    echo(text)
    from .. import io

    io.write_json(os.path.join(out_dir, "summary.json"), summary)  # NaN -> null (RFC 8259)
    with io.atomic_path(os.path.join(out_dir, "summary.txt")) as tmp, open(tmp, "w") as f:
        f.write(text.lstrip() + "\n")
    return summary
