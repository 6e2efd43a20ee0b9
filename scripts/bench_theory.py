"""Benchmark: grid points per second of the full (lambda_a, lambda_g(16), lambda_g_inf)
evaluation, against a straightforward jit/vmap 2-D Gauss–Hermite (24 nodes) baseline
measured in the same run, and the accuracy of both against the dense reference.

    .venv/bin/python scripts/bench_theory.py [--n-sigma 256 --n-alpha 256] [--sample 64]

Goal (issue 2) on the 2-core CPU: >= 100,000 points/s with every lambda within 1e-6 of the
dense reference, >= 15x the baseline. Machines are noisy: compare the ratio, not the times.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import phasefield
from phasefield.theory import attention
from phasefield.theory.reference import ReferencePoint

# this script owns its process: every core a device, float64 also for the baseline's own jit
phasefield.use_all_cpu_cores()
jax.config.update("jax_enable_x64", True)

SIGMA_A, N_TOKENS, DEPTH = 1.0, 32, 16


# ---- the baseline: 2-D Gauss–Hermite with 24 nodes, everything per point ---------------------

def _gh(n=24):
    x, w = np.polynomial.hermite_e.hermegauss(n)
    return jnp.asarray(x), jnp.asarray(w / w.sum())


def baseline_point(sw, alpha, n_iter=200):
    """Straightforward mean field: GH-24 in both dimensions for every MLP integral, the
    stable point by iterating the block map, lambda_g(16) by explicit scans."""
    x, w = _gh()
    z1, z2 = x[:, None], x[None, :]
    w2 = w[:, None] * w[None, :]
    hp = phasefield.HParams(sigma_w=sw, sigma_a=SIGMA_A, alpha_a=alpha, alpha_m=alpha,
                            n_tokens=N_TOKENS, depth=DEPTH)
    aa2 = am2 = alpha ** 2
    ba2 = bm2 = 1 - alpha ** 2

    def pair(f, rho):
        rho = jnp.clip(rho, -1.0, 1.0)
        h1 = sw * z1
        h2 = sw * (rho * z1 + jnp.sqrt(jnp.maximum(1 - rho * rho, 0.0)) * z2)
        return jnp.sum(w2 * f(h1) * f(h2))

    dt = lambda h: 1 - jnp.tanh(h) ** 2
    q_m = sw ** 2 * pair(jnp.tanh, 1.0)
    d1 = sw ** 4 * pair(dt, 1.0)

    def block(q, p):
        q_a, p_a = attention.forward(hp, p / q)
        q_z, p_z = ba2 * q + aa2 * q_a, ba2 * p + aa2 * p_a
        return bm2 * q_z + am2 * q_m, bm2 * p_z + am2 * sw ** 2 * pair(jnp.tanh, p_z / q_z), q_z, p_z

    def backward(q, rho, q_z, rho_z, a, b):
        c_d = bm2 + am2 * d1 / q_z
        c_o = bm2 + am2 * sw ** 4 * pair(dt, rho_z) / q_z
        diag, off = c_d * (a + b), c_o * b
        a, b = diag - off, off
        da, oa = attention.backward(hp, q, rho, a, b)
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-sigma", type=int, default=256)
    ap.add_argument("--n-alpha", type=int, default=256)
    ap.add_argument("--sigma-max", type=float, default=4.0)
    ap.add_argument("--baseline-points", type=int, default=4096)
    ap.add_argument("--sample", type=int, default=64, help="points checked against the dense reference")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    sw = np.linspace(0.5, args.sigma_max, args.n_sigma)
    al = np.linspace(0.01, 0.99, args.n_alpha)
    n = sw.size * al.size
    print(f"devices: {jax.local_devices()}")
    print(f"grid: sigma_w {sw[0]}..{sw[-1]} x alpha {al[0]}..{al[-1]} = {n} points "
          f"(sigma_A={SIGMA_A}, n={N_TOKENS}, L={DEPTH}, tanh)")

    t0 = time.perf_counter()
    ds = phasefield.sweep(sigma_w=sw, alpha=al, sigma_a=SIGMA_A, n_tokens=N_TOKENS, depth=DEPTH)
    first = time.perf_counter() - t0
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        ds = phasefield.sweep(sigma_w=sw, alpha=al, sigma_a=SIGMA_A, n_tokens=N_TOKENS, depth=DEPTH)
        times.append(time.perf_counter() - t0)
    fast = n / min(times)
    print(f"phasefield.sweep: first call {first:.2f} s (compilation included), "
          f"then best of {args.repeats}: {min(times):.3f} s -> {fast:,.0f} points/s")

    # baseline on a subset of the same grid (its cost per point does not depend on the point)
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
    print(f"baseline (2-D Gauss-Hermite 24, jit/vmap): {slow:,.0f} points/s")
    print(f"RATIO phasefield / baseline = {fast / slow:.1f}x   (goal >= 15x; >= 100,000 points/s)")

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
