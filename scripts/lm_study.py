"""Does ``probe --fix`` beat the named initialization recipes on a causal language model?
Resumable.

    python scripts/lm_study.py run [--block post-ln] [--depth 32] [--seeds 0] [--arms ...]
    python scripts/lm_study.py table        # docs/data/lm_study/{table.md, summary.md}, docs/images/lm_study.png

For each block and depth, the language model of ``phasefield train-lm`` (docs/lm.md: the
block's own causal network, width 128, 4 heads, context 64, batch 16, 300 Adam steps at
1e-3, clip 1.0, on the standard library's sources) is trained once per arm and seed:

* ``as is``: the preset's init as drawn;
* ``fixed``: the multipliers of ``phasefield probe --block NAME:causal=true --fix`` on the
  block's own stack at the model's width, depth and context (8 inits, the search at 2 per
  point, the check at 8; found once per block and depth and kept in ``fixes.jsonl``);
  ``fixed-strict``: the same with stricter criteria (``--max-gradient-factor 2
  --max-angle-rate 0.01``); ``fixed-residual``: the same search's point on the residual knob
  alone (``fix.search.axes.residual``: the least change of the residual output projections
  that meets the criteria, every other multiplier 1), where there is one;
* every recipe of :mod:`phasefield.probing.recipes` (``train-lm --recipe``; one that does
  not apply, DeepNorm on pre-LN, is said so and not trained).

Every run is one ``phasefield train-lm`` process writing its JSON line to
``docs/data/lm_study/runs/<block>_L<depth>_<arm>.jsonl`` (a rerun trains only the missing
seeds). ``table``: one row per run, then per arm the runs that train (held-out bits per
character 0.5 below the unigram's), the mean held-out bpc and the paired difference to the
fix (arm - fixed, mean +- se over the (block, depth, seed) pairs).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from recipes_study import figure, residual_axis, summary_rows  # noqa: E402  (the ViT study's summary, axis, figure)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "data", "lm_study")
RECIPES = ("deepnorm", "t-fixup", "gpt2", "depth-mup", "completep", "rezero", "small-std")
ARMS = ("as is", "fixed", "fixed-strict", "fixed-residual", *RECIPES)
SHAPE = dict(width=128, heads=4, context=64, batch=16, steps=300)
PROBE = dict(inits=8, fix_inits=2, verify_inits=8)
CRITERIA = {
    "fixed": dict(max_gradient_factor=10.0, max_angle_rate=0.05),
    "fixed-strict": dict(max_gradient_factor=2.0, max_angle_rate=0.01),
    "fixed-residual": dict(max_gradient_factor=10.0, max_angle_rate=0.05),
}


def _phasefield(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phasefield", *args], capture_output=True, text=True, check=False)


def find_fix(block: str, depth: int, arm: str = "fixed") -> dict:
    """The fix of ``block``'s causal stack at the model's shape, from ``fixes.jsonl`` or
    found by ``phasefield probe --fix`` (and appended)."""
    path = os.path.join(OUT, "fixes.jsonl")
    crit = CRITERIA[arm]
    key = dict(block=block, depth=depth, width=SHAPE["width"], n_tokens=SHAPE["context"], **PROBE)
    if arm == "fixed-strict":
        key.update(crit)
    if arm == "fixed-residual":
        key["knob"] = "residual"
    if os.path.exists(path):
        for line in open(path):
            row = json.loads(line)
            if row["key"] == key:
                return row
    t0 = time.time()
    r = _phasefield(
        "probe", "--block", f"{block}:causal=true,heads={SHAPE['heads']}", "--width", str(SHAPE["width"]),
        "--depth", str(depth), "--n-tokens", str(SHAPE["context"]), "--inits", str(PROBE["inits"]), "--fix",
        "--fix-inits", str(PROBE["fix_inits"]), "--verify-inits", str(PROBE["verify_inits"]), "--recipes", "none",
        "--json", "--quiet", *(x for k, v in crit.items() for x in (f"--{k.replace('_', '-')}", str(v))),
    )  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"probe --fix failed for {block} L{depth}:\n{r.stderr}")
    fix = json.loads(r.stdout)["fix"]
    mult = fix["multipliers"]
    if arm == "fixed-residual":  # the search's point on the residual knob alone (None: there is none)
        m = residual_axis(fix)
        mult = None if m is None else {"residual": m}
    row = dict(key=key, multipliers=mult, meets=fix["meets"], before=fix.get("before"),
               after=fix.get("after"), seconds=time.time() - t0)  # fmt: skip
    os.makedirs(OUT, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def _recipe_applies(block, depth, name) -> bool:
    from phasefield.lm import train as lm_train

    cfg = lm_train.LMConfig(block=block, depth=depth, width=SHAPE["width"], heads=SHAPE["heads"], n=SHAPE["context"])
    return bool(lm_train.recipe_multipliers(cfg, name)[1]["applicable"])


def _runs_file(block, depth, arm) -> str:
    return os.path.join(OUT, "runs", f"{block}_L{depth}_{arm.replace(' ', '-')}.jsonl")


def run(args):
    os.makedirs(os.path.join(OUT, "runs"), exist_ok=True)
    seeds = ",".join(str(s) for s in args.seeds)
    for block in args.block:
        for depth in args.depth:
            base = [
                "train-lm", "--block", block, "--depth", str(depth), "--seeds", seeds, "--quiet",
                *(x for k, v in SHAPE.items() for x in (f"--{k}", str(v))),
            ]  # fmt: skip
            for arm in args.arms:
                extra = []
                if arm in CRITERIA:
                    m = find_fix(block, depth, arm)["multipliers"]
                    if m is None:
                        print(f"[{block} L{depth}] {arm}: the search has no such point, not trained", flush=True)
                        continue
                    extra = ["--multipliers", ",".join(f"{k}={v:.6g}" for k, v in m.items())]
                elif arm != "as is":
                    if not _recipe_applies(block, depth, arm):
                        print(f"[{block} L{depth}] {arm}: not applicable, not trained", flush=True)
                        continue
                    extra = ["--recipe", arm]
                t0 = time.time()
                r = _phasefield(*base, *extra, "--out", _runs_file(block, depth, arm))
                if r.returncode != 0:
                    raise SystemExit(f"train-lm failed ({block} L{depth} {arm}):\n{r.stderr}")
                print(f"[{block} L{depth}] {arm}: {time.time() - t0:.0f} s", flush=True)


def load_runs() -> list:
    rows = []
    for path in sorted(glob.glob(os.path.join(OUT, "runs", "*.jsonl"))):
        block, depth, arm = os.path.basename(path)[: -len(".jsonl")].split("_", 2)
        for line in open(path):
            r = json.loads(line)
            rows.append(dict(r, block=block, depth=int(depth[1:]), arm="as is" if arm == "as-is" else arm))
    return rows


def table(args):
    rows = load_runs()
    lines = ["| block | depth | arm | seed | held-out bpc | trains |", "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["block"], r["depth"], ARMS.index(r["arm"]), r["seed"])):
        bpc, trains = f"{r['held_bpc']:.3f}", "yes" if r["trains"] else "no"
        lines.append(f"| {r['block']} | {r['depth']} | {r['arm']} | {r['seed']} | {bpc} | {trains} |")
    with open(os.path.join(OUT, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    runs = [dict(r, config=f"{r['block']}_L{r['depth']}") for r in rows]
    out = ["| arm | runs | train | mean held-out bpc | arm - fixed (mean ± se, pairs) |", "|---|---|---|---|---|"]
    for s in summary_rows(runs, ARMS, "held_bpc"):
        out.append(
            f"| {s['arm']} | {s['runs']} | {s['trains']} of {s['runs']} | {s['mean_loss']:.3f} | "
            f"{s['diff_mean']:+.3f} ± {s['diff_se']:.3f} ({s['pairs']}) |"
        )
    with open(os.path.join(OUT, "summary.md"), "w") as f:
        f.write("\n".join(out) + "\n")
    print("\n".join(out))
    unigram = rows[0]["unigram_bpc"]
    panels = [
        (f"{block} L {depth}", [dict(r, loss=r["held_bpc"]) for r in rows if (r["block"], r["depth"]) == (block, depth)],
         unigram - rows[0]["config"]["margin"])
        for block, depth in sorted({(r["block"], r["depth"]) for r in rows})
    ]  # fmt: skip
    figure(panels, "lm_study", "held-out bits per character", unigram, arms=ARMS)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--block", nargs="+", default=["post-ln"], choices=["post-ln", "pre-ln"])
    r.add_argument("--depth", type=int, nargs="+", default=[32])
    r.add_argument("--seeds", type=int, nargs="+", default=[0])
    r.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    sub.add_parser("table")
    args = ap.parse_args(argv)
    (run if args.cmd == "run" else table)(args)


if __name__ == "__main__":
    main()
