"""Start-up time of the installed ``phasefield`` command, as a user's shell runs it.

Times (wall clock, the median of ``--runs`` runs after one untimed warm-up run, so the page
cache and phasefield's compilation cache are warm) of

* ``phasefield --help``                                   target 1 s
* ``phasefield predict --sigma-w 1.2 --sigma-a 1 --alpha-a .4 --alpha-m .6 --depth 24 --json``
                                                          target 2.5 s

each with and without ``PYTHONDONTWRITEBYTECODE=1`` in the environment (``PYTHONPYCACHEPREFIX``
removed: Python then finds byte-code only in the installed ``__pycache__`` folders, which the
Makefile's install writes). Prints each median, its ratio to the target and PASS/FAIL; exits 1
when a target is missed.

    python scripts/bench_cli.py [--runs 5] [--phasefield .venv/bin/phasefield]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

PREDICT = [
    "predict",
    "--sigma-w",
    "1.2",
    "--sigma-a",
    "1",
    "--alpha-a",
    ".4",
    "--alpha-m",
    ".6",
    "--depth",
    "24",
    "--json",
]
CASES = [("phasefield --help", ["--help"], 1.0), ("phasefield predict ... --json", PREDICT, 2.5)]


def wall(cmd, env) -> float:
    start = time.perf_counter()
    res = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - start
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr.strip()[-500:]}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="timed runs per case (the median is reported)")
    ap.add_argument(
        "--phasefield",
        default=os.path.join(os.path.dirname(sys.executable), "phasefield"),
        help="the command to time (default: the one beside this Python)",
    )
    args = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    envs = [("byte-code written", base), ("PYTHONDONTWRITEBYTECODE=1", {**base, "PYTHONDONTWRITEBYTECODE": "1"})]

    print(
        f"{args.phasefield}; median of {args.runs} runs after a warm-up; "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    )
    print(f"{'command':<32} {'environment':<27} {'median s':>9} {'min s':>7} {'target s':>9} {'ratio':>6}  result")
    failed = False
    for label, argv, target in CASES:
        for env_label, env in envs:
            cmd = [args.phasefield, *argv]
            wall(cmd, env)  # warm-up
            times = [wall(cmd, env) for _ in range(args.runs)]
            med = statistics.median(times)
            ok = med <= target
            failed |= not ok
            print(
                f"{label:<32} {env_label:<27} {med:9.2f} {min(times):7.2f} {target:9.1f} {med / target:6.2f}  "
                f"{'PASS' if ok else 'FAIL'}"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
