"""DeepScaleLM validation grid (docs/seeds.md §2): p50/p90/p99 of relative errors of the
moment rules against finite-width simulation, full gradient (incl. query/key path) and
value path only.

    PYTHONPATH=. python scripts/dslm_validation.py --draws 32 --out dslm_validation.json
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

import phasefield  # noqa: F401  (float64)
from phasefield.seeds import deepscalelm as ds

GRID = dict(archs=ds.ARCHS, inits=("xavier", "dslm"), widths=(64, 128, 256), depths=(1, 2, 4, 8), p=0.1,
            r0=0.2)
LONG = dict(GRID, widths=(64, 128), seq_lens=(256,))  # L var_logit = 256 >= d_in


def _pct(rows, q, **where):
    e = np.concatenate([r["errs"] for r in rows if r["quantity"] == q
                        and all(r[k] == v for k, v in where.items())])
    return [float(np.percentile(e, k)) for k in (50, 90, 99)]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--value-path", action="store_true", help="also the value-path-only comparison")
    ap.add_argument("--widths", type=int, nargs="+", default=list(GRID["widths"]))
    ap.add_argument("--depths", type=int, nargs="+", default=list(GRID["depths"]))
    ap.add_argument("--long-widths", type=int, nargs="+", default=list(LONG["widths"]),
                    help="widths also run at L = 256")
    a = ap.parse_args(argv)
    out = {}
    for qk in (True, False) if a.value_path else (True,):
        t = time.time()
        rows = []
        grids = (dict(GRID, widths=a.widths, depths=a.depths, seq_lens=(32,)),
                 dict(LONG, widths=a.long_widths, depths=a.depths))
        for i, grid in enumerate(grids):
            rows += ds.validate(jax.random.PRNGKey(a.seed + i), draws=a.draws, qk_grad=qk, **grid)[0]
        name = "full" if qk else "value_path"
        out[name] = dict(rows=rows, seconds=time.time() - t)
        print(f"== {name} gradient ({a.draws} draws, {time.time() - t:.0f} s)")
        for q in ("var", "r", "g_var"):
            print(f"{q:6s} all {_pct(rows, q)}")
            for L in sorted({r["seq_len"] for r in rows}):
                print(f"       L={L}: {_pct(rows, q, seq_len=L)}")
            for d in sorted({r["width"] for r in rows}):
                print(f"       d={d}: {_pct(rows, q, width=d)}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(draws=a.draws, seed=a.seed, widths=a.widths, depths=a.depths,
                           long_widths=a.long_widths, **out), f)


if __name__ == "__main__":
    main()
