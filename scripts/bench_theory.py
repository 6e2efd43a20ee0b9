"""Benchmark: grid points per second of ``phasefield.sweep`` (every output: lambda_a,
lambda_g(16), lambda_g_inf, q*, rho*, n_stable, rho*_min, rho*_max), in one run against

* the thorough evaluation (one vmap over the chunk, every root bracket refined at every
  point: ``sweep(_thorough=True)``, the same numbers) in this process,
* the code of commit 664db5c (before the multistability outputs), of a2225cf (before the
  tiled sweep) and of 44c508e (before one engine served every block), each exported with ``git archive`` and run in a subprocess on the same
  grid (``--no-commits`` skips them),
* a straightforward jit/vmap 2-D Gauss–Hermite (24 nodes) baseline ("GH-24"),

and the accuracy of today's sweep and GH-24 against the dense reference. It also splits a
sweep's time into the MLP tables (built once per sigma_w) and the points, and estimates the
flops per point and the rate a flop-bound evaluation would reach on this machine.

    .venv/bin/python scripts/bench_theory.py [--size 1024 | --n-sigma 128 --n-alpha 1024]

Goals on the 2-core CPU: >= 100,000 points/s with every lambda within 1e-6 of the
dense reference, >= 15x GH-24; the full outputs >= 3x the thorough evaluation's rate and
>= 1x 664db5c's (the multistability outputs cost no speed). Machines are noisy: compare the ratios (measured alternately), not the times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from phasefield.layers import registry

PAPER = registry.lookup("paper").engine.namespace  # the paper engine's own modules
paper_sweep = PAPER.sweep

SIGMA_A, N_TOKENS, DEPTH = 1.0, 32, 16
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITS = {
    "664db5c": "before the multistability outputs",
    "a2225cf": "main before the tiled sweep",
    "44c508e": "main before one engine for every block",
}
GOALS = {"664db5c": 1.0, "a2225cf": 3.0, "44c508e": 0.9}  # today / commit
DEFAULT_COMMITS = ("664db5c", "a2225cf", "44c508e")


def _grid(args):
    return np.linspace(0.5, args.sigma_max, args.n_sigma), np.linspace(0.01, 0.99, args.n_alpha)


def _time_sweep(sweep, sw, al, **kw):
    t0 = time.perf_counter()
    sweep(sigma_w=sw, alpha=al, sigma_a=SIGMA_A, n_tokens=N_TOKENS, depth=DEPTH, **kw)
    return time.perf_counter() - t0


def worker(args):
    """Subprocess mode: time the ``phasefield`` found on PYTHONPATH (an exported commit)."""
    import phasefield

    sw, al = _grid(args)
    first = _time_sweep(phasefield.sweep, sw, al)
    times = [_time_sweep(phasefield.sweep, sw, al) for _ in range(args.repeats)]
    print(json.dumps(dict(first=first, times=times)))


def run_commit(commit, args, folder):
    """Export ``commit``'s package (once) and time its sweep in a subprocess."""
    src = os.path.join(folder, commit)
    if not os.path.isdir(src):
        os.makedirs(src)
        tar = subprocess.run(
            ["git", "-C", ROOT, "archive", commit, "phasefield"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", src], input=tar, check=True)
    env = dict(os.environ, PYTHONPATH=src)
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        "--n-sigma",
        str(args.n_sigma),
        "--n-alpha",
        str(args.n_alpha),
        "--sigma-max",
        str(args.sigma_max),
        "--repeats",
        str(args.repeats),
    ]
    out = subprocess.run(cmd, env=env, cwd=folder, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{commit}: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- the baseline: 2-D Gauss–Hermite with 24 nodes, everything per point ---------------------
# (jax and phasefield are imported in main(): the workers import the exported commit's)


def _gh(n=24):
    x, w = np.polynomial.hermite_e.hermegauss(n)
    return jnp.asarray(x), jnp.asarray(w / w.sum())


def baseline_point(sw, alpha, n_iter=200):
    """Straightforward mean field: GH-24 in both dimensions for every MLP integral, the
    stable point by iterating the block map, lambda_g(16) by explicit scans."""
    x, w = _gh()
    z1, z2 = x[:, None], x[None, :]
    w2 = w[:, None] * w[None, :]
    hp = phasefield.HParams(sigma_w=sw, sigma_a=SIGMA_A, alpha_a=alpha, alpha_m=alpha, n_tokens=N_TOKENS, depth=DEPTH)
    aa2 = am2 = alpha**2
    ba2 = bm2 = 1 - alpha**2

    def pair(f, rho):
        rho = jnp.clip(rho, -1.0, 1.0)
        h1 = sw * z1
        h2 = sw * (rho * z1 + jnp.sqrt(jnp.maximum(1 - rho * rho, 0.0)) * z2)
        return jnp.sum(w2 * f(h1) * f(h2))

    dt = lambda h: 1 - jnp.tanh(h) ** 2
    q_m = sw**2 * pair(jnp.tanh, 1.0)
    d1 = sw**4 * pair(dt, 1.0)

    def block(q, p):
        q_a, p_a = attention.forward(hp.sigma_a, hp.n_tokens, hp.sigma_v, p / q)
        q_z, p_z = ba2 * q + aa2 * q_a, ba2 * p + aa2 * p_a
        return bm2 * q_z + am2 * q_m, bm2 * p_z + am2 * sw**2 * pair(jnp.tanh, p_z / q_z), q_z, p_z

    def backward(q, rho, q_z, rho_z, a, b):
        c_d = bm2 + am2 * d1 / q_z
        c_o = bm2 + am2 * sw**4 * pair(dt, rho_z) / q_z
        diag, off = c_d * (a + b), c_o * b
        a, b = diag - off, off
        da, oa = attention.backward(hp.sigma_a, hp.n_tokens, hp.sigma_v, q, rho, a, b)
        diag, off = ba2 * (a + b) + aa2 * da, ba2 * b + aa2 * oa
        return diag - off, off

    q_star = (bm2 * aa2 + am2 * q_m) / (1 - ba2 * bm2)
    qz_star = ba2 * q_star + aa2
    lam_a = jnp.log(ba2 * (bm2 + am2 * d1 / qz_star))

    def fwd(c, _):
        q1, p1, q_z, p_z = block(*c)
        return (q1, p1), (c[0], c[1] / c[0], q_z, p_z / q_z)

    _, states = jax.lax.scan(fwd, (q_star, q_star), None, length=DEPTH)

    def bwd(c, s):
        a, b, lg = c
        a, b = backward(*s, a, b)
        t = a + b
        return (a / t, b / t, lg + jnp.log(t)), None

    (_, _, lg), _ = jax.lax.scan(bwd, (1.0, 0.0, 0.0), states, reverse=True)
    (q, p), _ = jax.lax.scan(lambda c, _: (block(*c)[:2], None), (q_star, 0.5 * q_star), None, length=n_iter)
    rho = jnp.where(lam_a > 0, p / q, 1.0)
    q = jnp.where(lam_a > 0, q, q_star)
    _, _, q_z, p_z = block(q, rho * q)
    col_a = backward(q, rho, q_z, p_z / q_z, 1.0, 0.0)
    col_b = backward(q, rho, q_z, p_z / q_z, 0.0, 1.0)
    tr, det = col_a[0] + col_b[1], col_a[0] * col_b[1] - col_b[0] * col_a[1]
    lg_inf = jnp.log(0.5 * (tr + jnp.sqrt(jnp.maximum(tr * tr - 4 * det, 0.0))))
    return dict(lambda_a=lam_a, lambda_g=lg / DEPTH, lambda_g_inf=lg_inf, rho_star=rho)


def _flops_per_point(n_cheb, brackets):
    """Hand count of the multiply/adds of one point (paper attention, tanh, one hidden layer):
    a g(rho) evaluation is a Clenshaw sum of n_cheb terms (4 flops a term) and ~40 flops of
    attention and norm algebra; the slope D(rho) another Clenshaw sum. Per point: the mesh
    (MESH + 1 values of g), per root bracket BISECTION_STEPS values and NEWTON_STEPS value +
    slope pairs, then lambda_g_inf (one slope, ~60 flops) and the closed forms (~100 flops)."""
    fp = PAPER.fixed_points

    g = 4 * (n_cheb - 1) + 40
    d = 4 * (n_cheb - 1) + 10
    return (fp.MESH + 1) * g + brackets * (fp.BISECTION_STEPS * g + fp.NEWTON_STEPS * (g + d)) + d + 60 + 100


def _peak_flops():
    """Best float64 multiply-add rate of this process on a matrix product (every device's
    core counts: XLA runs one program per core): an upper bound for elementwise code."""
    import jax
    import jax.numpy as jnp

    devs = jax.local_devices()
    m = 512
    f = jax.pmap(lambda a: a @ a) if len(devs) > 1 else jax.jit(lambda a: a @ a)
    a = jnp.ones((len(devs), m, m) if len(devs) > 1 else (m, m), jnp.float64)
    jax.block_until_ready(f(a))
    best = min(_timed(lambda: jax.block_until_ready(f(a))) for _ in range(5))
    return 2 * m**3 * len(devs) / best


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, help="a size x size grid (the goals' size: 1024)")
    ap.add_argument("--n-sigma", type=int, default=128)
    ap.add_argument("--n-alpha", type=int, default=1024)
    ap.add_argument("--sigma-max", type=float, default=4.0)
    ap.add_argument("--baseline-points", type=int, default=4096)
    ap.add_argument("--sample", type=int, default=16, help="points checked against the dense reference")
    ap.add_argument("--repeats", type=int, default=2, help="timed sweeps per variant and round")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the variants")
    ap.add_argument("--no-commits", action="store_true", help="skip the commits' subprocesses")
    ap.add_argument(
        "--commits",
        nargs="+",
        default=list(DEFAULT_COMMITS),
        help="commits whose package is timed in a subprocess (git archive)",
    )
    ap.add_argument(
        "--pkg-dir",
        default=None,
        help="a folder holding <commit>/phasefield exports (made with git archive where missing; "
        "for a machine without the repository's history)",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.size:
        args.n_sigma = args.n_alpha = args.size
    if args.worker:
        return worker(args)

    global jax, jnp, phasefield, attention
    import jax
    import jax.numpy as jnp

    import phasefield

    fixed_points = PAPER.fixed_points
    from phasefield.theory import attention
    from phasefield.theory.reference import ReferencePoint

    # this script owns its process: every core a device, float64 also for the baseline's own
    # jit; the subprocesses inherit the same XLA_FLAGS (same device count)
    phasefield.use_all_cpu_cores()
    jax.config.update("jax_enable_x64", True)

    sw, al = _grid(args)
    n = sw.size * al.size
    print(f"devices: {jax.local_devices()}")
    print(
        f"grid: sigma_w {sw[0]}..{sw[-1]} x alpha {al[0]}..{al[-1]} = {n:,} points "
        f"(sigma_A={SIGMA_A}, n={N_TOKENS}, L={DEPTH}, tanh)"
    )

    fast = lambda: _time_sweep(phasefield.sweep, sw, al)
    thorough = lambda: _time_sweep(phasefield.sweep, sw, al, _thorough=True)
    first = {"today": fast(), "pre-26 path": thorough()}
    print(
        f"first calls (compilation included): today {first['today']:.1f} s, thorough path {first['pre-26 path']:.1f} s"
    )
    times = {"today": [], "pre-26 path": []}
    commits = {} if args.no_commits else {c: [] for c in args.commits}
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.pkg_dir or tmp
        for r in range(args.rounds):
            order = ["today", "pre-26 path", *commits]
            for name in order if r % 2 == 0 else order[::-1]:
                if name in commits:
                    try:
                        commits[name] += run_commit(name, args, folder)["times"]
                    except (RuntimeError, subprocess.CalledProcessError) as e:
                        print(f"  {name}: not measured ({e})")
                        commits.pop(name)
                else:
                    times[name] += [(fast if name == "today" else thorough)() for _ in range(args.repeats)]
    t_k = min(_timed(lambda: jax.block_until_ready(paper_sweep.build_kernels(sw))) for _ in range(2))
    rate = {k: n / min(v) for k, v in {**times, **commits}.items() if v}
    print(f"points/s, best of {args.rounds} x {args.repeats} timed sweeps each, alternating:")
    for k, v in rate.items():
        label = {
            "today": "today (phasefield.sweep; tiles on CPU only)",
            "pre-26 path": "thorough evaluation, this tree (_thorough=True)",
        }.get(k, f"commit {k} ({COMMITS.get(k, '')})")
        print(f"  {label:58s} {v:12,.0f}")
    t_sweep = n / rate["today"]
    print(
        f"today's sweep: {t_sweep:.2f} s = MLP tables for {sw.size} sigma_w {t_k:.2f} s "
        f"+ points {max(t_sweep - t_k, 0):.2f} s ({n / max(t_sweep - t_k, 1e-9):,.0f} points/s without the tables)"
    )
    print(f"RATIO today / thorough path = {rate['today'] / rate['pre-26 path']:.2f}x   (goal >= 3x)")
    for c in commits:
        if c in rate:
            goal = f"   (goal >= {GOALS[c]:g}x)" if c in GOALS else ""
            print(f"RATIO today / {c} = {rate['today'] / rate[c]:.2f}x{goal}")

    # flop count and the flop-bound rate
    ds = phasefield.sweep(sigma_w=sw, alpha=al, sigma_a=SIGMA_A, n_tokens=N_TOKENS, depth=DEPTH)
    kern = paper_sweep.build_kernels(sw[-1:])
    n_cheb = int(kern.c_pp.shape[-1])
    sub = np.random.default_rng(1).choice(n, min(n, 2048), replace=False)
    i_sw, i_al = np.unravel_index(sub, (sw.size, al.size))

    @jax.jit
    @jax.vmap
    def roots(s, a):
        hp = phasefield.HParams(sigma_w=s, alpha_a=a, alpha_m=a, sigma_a=SIGMA_A, n_tokens=N_TOKENS, depth=DEPTH)
        return jnp.sum(
            jnp.isfinite(
                fixed_points.stable_points.raw(hp, phasefield.theory.kernel(hp, sigma_max=args.sigma_max))["rho"]
            )
        )

    brackets = float(np.mean(roots(jnp.asarray(sw[i_sw]), jnp.asarray(al[i_al]))))
    fpp = _flops_per_point(n_cheb, brackets)
    peak = _peak_flops()
    print(
        f"flops per point ~ {fpp:,.0f} (Chebyshev terms {n_cheb}, {brackets:.2f} root brackets per point on "
        f"average); float64 matmul peak of this process {peak / 1e9:.1f} GFLOP/s -> flop-bound "
        f"{peak / fpp:,.0f} points/s; today's points reach {fpp * n / max(t_sweep - t_k, 1e-9) / peak:.1%} of it "
        f"({peak / fpp / (n / max(t_sweep - t_k, 1e-9)):.1f}x away)"
    )
    print(f"n_stable over the grid: {dict(zip(*np.unique(ds.n_stable.values, return_counts=True)))}")

    # GH-24 baseline on a subset of the same grid (its cost per point does not depend on the point)
    rng = np.random.default_rng(0)
    m = min(args.baseline_points, n)
    idx = rng.choice(n, m, replace=False)
    i_sw, i_al = np.unravel_index(idx, (sw.size, al.size))
    base_fn = jax.jit(jax.vmap(baseline_point))
    bsw, bal = jnp.asarray(sw[i_sw]), jnp.asarray(al[i_al])
    jax.block_until_ready(base_fn(bsw, bal))
    btimes = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        base = jax.block_until_ready(base_fn(bsw, bal))
        btimes.append(time.perf_counter() - t0)
    slow = m / min(btimes)
    print(f"GH-24 baseline (2-D Gauss-Hermite 24, jit/vmap, lambdas only): {slow:,.0f} points/s")
    print(f"RATIO today / GH-24 = {rate['today'] / slow:.1f}x   (goal >= 15x; >= 100,000 points/s)")

    # accuracy against the dense reference (independent NumPy/SciPy route)
    k = min(args.sample, m)
    errs = {key: [] for key in ("lambda_a", "lambda_g", "lambda_g_inf")}
    berrs = {key: [] for key in errs}
    for j in range(k):
        s, a = float(sw[i_sw[j]]), float(al[i_al[j]])
        ref = ReferencePoint(s, SIGMA_A, a, a, n_tokens=N_TOKENS, depth=DEPTH).exponents()
        got = ds.isel(sigma_w=int(i_sw[j]), alpha=int(i_al[j]))
        for key in errs:
            errs[key].append(abs(float(got[key]) - ref[key]))
            berrs[key].append(abs(float(base[key][j]) - ref[key]))
    print(f"max |error| vs the dense reference over {k} random grid points:")
    for key in errs:
        print(f"  {key:13s} phasefield {max(errs[key]):.1e}   baseline GH-24 {max(berrs[key]):.1e}")
    ok = all(max(v) < 1e-6 for v in errs.values())
    print(f"every lambda within 1e-6: {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    main()
