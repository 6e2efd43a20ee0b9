#!/usr/bin/env python
"""Images/s of K ViTs trained by one vmapped program vs the same K trained one after another.

    python scripts/bench_train.py                    # digits, K = 16, the sweep's model (d 64, 16 blocks)
    python scripts/bench_train.py --food101-shaped   # synthetic 64x64x3 images, 8x8 patches, 101 classes

Both paths run the same pure ``train`` function (phasefield.vit.train.make_train): the
vmapped one as ``jit(vmap(train))`` on a chunk of K hyperparameter points, sharded over all
devices (``phasefield.use_all_cpu_cores()``: every CPU core is a host device), the sequential one as
``jit(train)`` on one device, called K times (XLA:CPU still spreads one program's matmuls
over the cores: the "cores busy" column says how many it kept busy). Compilation is
excluded (one warm-up call each).
Images/s counts training images (K x epochs x steps x batch); the per-epoch test-set
evaluation is included in both timings alike. ``--food101-shaped`` also projects the time of
the paper's full sweep (100 configs x 15 epochs x 75,750 training images) from the measured
rate; on a GPU pass --k/--n-train/--batch-size closer to the real sweep.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np


def _busy(c0, wall):
    """CPU seconds of this process per wall second since ``c0 = os.times()``."""
    c1 = os.times()
    return (c1.user - c0.user + c1.system - c0.system) / wall


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=16, help="configs trained at once")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=None, help="(64 digits, 32 food101-shaped)")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--depth", type=int, default=16)
    ap.add_argument("--food101-shaped", action="store_true", help="synthetic 64x64x3 images, 101 classes")
    ap.add_argument("--n-train", type=int, default=None, help="(digits: 1437; food101-shaped: 256)")
    ap.add_argument("--n-test", type=int, default=64, help="food101-shaped test images")
    ap.add_argument("--skip-sequential", action="store_true", help="only time the vmapped program")
    ap.add_argument(
        "--devices",
        type=int,
        default=None,
        help="shard the vmapped chunk over this many devices (default all: every CPU core is a host device)",
    )
    ap.add_argument(
        "--xla-defaults", action="store_true", help="compile with XLA's default options (not the trainer's CPU options)"
    )
    args = ap.parse_args(argv)

    import phasefield

    phasefield.use_all_cpu_cores()  # this script owns its process
    import jax

    from phasefield.vit import data as vdata
    from phasefield.vit.train import TrainConfig, Trainer, make_points, steps_per_epoch

    if args.food101_shaped:
        n = args.n_train or 256
        rng = np.random.default_rng(0)
        d = vdata.Data(
            rng.integers(0, 256, (n, 64, 64, 3), dtype=np.uint8),
            rng.integers(0, 101, n).astype(np.int32),
            rng.integers(0, 256, (args.n_test, 64, 64, 3), dtype=np.uint8),
            rng.integers(0, 101, args.n_test).astype(np.int32),
            101,
            255.0,
            "food101-shaped",
        )
        cfg = TrainConfig(
            dataset="food101-shaped",
            image_size=64,
            patch_size=8,
            width=args.width,
            depth=args.depth,
            epochs=args.epochs,
            batch_size=args.batch_size or 32,
        )
    else:
        d = vdata.load("digits", 8)
        if args.n_train:
            d = vdata.Data(d.x_train[: args.n_train], d.y_train[: args.n_train], d.x_test, d.y_test, 10, 1.0, "digits")
        cfg = TrainConfig(width=args.width, depth=args.depth, epochs=args.epochs, batch_size=args.batch_size or 64)
    k = args.k
    rng = np.random.default_rng(1)
    sw, al = rng.uniform(0.3, 3.0, k), rng.uniform(0.1, 0.95, k)
    pts = make_points(cfg, sw, np.ones(k), al, al, np.full(k, 1e-3), np.arange(k))
    devs = jax.devices()[: args.devices] if args.devices else None
    tr = Trainer(cfg, d, devices=devs, xla_options=None if args.xla_defaults else "auto")
    imgs_per_run = cfg.epochs * steps_per_epoch(cfg, len(d.y_train)) * min(cfg.batch_size, len(d.y_train))
    print(
        f"device(s): {tr.devices}  compiler options: {tr.xla_options}  data: {d.name} train {len(d.y_train)} test {len(d.y_test)} "
        f"{cfg.image_size}px/{cfg.patch_size}px patches ({cfg.n_tokens} tokens)  model: d={cfg.width}, "
        f"{cfg.depth} blocks  batch {cfg.batch_size}, {cfg.epochs} epoch(s), K={k}",
        flush=True,
    )

    t0 = time.perf_counter()
    tr.train_many(pts)
    print(f"vmapped: compile + first run {time.perf_counter() - t0:.1f} s", flush=True)
    c0, t0 = os.times(), time.perf_counter()
    tr.train_many(pts)
    t_vmap = time.perf_counter() - t0
    rate_vmap = k * imgs_per_run / t_vmap
    print(
        f"vmapped:    {k} runs in {t_vmap:7.2f} s  -> {rate_vmap:8.1f} images/s  ({_busy(c0, t_vmap):.2f} cores busy)",
        flush=True,
    )
    if not args.skip_sequential:
        one = lambda i: jax.tree.map(lambda a: a[i], pts)
        t0 = time.perf_counter()
        tr.train_one(one(0))
        print(f"sequential: compile + first run {time.perf_counter() - t0:.1f} s", flush=True)
        c0, t0 = os.times(), time.perf_counter()
        for i in range(k):
            tr.train_one(one(i))
        t_seq = time.perf_counter() - t0
        rate_seq = k * imgs_per_run / t_seq
        print(
            f"sequential: {k} runs in {t_seq:7.2f} s  -> {rate_seq:8.1f} images/s  ({_busy(c0, t_seq):.2f} cores busy)",
            flush=True,
        )
        print(f"speed-up vmapped / sequential (same process, same K): {rate_vmap / rate_seq:.2f}x", flush=True)
    if args.food101_shaped:
        total = 100 * 15 * 75_750
        secs = total / rate_vmap
        print(
            f"projected paper sweep (100 configs x 15 epochs x 75,750 images = {total:.3g} images) at "
            f"{rate_vmap:.1f} images/s on this device: {secs / 3600:.1f} h (training only; test-set "
            f"evaluation adds ~{25250 / 3 / 75750:.0%})",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
