#!/usr/bin/env python
"""Build the notebooks in this folder from the cell lists below (nbformat, no outputs).

    .venv/bin/python notebooks/build_notebooks.py          # rewrite the .ipynb files
    .venv/bin/python notebooks/build_notebooks.py --check  # exit 1 if they are out of date

Edit the cells here, not in the .ipynb files: ``tests/test_notebooks.py`` checks that the
committed notebooks match this script and executes their code cells (with
``PHASEFIELD_NOTEBOOK_SMALL=1``: small grids and widths, under a minute on a CPU).
"""

from __future__ import annotations

import argparse
import os
import sys

import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))

TOUR = [
    (
        "md",
        """\
# A tour of phasefield

Mean-field signal propagation in deep random transformers (Cowsik et al. 2024): every
block maps the token geometry (squared norm `q`, cosine `ρ`) forward; two exponents decide
trainability at initialization:

* the **angle exponent** λ_a — tokens collapse (λ_a < 0, ordered) or fly apart (λ_a > 0,
  chaotic);
* the **gradient exponent** λ_g — gradients vanish (λ_g < 0) or explode (λ_g > 0) with depth.

This notebook computes one point, sweeps a grid, compares with a finite-width simulation and
draws the phase diagram. Set `PHASEFIELD_NOTEBOOK_SMALL=1` for a fast, coarse run.""",
    ),
    (
        "code",
        """\
import os
import numpy as np
import matplotlib
matplotlib.use("Agg")              # remove this line for inline plots in Jupyter
import matplotlib.pyplot as plt

import phasefield                  # the theory computes in float64 by itself
from phasefield import HParams
from phasefield.layers import paper

SMALL = os.environ.get("PHASEFIELD_NOTEBOOK_SMALL") == "1"
GRID = 16 if SMALL else 128        # theory grid points per axis
WIDTH, SEEDS = (64, 2) if SMALL else (512, 16)   # simulation width and draws
N, L = (8, 4) if SMALL else (32, 16)             # tokens and depth
OUT = "notebook_out"
os.makedirs(OUT, exist_ok=True)""",
    ),
    (
        "md",
        """\
## 1. One hyperparameter point

`HParams` holds σ_w (MLP weights), σ_A (attention logits), α_A, α_M (branch weights; the
residual weight is β = sqrt(1 − α²)), n tokens and depth L. `paper.exponents` returns
λ_a, λ_g (depth L, input at the collapsed fixed point), λ_g^∞, q*, and ρ* of the stable
fixed point.""",
    ),
    (
        "code",
        """\
hp = HParams(sigma_w=2.5, sigma_a=1.0, alpha_a=0.5, alpha_m=0.5, n_tokens=N, depth=L)
ex = {k: float(v) for k, v in paper.exponents(hp).items()}
ex""",
    ),
    ("md", "The (q, ρ) map iterated from a given input geometry — the transient the paper's Fig. 2 shows:"),
    (
        "code",
        """\
q, p = paper.trajectory(hp, 1.0, 0.7, L)
rho = np.asarray(p / q)
print("layer   q       rho")
for l in range(0, L + 1, max(1, L // 4)):
    print(f"{l:5d}  {float(q[l]):.3f}  {rho[l]:.3f}")""",
    ),
    (
        "md",
        """\
## 2. A sweep

`phasefield.sweep(...)` evaluates the theory on a grid (vmapped, chunked) and returns a
labelled `xarray.Dataset`; every axis given as a sequence becomes a dimension, `alpha` ties
α_A = α_M. `out="file.nc"` would also save it (and resume an interrupted sweep).""",
    ),
    (
        "code",
        """\
ds = phasefield.sweep(sigma_w=np.linspace(0.3, 4.0, GRID), alpha=np.linspace(0.01, 0.99, GRID),
                      sigma_a=1.0, n_tokens=N, depth=L)
ds""",
    ),
    (
        "md",
        """\
Phases (ordered/chaotic × vanishing/exploding) and where both exponents vanish. The zero
contours of λ_a and λ_g(L) approach each other as α → 0; `critical_point` reports their
crossing, or, when they do not cross inside the grid, the point of the λ_a = 0 contour
with the smallest |λ_g|.""",
    ),
    (
        "code",
        """\
from phasefield.figures import phase

codes = phase.classify(ds)
for k, name in phase.PHASES.items():
    print(f"{name:<20} {float((codes == k).mean()):6.1%} of the grid")
cp = phase.critical_point(ds, x="alpha", y="sigma_w")
print(phase.describe(cp))""",
    ),
    (
        "md",
        """\
## 3. Compare with a finite-width simulation

`phasefield.simulate` builds random transformers of width d from the same Flax block the
ViT trainer uses and measures the exponents numerically (paper App. A and §4.2), with
standard errors over independent draws.""",
    ),
    (
        "code",
        """\
from phasefield.layers import presets
from phasefield.simulate import measure

sim = measure.fixed_point_exponents(presets.paper(hp), n_tokens=N, depth=L, width=WIDTH, draws=SEEDS)
print(f"lambda_a: theory {ex['lambda_a']:+.3f}   simulation {sim['lambda_a']:+.3f} +- {sim['lambda_a_se']:.3f}")
print(f"lambda_g_collapse: theory {ex['lambda_g_collapse']:+.3f}   "
      f"simulation {sim['lambda_g_collapse']:+.3f} +- {sim['lambda_g_collapse_se']:.3f}")""",
    ),
    ("md", "The same on a small grid, and the agreement table (median / 90th percentile / max |error| by phase):"),
    (
        "code",
        """\
from phasefield.simulate import compare
from phasefield.simulate import sweep as simsweep

sw_sim = np.array([1.0, 2.0, 3.0]) if SMALL else np.linspace(0.5, 3.5, 7)
al_sim = np.array([0.3, 0.7]) if SMALL else np.linspace(0.1, 0.9, 5)
sim_grid = simsweep.fixed_point_grid("paper", n_tokens=N, depth=L, width=WIDTH, draws=SEEDS, sigma_w=sw_sim, alpha=al_sim)
th_grid = phasefield.sweep(sigma_w=sw_sim, alpha=al_sim, n_tokens=N, depth=L)
print(compare.format_table(compare.agreement(th_grid, sim_grid)))""",
    ),
    ("md", "## 4. Plot\n\nThe exponents on the (α, σ_w) slice, with their zero contours:"),
    (
        "code",
        """\
from phasefield.figures import style

fig, axes = plt.subplots(1, 2, figsize=(7, 3), constrained_layout=True)
for ax, var in zip(axes, ("lambda_a", "lambda_g_collapse")):
    z = ds[var].transpose("sigma_w", "alpha")
    norm = style.diverging_norm(z.values, clip_percentile=99)
    m = ax.pcolormesh(ds.alpha, ds.sigma_w, z, norm=norm, cmap=style.CMAP, shading="nearest")
    ax.contour(ds.alpha, ds.sigma_w, z, levels=[0], colors="k")
    ax.set_xlabel(r"$\\alpha$"); ax.set_ylabel(r"$\\sigma_w$")
    fig.colorbar(m, ax=ax, label=style.symbol(var, L))
fig.savefig(os.path.join(OUT, "exponents.png"), dpi=100)""",
    ),
    (
        "md",
        """\
The phase diagram (the same function `phasefield figures` uses), written as PNG and PDF.
`phasefield figures --out DIR [--quick]` draws all of the paper's Figs. 2–6 and this one, and
saves the datasets so that `phasefield figures --from DIR/sweep.nc --out NEW` redraws them
without recomputing; `phasefield demo` adds a summary.""",
    ),
    (
        "code",
        """\
from phasefield.figures import paper as paper_figures

paths = paper_figures.phase_diagram(ds, OUT)
paths""",
    ),
]


def build(cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for i, (kind, src) in enumerate(cells):
        cell = nbformat.v4.new_markdown_cell(src) if kind == "md" else nbformat.v4.new_code_cell(src)
        cell["id"] = f"cell-{i:02d}"  # stable ids: rebuilding gives identical files
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


NOTEBOOKS = {"phasefield_tour.ipynb": TOUR}


def render(name) -> str:
    return nbformat.writes(build(NOTEBOOKS[name])) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a notebook is out of date")
    args = ap.parse_args(argv)
    stale = []
    for name in NOTEBOOKS:
        path = os.path.join(HERE, name)
        text = render(name)
        old = open(path).read() if os.path.exists(path) else None
        if old != text:
            stale.append(name)
            if not args.check:
                with open(path, "w") as f:
                    f.write(text)
    if args.check and stale:
        print("out of date: " + ", ".join(stale) + " (run notebooks/build_notebooks.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
