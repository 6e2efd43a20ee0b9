"""The ViT trainer on every preset block: digits, width 32, 4 blocks, 4 heads,
Adam 1e-3 and 1e-2, 10 epochs, the presets' GPT-2-like init (sigma = 0.55, alpha = 1) and
a small-branch one (alpha = 0.2); each run's theory point recorded beside its losses.

    .venv/bin/python scripts/train_presets.py [--out docs/data/blocks/train.jsonl]   # resumable
"""

from __future__ import annotations

import argparse
import dataclasses

from phasefield.io import append_jsonl, read_jsonl
from phasefield.vit import data as vdata
from phasefield.vit.sweep import theory_exponents
from phasefield.vit.train import TrainConfig, Trainer, make_points

BLOCKS = [
    "paper",
    "pre-ln:heads=4",
    "post-ln:heads=4",
    "rms-swiglu:heads=4",
    "deepscalelm:heads=4",
    "pre-ln:heads=4,qk_norm=true",
]
CFG = TrainConfig(dataset="digits", image_size=8, patch_size=2, width=32, depth=4, epochs=10, batch_size=64)
RUNS = [
    dict(sigma_w=0.55, sigma_a=1.0, alpha_a=1.0, alpha_m=1.0),
    dict(sigma_w=0.55, sigma_a=1.0, alpha_a=0.2, alpha_m=0.2),
]
LRS = [1e-3, 1e-2]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="docs/data/blocks/train.jsonl")
    a = ap.parse_args(argv)
    done = {r["block"] for r in read_jsonl(a.out)}  # a torn last line is skipped
    data = vdata.load("digits", 8)
    for spec in BLOCKS:
        if spec in done:
            continue
        cfg = dataclasses.replace(CFG, block=spec).validate()
        runs = [dict(r, lr=lr) for r in RUNS for lr in LRS]
        col = lambda k: [r[k] for r in runs]
        pts = make_points(
            cfg, col("sigma_w"), col("sigma_a"), col("alpha_a"), col("alpha_m"), col("lr"), [0] * len(runs)
        )
        _, m = Trainer(cfg, data).train_many(pts)
        lam = theory_exponents(cfg, runs)
        rows = [
            dict(
                r,
                train_loss=float(m["train_loss"][i]),
                test_loss=float(m["test_loss"][i, -1]),
                test_acc=float(m["test_acc"][i, -1]),
                **{k: float(v[i]) for k, v in lam.items()},
            )
            for i, r in enumerate(runs)
        ]
        append_jsonl(a.out, dict(block=spec, config=cfg.to_dict(), runs=rows))
        for r in rows:
            print(spec, r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
