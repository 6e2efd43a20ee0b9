"""Hugging Face transformers' Flax GPT-2, BERT and ViT at random init (no download), probed
at their standard init and as the init std, GPT-2's 1/sqrt(2L) projection scaling and the
depth change (the table in docs/probe.md).

    .venv/bin/python scripts/probe_hf.py [--inits 8] [--out docs/data/probe/hf.jsonl] [--report]

Resumable: one JSON line per configuration, appended when done (with its wall time, the
compile included). Needs the extra probe-hf (transformers 4.x).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import phasefield
from phasefield.io import append_jsonl, read_jsonl
from phasefield.probing import hf

# (model, depth, std (None: as shipped), scaled)
CONFIGS = [
    ("gpt2", 12, None, False),
    ("gpt2", 12, None, True),
    ("gpt2", 12, 0.01, False),
    ("gpt2", 12, 0.05, False),
    ("gpt2", 12, 0.05, True),
    ("gpt2", 24, None, False),
    ("gpt2", 24, None, True),
    ("bert", 12, None, False),
    ("bert", 12, None, True),
    ("bert", 12, 0.05, False),
    ("vit", 12, None, False),
    ("vit", 12, 0.02, False),
    ("vit", 12, 0.02, True),
]
SIZE = dict(gpt2=dict(n_tokens=32, batch=1), bert=dict(n_tokens=32, batch=1), vit=dict(n_tokens=17, batch=2))


def run(model, depth, std, scaled, inits):
    m = getattr(hf, model)(depth=depth, std=std, scaled=scaled, **SIZE[model])
    t0 = time.perf_counter()
    res = phasefield.probe(m, inits=inits)
    sec = time.perf_counter() - t0
    la, la_se = res.angle_rate
    lg, lg_se = res.lambda_g_input
    return dict(
        model=model,
        depth=depth,
        std=std,
        scaled=scaled,
        inits=inits,
        width=768,
        **SIZE[model],
        angle_rate=la,
        angle_rate_se=la_se,
        lambda_g_input=lg,
        lambda_g_input_se=lg_se,
        phase=list(res.phase),
        rho_in=float(res.ds["rho_data"][0]),
        rho_out=float(res.ds["rho_data"][-1]),
        q_in=float(res.ds["q_data"][0]),
        q_out=float(res.ds["q_data"][-1]),
        verdict=res.verdict(),
        seconds=round(sec, 1),
    )


def load(path):
    """The rows written so far (a torn last line, from a kill in mid-write, is skipped)."""
    return read_jsonl(path)


def report(rows):
    lines = [
        "| model | L | weight std | 1/sqrt(2L) | angle_rate | lambda_g_input | phase | rho in -> out | q in -> out | "
        "seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        std = "as shipped" if r["std"] is None else f"{r['std']:g}"
        lines.append(
            f"| {r['model']} | {r['depth']} | {std} | {'yes' if r['scaled'] else 'no'} | "
            f"{r['angle_rate']:+.4f} +- {r['angle_rate_se']:.4f} | {r['lambda_g_input']:+.4f} +- {r['lambda_g_input_se']:.4f} | "
            f"{'/'.join(r['phase'])} | {r['rho_in']:.3f} -> {r['rho_out']:.3f} | "
            f"{r['q_in']:.3g} -> {r['q_out']:.3g} | {r['seconds']:.0f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inits", type=int, default=8)
    ap.add_argument("--out", default="docs/data/probe/hf.jsonl")
    ap.add_argument("--only", default=None, help="a model name: run only its configurations")
    ap.add_argument("--report", action="store_true")
    a = ap.parse_args(argv)
    rows = load(a.out)
    if not a.report:
        done = {(r["model"], r["depth"], r["std"], r["scaled"], r["inits"]) for r in rows}
        for model, depth, std, scaled in CONFIGS:
            if (a.only and model != a.only) or (model, depth, std, scaled, a.inits) in done:
                continue
            row = run(model, depth, std, scaled, a.inits)
            print(json.dumps({k: row[k] for k in ("model", "depth", "std", "scaled", "phase", "seconds")}), flush=True)
            append_jsonl(a.out, row)
            rows.append(row)
    print(report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
