#!/usr/bin/env python
"""Simulator speed: lazy vs dense weights (default), or throughput against the matmul peak.

``--mode compare`` (default): seconds per draw of the forward statistics (per-layer q, p,
``measure.transient_draws``) and of the lambda_g kernel (forward + VJP,
``measure.gradient_draws``) with lazily sampled weights and with dense weights, at each
width, n = 32 tokens, depth 16, and their ratio (dense / lazy). Dense weights above
``--dense-max-width`` are skipped (said in the output): one dense draw at d = 8192 draws
16 x 5 x 67M Gaussians (tens of seconds per draw on 2 cores, 1.3 GB per layer).

``--mode peak``: the older throughput table below.

Throughput as a fraction of this machine's matmul peak, measured in one run.

Peak: FLOP/s of a large float32 matmul (jit, best of several). Simulator FLOPs: the matmul
FLOPs of each block (Q, K, V projections 3*2nd^2, logits and A V 2*2n^2 d, MLP 2*2ndh per
hidden layer pair), times layers, draws and points; the VJP of the gradient kernel adds
one more forward's projection/MLP FLOPs and twice the logits/AV FLOPs. Rows:

  apply      Block.apply on pre-drawn parameters (the matmul part alone)
  stack      a full depth-16 random stack, one point, weights drawn in the run
  sweep-fwd  the same for a chunk of P points sharing their draws (as the sweep runs)
  sweep-grad the lambda_g kernel (forward + VJP) on a chunk of P points

Drawing Gaussian weights (d^2 per matrix, O(1) matmul FLOPs per number at n = 32 tokens)
costs more than the matmuls on a CPU; sharing the draws across points amortises it.

    python scripts/bench_simulate.py [--widths 512,2048,8192] [--seeds 4] [--dense-max-width 2048]
    python scripts/bench_simulate.py --mode peak [--widths 256,512] [--seeds 8] [--points 16]
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import jax
import jax.numpy as jnp

import phasefield
from phasefield import HParams
from phasefield.block import Block
from phasefield.layers.presets import paper as paper_block
from phasefield.simulate import measure, stack

phasefield.use_all_cpu_cores()  # this script owns its process


def timeit(f, *args, reps=3):
    jax.block_until_ready(f(*args))
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        best = min(best, time.perf_counter() - t)
    return best


def _jit_closure(f, hp, **options):
    """jit of f(hp, keys, **options) with the options closed over (static): jit treats the
    bound arguments of a functools.partial, and a lambda's defaults, as traced."""
    return jax.jit(lambda keys: f(hp, keys, **options))


def cputime(f, *args, reps=2):
    """Best (wall seconds, process CPU seconds over all threads) of ``reps`` runs after a
    compile run. CPU seconds are the robust figure on a shared, loaded machine."""
    jax.block_until_ready(f(*args))
    wall = cpu = float("inf")
    for _ in range(reps):
        t, c = time.perf_counter(), time.process_time()
        jax.block_until_ready(f(*args))
        wall, cpu = min(wall, time.perf_counter() - t), min(cpu, time.process_time() - c)
    return wall, cpu


def matmul_peak(size=2048):
    a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (size, size), jnp.float32)
    f = jax.jit(lambda a, b: a @ b)
    return 2 * size**3 / timeit(f, a, b, reps=5)


def block_flops(n, d, h=None, grad=False):
    h = h or d
    proj = 3 * 2 * n * d * d + 2 * 2 * n * d * h
    attn = 2 * 2 * n * n * d
    return proj + attn + ((proj + 2 * attn) if grad else 0)


def compare(args):
    """Lazy vs dense weights: seconds per draw, forward statistics and lambda_g."""
    n, L, S = args.n_tokens, args.depth, args.seeds
    hp = HParams(sigma_w=2.0, sigma_a=1.0, alpha_a=0.5, alpha_m=0.5, n_tokens=n, depth=L)
    print(
        f"device: {jax.devices()[0].device_kind} x{len(jax.devices())}; n = {n}, depth = {L}, "
        f"{S} draws per timing (best of {args.reps}, after a compile run); seconds per draw, "
        "CPU = process CPU time over all threads (robust under load), wall in brackets"
    )
    print(f"{'width':>6} {'kernel':<9} {'dense CPU s (wall)':>22} {'lazy CPU s (wall)':>22} {'ratio CPU (wall)':>18}")
    for d in (int(w) for w in args.widths.split(",")):
        keys = jax.random.split(jax.random.key(0), S)
        for name in ("forward", "lambda_g"):
            sec = {}
            for w in ("lazy", "dense"):
                if w == "dense" and d > args.dense_max_width:
                    continue
                if name == "forward":
                    f = partial(
                        measure.transient_draws, paper_block(hp), q0=1.0, p0=0.5, n=n, d=d, depth=L, weights=w
                    )  # jitted: static options
                else:
                    db = measure.batch_size(paper_block(hp), n, d, L, w, S)
                    f = _jit_closure(
                        measure.gradient_draws, paper_block(hp), q_star=1.2, n=n, d=d, depth=L, weights=w, draw_batch=db
                    )
                wall, cpu = cputime(f, keys, reps=args.reps)
                sec[w] = (cpu / S, wall / S)
            fmt = lambda v: f"{v[0]:.4f} ({v[1]:.4f})"
            dense = f"{fmt(sec['dense']):>22}" if "dense" in sec else f"{'skipped':>22}"
            ratio = (
                f"{sec['dense'][0] / sec['lazy'][0]:.1f}x ({sec['dense'][1] / sec['lazy'][1]:.1f}x)"
                if "dense" in sec
                else "-"
            )
            print(f"{d:>6} {name:<9} {dense} {fmt(sec['lazy']):>22} {ratio:>18}", flush=True)
    if any(int(w) > args.dense_max_width for w in args.widths.split(",")):
        print(
            f"dense weights skipped above width {args.dense_max_width} (--dense-max-width): "
            "too slow / too much memory on this machine"
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("compare", "peak"), default="compare")
    ap.add_argument("--widths", default=None, help="default 512,2048,8192 (compare), 256,512 (peak)")
    ap.add_argument("--seeds", type=int, default=None, help="default 4 (compare), 8 (peak)")
    ap.add_argument("--points", type=int, default=16)
    ap.add_argument("--n-tokens", type=int, default=32)
    ap.add_argument("--depth", type=int, default=16)
    ap.add_argument("--dense-max-width", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    if args.mode == "compare":
        args.widths = args.widths or "512,2048,8192"
        args.seeds = args.seeds or 4
        return compare(args)
    args.widths = args.widths or "256,512"
    args.seeds = args.seeds or 8
    n, L, S, P = args.n_tokens, args.depth, args.seeds, args.points
    peak = matmul_peak()
    print(
        f"device: {jax.devices()[0].device_kind} x{len(jax.devices())}; "
        f"float32 matmul peak {peak / 1e9:.1f} GFLOP/s (2048^3)"
    )
    print(f"n = {n}, depth = {L}, seeds = {S}, points per chunk = {P}")
    print(f"{'width':>6} {'kernel':<11} {'seconds':>9} {'GFLOP/s':>9} {'of peak':>8}")
    hp = HParams(sigma_w=2.0, sigma_a=1.0, alpha_a=0.5, alpha_m=0.5).astype(jnp.float32)
    hps = HParams(
        sigma_w=jnp.linspace(0.5, 3.0, P),
        sigma_a=jnp.ones(P),
        alpha_a=jnp.full(P, 0.5),
        alpha_m=jnp.full(P, 0.5),
        sigma_v=jnp.ones(P),
        n_tokens=jnp.full(P, n),
        depth=jnp.full(P, L),
    )
    for d in (int(w) for w in args.widths.split(",")):
        keys = jax.random.split(jax.random.key(0), S)
        rows = []
        # apply on pre-drawn parameters
        lk = jax.random.split(jax.random.key(1), S * L)
        x = jax.vmap(lambda k: stack.simplex_tokens(k, n, d, 1.0, 0.5))(lk)
        params = jax.jit(jax.vmap(lambda k, x: Block(hp).init({"params": k}, x)))(lk, x)
        f = jax.jit(jax.vmap(lambda p, x: Block(hp).apply(p, x)))
        rows.append(("apply", timeit(f, params, x), S * L * block_flops(n, d)))
        del params
        # full stack, one point
        g = jax.jit(
            jax.vmap(
                lambda k: stack.stack_forward(
                    paper_block(hp), k, stack.simplex_tokens(k, n, d, 1.0, 0.5), L, weights="dense"
                )
            )
        )
        rows.append(("stack", timeit(g, keys), S * L * block_flops(n, d)))
        # a chunk of points sharing draws
        h = jax.jit(
            lambda hps, keys: jax.vmap(
                lambda hh: jax.vmap(
                    lambda k: stack.stack_forward(
                        paper_block(hh.astype(jnp.float32)),
                        k,
                        stack.simplex_tokens(k, n, d, 1.0, 0.5),
                        L,
                        weights="dense",
                    )
                )(keys)
            )(hps)
        )
        rows.append(("sweep-fwd", timeit(h, hps, keys), P * S * L * block_flops(n, d)))
        db = measure.batch_size(paper_block(hp), n, d, L, "dense", S, points=P)
        gk = jax.jit(
            lambda hps, keys: jax.vmap(
                lambda hh: measure.gradient_draws(
                    paper_block(hh), keys, 1.0, n=n, d=d, depth=L, draw_batch=db, weights="dense"
                )
            )(hps)
        )
        rows.append(("sweep-grad", timeit(gk, hps, keys, reps=2), P * S * L * block_flops(n, d, grad=True)))
        for name, sec, fl in rows:
            print(f"{d:>6} {name:<11} {sec:>9.3f} {fl / sec / 1e9:>9.1f} {fl / sec / peak:>8.1%}")


if __name__ == "__main__":
    main()
