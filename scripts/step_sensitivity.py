"""Does one optimizer step's effect at init say which arms of the recipes study train? Resumable.

    python scripts/step_sensitivity.py run [--configs PREFIX ...] [--seeds 0]
    python scripts/step_sensitivity.py table      # docs/data/recipes/step.md

The probe's criteria (the tokens' angle rate and the gradient factor at init) are met by
every arm of the post-LN L 32, sigma 0.55 configuration, yet only the arms that shrink each
block's branch next to its residual stream train there (``docs/fixing.md``). Admin (Liu et
al. 2020) explains post-LN failures by the output's sensitivity to a parameter update, which
grows with the branches' share. This script measures that sensitivity at init for every arm
of :mod:`recipes_study`: the ViT of a configuration and seed with the arm's multipliers (the
study's own initialization), one batch of 64 training images, Adam's first step (for Adam
the first update is ``lr * sign(g)``; lr 1e-3, the study's), and on 512 test images

* ``rel``: the relative change of the logits (centred over the classes),
  ``|l1 - l0| / |l0|``;
* ``dloss``: the change of the test loss.

One row per (configuration, arm, seed) in ``docs/data/recipes/step.jsonl``; ``table`` sets
each beside the arm's final test losses of the study and says, per configuration, whether
``rel`` separates the arms that train (2 or 3 of 3 seeds) from those that do not (every
training arm's ``rel`` below every failing arm's), and, run by run (the same seed's
training), the chance that a run that trains has the smaller ``rel`` of a pair (0.5: no
information; 1: a perfect criterion), per configuration and pooled.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fix_study as fs  # noqa: E402
import recipes_study as rs  # noqa: E402

OUT = os.path.join(rs.OUT, "step.jsonl")
CONFIGS = ("post-ln_L32_sw0.5533", "post-ln_L16_sw0.8889", "post-ln_L16_sw1.8916", "mnist1d_post-ln_L16_sw1.1820")
LR, BATCH, N_EVAL = 1e-3, 64, 512


def measure(cid, fix_row, seed) -> list:
    """Every arm's ``rel`` and ``dloss`` (module docstring) at one configuration and seed."""
    import jax
    import jax.numpy as jnp
    import optax

    from phasefield.vit import train as vtm
    from phasefield.vit.train import preprocess

    block, depth, data = fix_row["block"], fix_row["depth"], fix_row["data"]
    c = {k: fix_row[k] for k in ("sigma_w", "alpha_a", "alpha_m")}
    tr = fs.Training(block, depth, data)
    d = tr.data
    params0 = rs.first_params(tr, c, seed)
    xb = jnp.asarray(preprocess(d.x_train[:BATCH], d.scale, tr.cfg.patch_size))
    yb = jnp.asarray(d.y_train[:BATCH].astype(np.int32))
    xe = jnp.asarray(preprocess(d.x_test[:N_EVAL], d.scale, tr.cfg.patch_size))
    ye = jnp.asarray(d.y_test[:N_EVAL].astype(np.int32))
    rows = []
    for arm in rs.ARMS:
        mult, _ = rs.arm_multipliers(tr, arm, block, depth, fix_row, params0)
        if mult is None:  # not applicable
            continue
        cc = dict(c, **(rs.recommended(fix_row) if arm == "recommend" else {}))
        pts = tr.vt.make_points(tr.cfg, [cc["sigma_w"]], [1.0], [cc["alpha_a"]], [cc["alpha_m"]], [LR], [seed])
        st = tr._init(pts, jnp.asarray(tr.multipliers(dict(mult=mult))[None]), d.x_train)
        point = jax.tree.map(lambda a: a[0], st["point"])
        params = jax.tree.map(lambda a: a[0], st["params"])
        model = vtm.model_for(tr.cfg, point.hp, d.num_classes)

        def logits(p, x, model=model):
            return model.apply({"params": p}, x)

        def loss(p, x, y, logits=logits):
            return optax.softmax_cross_entropy_with_integer_labels(logits(p, x), y).mean()

        g = jax.grad(loss)(params, xb, yb)
        p1 = jax.tree.map(lambda a, b: a - LR * jnp.sign(b), params, g)  # Adam's first step
        l0, l1 = logits(params, xe), logits(p1, xe)
        l0, l1 = l0 - l0.mean(-1, keepdims=True), l1 - l1.mean(-1, keepdims=True)
        rel = float(jnp.linalg.norm(l1 - l0) / jnp.linalg.norm(l0))
        dloss = float(loss(p1, xe, ye) - loss(params, xe, ye))
        rows.append(dict(config=cid, arm=arm, seed=seed, rel=rel, dloss=dloss, lr=LR, batch=BATCH, n_eval=N_EVAL))
        print(f"{cid[:36]:36s} {arm:10s} seed {seed}: rel {rel:.3f}  dloss {dloss:+.3f}", flush=True)
    return rows


def run(args):
    fixes = {r["config"]: r for r in fs._rows(rs.FIXES)}
    # a (configuration, seed) is done when its last arm's row is there: its rows are written at
    # once, in ``rs.ARMS`` order, and a torn write loses a suffix (which ``fs._rows`` skips)
    done = {(r["config"], r["seed"]) for r in fs._rows(OUT) if r["arm"] == rs.ARMS[-1]}
    for prefix in args.configs:
        cids = [c for c in fixes if c.startswith(prefix)]
        if len(cids) != 1:
            raise SystemExit(f"--configs {prefix}: {len(cids)} configurations of the study start so")
        for seed in args.seeds:
            if (cids[0], seed) not in done:
                rows = measure(cids[0], fixes[cids[0]], seed)
                with open(OUT, "a") as fh:  # the configuration's rows at once
                    fh.write("".join(json.dumps(r) + "\n" for r in rows))


def _below(pos, neg) -> float:
    """P(a < b) over the pairs (a in ``pos``, b in ``neg``), ties counting one half."""
    return float(np.mean([(a < b) + 0.5 * (a == b) for a in pos for b in neg]))


def table(args):
    runs = fs._rows(os.path.join(rs.OUT, "runs.jsonl"))
    rows = list({(r["config"], r["arm"], r["seed"]): r for r in fs._rows(OUT)}.values())  # a rerun's rows last
    lines = [
        "| configuration | arm | seed | rel | dloss | final test losses (seeds 0-2) | trains |",
        "|---|---|---|---|---|---|---|",
    ]
    verdicts, pooled = [], ([], [])
    by_run = {(x["config"], x["arm"], x["seed"]): x["trains"] for x in runs if "trains" in x}
    for cid in dict.fromkeys(r["config"] for r in rows):
        trains, fails = [], []  # by the arm's majority over its seeds
        per_run = ([], [])  # by the run of the same seed
        for r in [x for x in rows if x["config"] == cid]:
            per_run[0 if by_run[(cid, r["arm"], r["seed"])] else 1].append(r["rel"])
            rr = sorted((x for x in runs if x["config"] == cid and x["arm"] == r["arm"]), key=lambda x: x["seed"])
            ok = sum(x["trains"] for x in rr)
            losses = " / ".join(f"{x['test_loss']:.3f}" for x in rr)
            lines.append(
                f"| {cid} | {r['arm']} | {r['seed']} | {r['rel']:.3f} | {r['dloss']:+.3f} | {losses} | {ok} of {len(rr)} |"
            )
            (trains if 2 * ok > len(rr) else fails).append(r["rel"])
        pooled[0].extend(per_run[0])
        pooled[1].extend(per_run[1])
        sep = bool(trains and fails and max(trains) < min(fails))
        verdicts.append(
            f"- {cid}: `rel` of the arms that train {min(trains):.2f}-{max(trains):.2f}, of those that do not "
            f"{min(fails):.2f}-{max(fails):.2f}: {'separates' if sep else 'does not separate'}; run by run "
            f"P(rel of a run that trains < rel of one that fails) = {_below(*per_run):.2f} "
            f"({len(per_run[0])} and {len(per_run[1])} runs)"
            if trains and fails
            else f"- {cid}: every arm {'trains' if trains else 'fails'}"
        )
    if pooled[0] and pooled[1]:
        verdicts.append(
            f"- pooled: P = {_below(*pooled):.2f} ({len(pooled[0])} runs that train, {len(pooled[1])} that fail)"
        )
    with open(os.path.join(rs.OUT, "step.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n\n" + "\n".join(verdicts) + "\n")
    print("\n".join(verdicts))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    sub.add_parser("table")
    args = ap.parse_args(argv)
    {"run": run, "table": table}[args.cmd](args)


if __name__ == "__main__":
    main()
