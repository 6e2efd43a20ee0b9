"""DeepScaleLM validation grid (docs/seeds.md §2): p50/p90/p99 of relative errors of the
moment rules against finite-width simulation, full gradient (incl. query/key path) or
value path only.

Resumable: every stack (arch, init, width, depth, L) appends one JSON line to ``--rows``
as soon as it is simulated, with its own key ``fold_in(PRNGKey(seed), stack index)``, so a
rerun skips the finished stacks (a torn last line from an interrupted run is ignored and
recomputed) and the numbers do not depend on which stacks ran before. Then the summary
(percentiles, all rows) is written to ``--out``. ``--base`` reruns, with more draws and
fresh keys, only the stacks of an earlier run whose gradient standard error is above
``--noisy-se`` (chosen by their noise, not by their error), and summarizes both together.

    PYTHONPATH=. python scripts/dslm_validation.py --draws 64 \\
        --rows docs/data/dslm/rows_full_64draws.jsonl --out docs/data/dslm/validation_full_64draws.json
    PYTHONPATH=. python scripts/dslm_validation.py --draws 256 --seed 1 \\
        --base docs/data/dslm/rows_full_64draws.jsonl --rows docs/data/dslm/rows_noisy_256draws.jsonl \\
        --out docs/data/dslm/validation_full_64_256draws.json
    # the DSLM-init stacks with d <= 128 again, theory with the kappa closure (stack(kappa="auto"))
    PYTHONPATH=. python scripts/dslm_validation.py --draws 128 --seed 2 --kappa auto --inits dslm \
        --widths 64 128 --rows docs/data/dslm/rows_kappa_dslm_128draws.jsonl \
        --out docs/data/dslm/validation_kappa_dslm_128draws.json

``--inits`` / ``--widths`` change the stack indices (and so the keys): use a new ``--rows``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import jax
import numpy as np
from tqdm import tqdm

from phasefield import io
from phasefield.seeds import deepscalelm as ds

GRID = dict(archs=ds.ARCHS, inits=("xavier", "dslm"), widths=(64, 128, 256), depths=(1, 2, 4, 8), p=0.1, r0=0.2)
LONG_WIDTHS = (64, 128)  # also run at L = 256: L var_logit = 256 >= d_in


def stacks(widths, depths, long_widths, inits=GRID["inits"]):
    """The grid's stacks in a fixed order: (arch, init, width, depth, L)."""
    short = itertools.product(GRID["archs"], inits, widths, depths, (32,))
    long = itertools.product(GRID["archs"], inits, long_widths, depths, (256,))
    return list(short) + list(long)


def _pct(rows, q, **where):
    e = np.concatenate([r["errs"] for r in rows if r["quantity"] == q and all(r[k] == v for k, v in where.items())])
    return [float(np.percentile(e, k)) for k in (50, 90, 99)]


def _load(path):
    """Finished stacks by index (complete lines only)."""
    return {rec["index"]: rec for rec in io.read_jsonl(path)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", required=True, help="JSON-lines file of finished stacks (resumed)")
    ap.add_argument("--out", default=None, help="summary JSON written when every stack is done")
    ap.add_argument("--value-path", action="store_true", help="value path only (qk_grad=False)")
    ap.add_argument(
        "--kappa",
        choices=("iso", "auto"),
        default="iso",
        help="token anisotropy in the theory: isotropic (kappa = 1) or the kappa closure",
    )
    ap.add_argument("--inits", nargs="+", default=list(GRID["inits"]), choices=GRID["inits"])
    ap.add_argument("--widths", type=int, nargs="+", default=list(GRID["widths"]))
    ap.add_argument("--depths", type=int, nargs="+", default=list(GRID["depths"]))
    ap.add_argument("--long-widths", type=int, nargs="+", default=list(LONG_WIDTHS), help="widths also run at L = 256")
    ap.add_argument(
        "--base",
        default=None,
        help="rows file of an earlier run on the same grid: only its stacks whose gradient "
        "standard error exceeds --noisy-se are rerun here (fresh keys: use another "
        "--seed), and the summary takes the other stacks from it",
    )
    ap.add_argument(
        "--noisy-se",
        type=float,
        default=0.03,
        help="relative standard error of g_var above which a --base stack is rerun",
    )
    a = ap.parse_args(argv)
    grid = stacks(a.widths, a.depths, a.long_widths, tuple(a.inits))
    kappa = None if a.kappa == "iso" else a.kappa
    base = _load(a.base) if a.base else {}
    if a.base:
        if a.seed == next(iter(base.values()))["seed"]:
            raise SystemExit("--base: use another --seed, so the rerun draws are independent")
        noisy = {
            i
            for i, rec in base.items()
            if max(max(r["rel_se"]) for r in rec["rows"] if r["quantity"] == "g_var") > a.noisy_se
        }
    done = _load(a.rows)
    for i, rec in done.items():
        if (
            rec["draws"] != a.draws
            or rec["seed"] != a.seed
            or rec["qk_grad"] != (not a.value_path)
            or rec.get("kappa", "iso") != a.kappa
        ):
            raise SystemExit(f"{a.rows}: stack {i} was run with other settings; use another --rows file")
    # rewrite the complete lines only, so an append never follows a torn line
    if os.path.exists(a.rows):
        with io.atomic_path(a.rows) as tmp, open(tmp, "w") as f:
            f.writelines(json.dumps(done[i]) + "\n" for i in sorted(done))
    os.makedirs(os.path.dirname(os.path.abspath(a.rows)), exist_ok=True)
    todo = [i for i in range(len(grid)) if i not in done and (not a.base or i in noisy)]
    t0 = time.time()
    with open(a.rows, "a") as f:
        for i in tqdm(todo, desc="stacks", initial=len(done), total=len(done) + len(todo)):
            arch, init, d, n, L = grid[i]
            key = jax.random.fold_in(jax.random.PRNGKey(a.seed), i)
            t = time.time()
            rows, _ = ds.validate(
                key,
                archs=(arch,),
                inits=(init,),
                widths=(d,),
                depths=(n,),
                seq_lens=(L,),
                p=GRID["p"],
                r0=GRID["r0"],
                draws=a.draws,
                qk_grad=not a.value_path,
                kappa=kappa,
            )
            rec = dict(
                index=i,
                arch=arch,
                init=init,
                width=d,
                depth=n,
                seq_len=L,
                draws=a.draws,
                seed=a.seed,
                qk_grad=not a.value_path,
                kappa=a.kappa,
                seconds=time.time() - t,
                rows=rows,
            )
            f.write(json.dumps(rec) + "\n")
            f.flush()
            os.fsync(f.fileno())
            done[i] = rec
    merged = {**base, **done}
    rows = [r for i in sorted(merged) if i < len(grid) for r in merged[i]["rows"]]
    name = "value_path" if a.value_path else "full"
    seconds = sum(rec["seconds"] for rec in merged.values())
    print(
        f"== {name} gradient ({len(merged)} stacks: {len(done)} at {a.draws} draws"
        + (f", {len(merged) - len(done)} from {a.base} at {next(iter(base.values()))['draws']} draws" if base else "")
        + f"; {seconds:.0f} s of simulation; {time.time() - t0:.0f} s this run)"
    )
    for q in ("var", "r", "g_var"):
        print(f"{q:6s} all {_pct(rows, q)}")
        for L in sorted({r["seq_len"] for r in rows}):
            print(f"       L={L}: {_pct(rows, q, seq_len=L)}")
        for init in sorted({r["init"] for r in rows}):
            print(f"       {init}: {_pct(rows, q, init=init)}")
    for q in ("var", "r", "g_var"):
        over = [(r, e, z) for r in rows if r["quantity"] == q for e, z in zip(r["errs"], r["z"]) if e > 0.1]
        sig = [o for o in over if abs(o[2]) > 4]
        stacks_over = {(r["arch"], r["init"], r["width"], r["depth"], r["seq_len"]) for r, _, _ in over}
        stacks_sig = {(r["arch"], r["init"], r["width"], r["depth"], r["seq_len"]) for r, _, _ in sig}
        print(
            f"{q:6s} boundaries > 10 %: {len(over)} in {len(stacks_over)} stacks; of those |z| > 4: "
            f"{len(sig)} in {len(stacks_sig)} stacks {sorted(stacks_sig)}"
        )
    if a.out:
        io.write_json(
            a.out,
            dict(
                draws=a.draws,
                seed=a.seed,
                base=a.base,
                noisy_se=a.noisy_se if a.base else None,
                rerun=sorted(done) if a.base else None,
                widths=a.widths,
                depths=a.depths,
                long_widths=a.long_widths,
                **{name: dict(rows=rows, seconds=seconds)},
            ),
            indent=None,
        )


if __name__ == "__main__":
    main()
