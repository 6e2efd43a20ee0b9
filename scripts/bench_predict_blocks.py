#!/usr/bin/env python
"""Time of ``phasefield predict --block`` and ``phasefield recommend --block`` for the shipped
standard-block models (targets: predict <= 2 s, recommend <= 10 s).

    python scripts/bench_predict_blocks.py                 # the commands, cold then warm
    python scripts/bench_predict_blocks.py --reference     # also the library call by both routes

Each command runs as a fresh ``phasefield`` process (interpreter, imports, model load, JAX
start-up, tracing and the persistent compilation cache included: what a user waits for), with
``PHASEFIELD_CACHE`` a new empty folder: the first call of each command is **cold** (it
compiles and fills the folder), the later ones **warm** (same folder; other numbers and the
same depth, then other depths, which are cold for that depth's program). Printed per call:
wall seconds and CPU seconds (user + system of the child). On a shared machine the CPU time
is what the command costs; the wall time adds the wait for a core.

``--reference`` also times, in this process after import, :func:`phasefield.vit.predict.predict`
at one point by the fast route (:mod:`phasefield.vit.block_rates`) and by the reference route
(``reference=True``: :func:`phasefield.vit.features.block_theory`), first call (compile
included) and second call, and prints both predictions.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time

POINTS = [
    "sigma=1,alpha_attn=0.5,alpha_mlp=0.5",
    "sigma=1.3,alpha_attn=0.4,alpha_mlp=0.7",
    "sigma=2.4,alpha_attn=1,alpha_mlp=0.9",
]


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_predict import _time  # noqa: E402  (wall, CPU) seconds of one phasefield process


def _row(label, wall, cpu, goal):
    verdict = "met" if wall <= goal else "met in CPU time" if cpu <= goal else "NOT met"
    print(f"  {label:58s} {wall:6.2f} s wall {cpu:6.2f} s CPU   (goal <= {goal:g} s: {verdict})", flush=True)


def _cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", default="pre-ln,post-ln")
    ap.add_argument("--depths", default="16,64", help="predict depths (the first is warmed first)")
    ap.add_argument("--recommend-depths", default="16")
    ap.add_argument("--no-recommend", action="store_true")
    ap.add_argument("--reference", action="store_true", help="also time the library call by both routes")
    args = ap.parse_args(argv)
    blocks = [b for b in args.blocks.split(",") if b]
    depths = [int(d) for d in args.depths.split(",") if d]
    cache = tempfile.mkdtemp(prefix="phasefield-bench-cache-")
    env = dict(os.environ, PHASEFIELD_CACHE=cache, PYTHONWARNINGS="ignore")
    try:
        print(f"compilation cache: {cache} (empty at start)")
        wall, cpu = min(_time(["--help"], env) for _ in range(2))
        print(f"  {'phasefield --help (start-up, no JAX work)':58s} {wall:6.2f} s wall {cpu:6.2f} s CPU")
        for b in blocks:
            print(f"predict --block {b}:heads=4")
            for d in depths:
                for j, pt in enumerate(POINTS):
                    state = "cold" if j == 0 else "warm"
                    wall, cpu = _time(["predict", "--block", f"{b}:heads=4,{pt}", "--depth", str(d)], env)
                    _row(f"{state}, depth {d}, {pt}", wall, cpu, 2)
        if not args.no_recommend:
            for b in blocks:
                print(f"recommend --block {b}:heads=4")
                for d in (int(v) for v in args.recommend_depths.split(",") if v):
                    for state in ("cold", "warm", "warm"):
                        wall, cpu = _time(["recommend", "--block", f"{b}:heads=4", "--depth", str(d)], env)
                        _row(f"{state}, depth {d}", wall, cpu, 10)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if args.reference:
        from phasefield.vit import predict as P

        print("library call, in process (after import; no persistent cache):")
        for b in blocks:
            doc = P.load_model(block=b)
            for ref in (False, True):
                times = []
                for _ in range(2):
                    c0, t0 = _cpu(), time.perf_counter()
                    r = P.predict(1.0, 1.0, 0.5, 0.5, depths[0], doc, reference=ref)
                    times.append((time.perf_counter() - t0, _cpu() - c0))
                route = "reference (features.block_theory)" if ref else "fast (block_rates)"
                print(
                    f"  {b:8s} {route:34s} first {times[0][0]:6.2f} s wall {times[0][1]:6.2f} s CPU, "
                    f"second {times[1][0]:6.2f} s wall {times[1][1]:6.2f} s CPU; loss {r['predicted_loss']:.15f}, "
                    f"lambda_a {r['lambda_a']:+.15f}, angle_rate {r['angle_rate']:+.15f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
