#!/usr/bin/env python
"""Wall time of ``phasefield predict`` and ``phasefield recommend`` per depth.

    python scripts/bench_predict.py                  # the commands, as a user runs them
    python scripts/bench_predict.py --old 16,64      # also the former route, in process

Each command runs as a fresh ``phasefield`` process (import, model load, JAX start-up and
the persistent compilation cache included: what a user waits for). The first call of each
command warms the cache (``PHASEFIELD_CACHE``, default ~/.cache/phasefield/jax) and is
reported apart. Goals: predict <= 2 s and recommend <= 10 s at any depth the grid allows,
once the cache is warm.

``--old D,...`` also times, in this process, the route predict took before: every theory
feature of :func:`phasefield.vit.features.features` (the full ``paper.exponents`` with
its multistability search, and a forward/backward trajectory of L blocks) for one point,
against :func:`phasefield.vit.predict.predict`, which computes only what its model uses;
both compiled first, so the ratio is of run time alone.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

PREDICT = ["predict", "--sigma-w", "1.2", "--alpha-a", "0.4", "--alpha-m", "0.6", "--sigma-a", "1"]


def _time(args, env=None):
    """(wall, CPU) seconds of one ``phasefield`` process (environment ``env``, default this
    one's). On a shared machine the CPU time (user + system of the child) is what the command
    costs; the wall time adds the wait for a core."""
    c0 = os.times()
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "phasefield"] + args, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t0
    c1 = os.times()
    if r.returncode:
        raise SystemExit(f"phasefield {' '.join(args)} failed: {r.stderr.strip()}")
    return dt, (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)


def _row(name, d, times, goal):
    wall, cpu = min(times)
    print(
        f"{name:9s} depth {d:5d}: {wall:6.2f} s wall, {cpu:6.2f} s CPU   (goal <= {goal:g} s: "
        f"{'met' if wall <= goal else 'met in CPU time' if cpu <= goal else 'NOT met'})",
        flush=True,
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depths", default="1,16,64,256,1000,4000", help="predict depths")
    ap.add_argument("--recommend-depths", default="1,16,4000")
    ap.add_argument("--repeats", type=int, default=2, help="timed calls per depth (the best is printed)")
    ap.add_argument("--old", default="", help="depths at which to time the former all-features route too")
    args = ap.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",") if d]
    print(
        "baseline: phasefield --help (start-up alone): {:.2f} s wall, {:.2f} s CPU".format(
            *min(_time(["--help"]) for _ in range(2))
        )
    )
    print(
        "first predict call (fills the compilation cache): {:.2f} s wall, {:.2f} s CPU".format(
            *_time(PREDICT + ["--depth", str(depths[0])])
        )
    )
    for d in depths:
        _row("predict", d, [_time(PREDICT + ["--depth", str(d)]) for _ in range(args.repeats)], 2)
    rdepths = [int(d) for d in args.recommend_depths.split(",") if d]
    print(
        "first recommend call (fills the compilation cache): {:.2f} s wall, {:.2f} s CPU".format(
            *_time(["recommend", "--depth", str(rdepths[0])])
        )
    )
    for d in rdepths:
        _row("recommend", d, [_time(["recommend", "--depth", str(d)]) for _ in range(args.repeats)], 10)
    if args.old:
        from phasefield.vit import features as F
        from phasefield.vit import predict as P
        from phasefield.vit.train import TrainConfig

        doc = P.load_model()
        cfg = TrainConfig.from_dict(doc["train_config"])
        g = doc["input_geometry"]
        for d in (int(v) for v in args.old.split(",") if v):
            c = [dict(sigma_w=1.2, sigma_a=1.0, alpha_a=0.4, alpha_m=0.6, depth=d)]
            F.features(cfg, c, g["q0"], g["rho0"], maps=("paper",))  # compile
            P.predict(1.2, 1.0, 0.4, 0.6, d, doc)
            t0 = time.perf_counter()
            F.features(cfg, c, g["q0"], g["rho0"], maps=("paper",))
            t_old = time.perf_counter() - t0
            t0 = time.perf_counter()
            P.predict(1.2, 1.0, 0.4, 0.6, d, doc)
            t_new = time.perf_counter() - t0
            print(
                f"in process, depth {d:5d}: all features {t_old:8.4f} s, predict {t_new:8.4f} s, "
                f"ratio {t_old / max(t_new, 1e-9):8.0f}x",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
