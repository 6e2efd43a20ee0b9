"""Benchmark: a standard block's (sigma, alpha) phase diagram against the paper
block's, on the same grid size, compilation included, in one run.

For each size N (default 128 and 256) it times, each in a fresh subprocess:

* ``paper``          ``phasefield.sweep(sigma_w=linspace(.5, 4, N), alpha=linspace(.01, .99, N),
                     n_tokens=16, depth=16)`` (the paper engine);
* ``pre-ln``         ``layers.sweep.sweep_grid("pre-ln", {sigma: linspace(.1, 2, N), alpha:
                     linspace(.05, 1, N)}, fixed={"attention": "exact"}, n_tokens=16, depth=16)``;
* ``paper-generic``  the generic engine's ``paper`` preset on the same sizes (sigma_w x alpha_a,
                     its finite-depth outputs: not the paper engine's outputs, the same grid);
* ``pre-ln-causal``  the ``pre-ln`` sweep of the same block with ``causal=true`` (its points on
                     the full Gram, ``layers.causal.causal_rates_traced``; the last token's
                     rates and the per-position q_L_pos, rho_L_pos), on ``--causal-size`` points
                     per axis (default: N);

each with a **cold** compilation cache (a fresh, empty persistent-cache folder; a new process
has no in-memory cache) and then a **warm** one (the same folder again, filled by the cold
run), and prints the seconds (wall and CPU) and the ratios pre-ln / paper.
``--baseline REV`` also times ``pre-ln`` with the package of commit REV (``git archive``), cold
and warm.

    .venv/bin/python scripts/bench_blocks.py [--sizes 128 256] [--kinds paper pre-ln] [--baseline HEAD~1]
    .venv/bin/python scripts/bench_blocks.py --sizes 64 --kinds pre-ln pre-ln-causal [--causal-size 8] [--host-devices 2]

``--host-devices D`` runs every kind with D CPU devices (:func:`phasefield.use_all_cpu_cores`,
what the ``phasefield`` command does with every core: the sweeps shard each chunk's points
over them); default 1, the library's own default.

Targets: pre-ln within 3x of paper, compilation included; a 64 x 64 pre-ln-causal sweep at
n = 16, L = 16 within 10x of pre-ln's. With ``--causal-size K`` < N the causal sweep runs
K x K and the warm ratio is also given per point (its seconds times N^2 / K^2: the compiled
program is the same, the chunks scale with the points). Machines are noisy: run it on an
idle machine, or read the CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ("paper", "pre-ln", "paper-generic", "pre-ln-causal")
PRE_LN = {"attention": "exact"}  # the pre-ln kinds' block (pre-ln-causal: with causal=true)


def worker(kind: str, n: int, cache: str) -> None:
    """Subprocess: one sweep with the persistent compilation cache in ``cache``; prints JSON."""
    import jax

    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    import numpy as np

    import phasefield
    from phasefield.layers import sweep as block_sweep

    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    if kind == "paper":
        phasefield.sweep(sigma_w=np.linspace(0.5, 4.0, n), alpha=np.linspace(0.01, 0.99, n), n_tokens=16, depth=16)
    elif kind in ("pre-ln", "pre-ln-causal"):
        ds = block_sweep.sweep_grid(
            "pre-ln",
            {"sigma": np.linspace(0.1, 2.0, n), "alpha": np.linspace(0.05, 1.0, n)},
            fixed=dict(PRE_LN, causal=True) if kind == "pre-ln-causal" else PRE_LN,
            n_tokens=16,
            depth=16,
        )
        var = "lambda_g_last" if kind == "pre-ln-causal" else "lambda_g_input"
        if not np.all(np.isfinite(ds[var].values)):
            raise SystemExit(f"{kind}: {var} not finite everywhere")
    elif kind == "paper-generic":
        block_sweep.sweep_grid(
            "paper", {"sigma_w": np.linspace(0.5, 4.0, n), "alpha_a": np.linspace(0.01, 0.99, n)}, n_tokens=16, depth=16
        )
    else:
        raise SystemExit(f"unknown kind {kind}")
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps(dict(wall=time.perf_counter() - t0, cpu=r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)))


def run(kind: str, n: int, cache: str, src: str | None = None, devices: int = 1) -> dict:
    env = dict(os.environ, PYTHONPATH=src or ROOT)
    if devices > 1:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, str(n), cache]
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} N={n}: {(out.stderr.strip().splitlines() or ['failed'])[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def export(rev: str, folder: str) -> str:
    """The package of commit ``rev`` in ``folder`` (``git archive``)."""
    src = os.path.join(folder, rev.replace("/", "_"))
    os.makedirs(src, exist_ok=True)
    tar = subprocess.run(["git", "-C", ROOT, "archive", rev, "phasefield"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", src], input=tar, check=True)
    return src


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    ap.add_argument("--baseline", default=None, help="also time pre-ln at this commit")
    ap.add_argument("--causal-size", type=int, default=None, help="points per axis of pre-ln-causal [N]")
    ap.add_argument("--host-devices", type=int, default=1, help="CPU devices of every run (the command: every core)")
    ap.add_argument("--worker", nargs=3, metavar=("KIND", "N", "CACHE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), args.worker[2])
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = [(k, None) for k in args.kinds]
        if args.baseline:
            runs.append(("pre-ln", export(args.baseline, tmp)))
        for n in args.sizes:
            for kind, src in runs:
                cache = tempfile.mkdtemp(dir=tmp)  # cold: an empty persistent cache
                label = kind if src is None else f"{kind}@{args.baseline}"
                k = (args.causal_size or n) if kind == "pre-ln-causal" else n
                for state in ("cold", "warm"):
                    r = run(kind, k, cache, src, args.host_devices)
                    rows.append(dict(kind=label, n=n, k=k, cache=state, **r))
                    print(
                        f"{label:>20} {k:>4}x{k:<4} {state:>4}  wall {r['wall']:8.2f} s  cpu {r['cpu']:8.2f} s",
                        flush=True,
                    )
    print("\nratios pre-ln / paper (wall, cpu):")
    get = {(r["kind"], r["n"], r["cache"]): r for r in rows}
    for n in args.sizes:
        for state in ("cold", "warm"):
            a, b = get.get(("pre-ln", n, state)), get.get(("paper", n, state))
            if a and b:
                print(f"  {n:>4}x{n:<4} {state}: {a['wall'] / b['wall']:.2f}x  {a['cpu'] / b['cpu']:.2f}x")
    causal = [r for r in rows if r["kind"] == "pre-ln-causal"]
    if causal:
        print("\nratios pre-ln-causal / pre-ln (wall, cpu; goal at 64 x 64, n = 16, L = 16: <= 10x):")
    for r in causal:
        b = get.get(("pre-ln", r["n"], r["cache"]))
        if b is None:
            continue
        line = f"  {r['n']:>4}x{r['n']:<4} {r['cache']}: "
        if r["k"] == r["n"]:
            print(line + f"{r['wall'] / b['wall']:.2f}x  {r['cpu'] / b['cpu']:.2f}x", flush=True)
        elif r["cache"] == "warm":  # per point: the causal K x K scaled to N x N
            scale = r["n"] ** 2 / r["k"] ** 2
            print(
                line + f"{r['wall'] * scale / b['wall']:.2f}x  {r['cpu'] * scale / b['cpu']:.2f}x "
                f"(per point: causal {r['k']}x{r['k']} scaled by {scale:g})",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
