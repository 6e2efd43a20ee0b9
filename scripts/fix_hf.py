"""``phasefield probe --fix`` on Hugging Face's Flax GPT-2 at its shipped init, timed.

    .venv/bin/python scripts/fix_hf.py [--depth 12 48] [--n-tokens 64] [--out docs/data/fix/hf.jsonl]

Each configuration runs the command line in a child process (the progress bar on this
terminal), and one JSON line is appended to ``--out`` when it is done: the rates searched
(``fix.rates``: the last token's, GPT-2 being causal), the rates before, the multipliers, the
measured rates after the fix with standard errors, ``fix.meets``, every recipe's rates and
``meets``, the wall time and the child's peak resident memory. Resumable: a (depth, tokens)
with a row in ``--out`` is skipped; rows without ``rates`` (an earlier search of the whole
sequence's rates) do not count.
Needs the extra probe-hf (transformers 4.x).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from phasefield.io import append_jsonl, read_jsonl  # noqa: E402

SEQUENCE = ("angle_rate", "lambda_g_input")  # the rates of rows without ``rates``


def run(depth: int, n_tokens: int, inits: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "probe.json")
        cmd = [
            sys.executable,
            "-m",
            "phasefield",
            "probe",
            "--model",
            "phasefield.probing.hf:gpt2",
            "--depth",
            str(depth),
            "--n-tokens",
            str(n_tokens),
            "--set",
            "batch=1",
            "--inits",
            str(inits),
            "--fix",
            "--json",
        ]
        t0 = time.perf_counter()
        with open(out, "w") as f:
            child = subprocess.Popen(cmd, stdout=f)
            _, status, usage = os.wait4(child.pid, 0)  # this child's own peak memory
        sec = time.perf_counter() - t0
        if os.waitstatus_to_exitcode(status):
            raise SystemExit(f"{' '.join(cmd)} failed (exit {os.waitstatus_to_exitcode(status)})")
        with open(out) as f:
            doc = json.load(f)
    peak_kib = usage.ru_maxrss
    fix = doc["fix"]
    rates = fix.get("rates", list(SEQUENCE))
    recipes = [
        dict(
            name=r["name"],
            applicable=r["applicable"],
            reason=r.get("reason"),
            meets=r.get("meets"),
            after={k: v for k, v in (r.get("after") or {}).items() if k.startswith((*rates, "gradient_factor"))},
        )
        for r in fix.get("recipes", [])
    ]
    return dict(
        model="gpt2",
        depth=depth,
        width=768,
        n_tokens=n_tokens,
        batch=1,
        init="as shipped",
        inits=inits,
        command=" ".join(["phasefield"] + cmd[3:]),
        rates=rates,
        before={k: doc[k] for k in (*SEQUENCE, *rates) if k in doc},
        first_failing_block=doc.get("first_failing_block"),
        multipliers=fix["multipliers"],
        after=fix["after"],
        meets=fix["meets"],
        criteria=fix.get("criteria"),
        recipes=recipes,
        seconds=round(sec, 1),
        peak_rss_gib=round(peak_kib / 2**20, 2),
        cpus=os.cpu_count(),
        date=time.strftime("%Y-%m-%d"),
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, nargs="+", default=[12, 48])
    ap.add_argument("--n-tokens", type=int, default=64)
    ap.add_argument("--inits", type=int, default=16)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "data", "fix", "hf.jsonl"))
    args = ap.parse_args(argv)
    done = {(r["depth"], r["n_tokens"]) for r in read_jsonl(args.out) if "rates" in r}
    for depth in args.depth:
        if (depth, args.n_tokens) in done:  # the probe searches GPT-2's last token: rows of its rates
            continue
        row = run(depth, args.n_tokens, args.inits)
        append_jsonl(args.out, row)
        print(json.dumps({k: row[k] for k in ("depth", "multipliers", "after", "meets", "seconds", "peak_rss_gib")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
