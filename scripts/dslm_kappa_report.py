"""Percentiles of the DeepScaleLM validation errors with the kappa closure (docs/seeds.md §2).

Combines (1) the committed isotropic-theory rows (``rows_full_64draws.jsonl``, with the stacks
of ``rows_noisy_256draws.jsonl`` replacing theirs) and (2) a rerun with ``--kappa auto``
(``scripts/dslm_validation.py``, rows carry ``sim`` and ``theory``). For committed rows the
simulated value is recovered from the stored error and standard error,
sim = theory_iso / (1 + z rel_se) (z = (theory - sim)/se, rel_se = se/|sim|), with
``theory_iso`` recomputed today (``stack(kappa=None)``, the code path of those rows); the
kappa-closure theory (``stack(kappa="auto")``) is then compared with the same draws.

    PYTHONPATH=. python scripts/dslm_kappa_report.py --new docs/data/dslm/rows_kappa_dslm_256draws.jsonl
    # the fresh-draw check of ln_fluct="auto" (theory "auto+default"; docs/seeds.md)
    PYTHONPATH=. python scripts/dslm_kappa_report.py --new docs/data/dslm/rows_kappa_dslm_heldout_128draws.jsonl
    # the second fresh set, drawn after the first-LayerNorm revision of ln_fluct="auto"
    PYTHONPATH=. python scripts/dslm_kappa_report.py --new docs/data/dslm/rows_kappa_dslm_heldout2_128draws.jsonl
"""

from __future__ import annotations

import argparse
import functools

import numpy as np

from phasefield import io
from phasefield.seeds import deepscalelm as ds

D = "docs/data/dslm/"
Q = ("var", "r", "g_var")


def key(rec):
    return rec["arch"], rec["init"], rec["width"], rec["depth"], rec["seq_len"]


@functools.cache
def theory(arch, init, d, n, L, kappa):
    lam2, beta2 = ds.dslm_scaling(n, min(2.0, n)) if init.startswith("dslm") else (1.0, 1.0)
    kap = {"iso": None, "ln": None}.get(kappa, "auto")
    # "iso" and "auto": the chi^2 LayerNorm factor everywhere (the code path of the committed
    # rows); "+ln": the norm-fluctuation factor everywhere; "+default": where it is validated
    # (today's default, ln_fluct="auto")
    fluct = {"ln": True, "default": "auto"}.get(kappa.rsplit("+", 1)[-1], False)
    return ds.stack(arch, n, d, L, init, 0.1, lam2, beta2, 1.0, 0.2, kappa=kap, ln_fluct=fluct)


def part(q, a):
    return np.asarray(a)[:-1] if q == "g_var" else np.asarray(a)[1:]


def sims(rec):
    """{quantity: (sim, se)} of one stack record: stored, or recovered from (z, rel_se)."""
    out = {}
    for row in rec["rows"]:
        q = row["quantity"]
        if "sim" in row:
            out[q] = np.asarray(row["sim"]), np.asarray(row["se"])
        else:
            th = part(q, theory(*key(rec), "iso")[q])
            sim = th / (1 + np.asarray(row["z"]) * np.asarray(row["rel_se"]))
            out[q] = sim, np.asarray(row["rel_se"]) * np.abs(sim)
    return out


def pct(e):
    return [round(100 * float(np.percentile(e, k)), 1) for k in (50, 90, 99)]


def table(recs, kappa, title):
    errs = {q: [] for q in Q}
    over = []
    for k, rec in sorted(recs.items()):
        th, sm = theory(*k, kappa), sims(rec)
        for q in Q:
            sim, se = sm[q]
            t = part(q, th[q])
            e = np.abs(t - sim) / np.abs(sim)
            errs[q].append((k, e))
            if q == "g_var":
                z = np.where(se > 1e-9 * np.abs(sim), (t - sim) / np.where(se > 0, se, 1), 0.0)
                over += [(k, i, 100 * (t[i] - sim[i]) / sim[i], z[i]) for i in np.flatnonzero(e > 0.1)]
    print(f"== {title} (theory: kappa={kappa}; {len(recs)} stacks)")
    for q in Q:
        allq = np.concatenate([e for _, e in errs[q]])
        sel = lambda f: np.concatenate([e for k, e in errs[q] if f(k)] or [np.zeros(0)])
        parts = dict(
            xavier=sel(lambda k: k[1] == "xavier"),
            dslm=sel(lambda k: k[1] == "dslm"),
            dslm_d128=sel(lambda k: k[1] == "dslm" and k[2] <= 128),
        )
        print(
            f"  {q:6s} p50/p90/p99 all {pct(allq)}  " + "  ".join(f"{n} {pct(v)}" for n, v in parts.items() if v.size)
        )
    sig = [o for o in over if abs(o[3]) > 4]
    print(f"  g_var boundaries > 10 %: {len(over)} in {len({o[0] for o in over})} stacks; |z| > 4: {len(sig)}")
    for k, i, e, z in over:
        print(f"    {k} x{i}: {e:+.1f} % (z {z:+.1f})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new", default=None, help="rows of a --kappa auto rerun (replace the committed stacks)")
    a = ap.parse_args(argv)
    old = {key(r): r for r in io.read_jsonl(D + "rows_full_64draws.jsonl")}
    old.update({key(r): r for r in io.read_jsonl(D + "rows_noisy_256draws.jsonl")})
    table(old, "iso", "committed draws (64; noisy stacks 256)")
    table(old, "auto", "committed draws (64; noisy stacks 256)")
    table(old, "ln", "committed draws (64; noisy stacks 256)")
    table(old, "auto+ln", "committed draws (64; noisy stacks 256)")
    table(old, "auto+default", "committed draws (64; noisy stacks 256)")
    if a.new:
        new = {key(r): r for r in io.read_jsonl(a.new)}
        table(new, "iso", f"rerun {a.new} only")
        table(new, "auto", f"rerun {a.new} only")
        table(new, "auto+ln", f"rerun {a.new} only")
        table(new, "auto+default", f"rerun {a.new} only")
        table({**old, **new}, "auto", "rerun stacks + committed draws for the others")
        table({**old, **new}, "auto+ln", "rerun stacks + committed draws for the others")
        table({**old, **new}, "auto+default", "rerun stacks + committed draws for the others")


if __name__ == "__main__":
    main()
