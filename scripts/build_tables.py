"""Write the exact-softmax point tables shipped with the package (one file per token count).

``phasefield/theory/attention/tables/exact-point-n{n}.npz`` holds, for n tokens, the pieces
of :func:`phasefield.theory.attention.exact_table.point_pieces` on every range of logit scales
up to ``POINT_CAP`` (4.5): the Chebyshev interpolants in the scale that a point of the exact
map or the softmax path reads instead of integrating. A process finds them there before it
looks in (or writes to) the user's tables folder. Each (n, range) is computed in its own
process (``--jobs`` at once) into a work folder (the tables' disk cache: an interrupted run
resumes from what it wrote), then each n's file is written whole (a temporary file, then
``os.replace``). Run it after a change that ``tests/test_shipped_tables.py`` reports, with
``SHIPPED_FORMAT`` bumped.

    python scripts/build_tables.py [--n 4 8 16 ...] [--jobs 2] [--work FOLDER]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

COMMON_N = (4, 8, 16, 17, 32, 64, 65, 128, 197, 256)


def sizes(n):
    from phasefield.theory.attention import exact, exact_table

    cap = exact_table.POINT_CAP
    n_a, n_z = exact.sizes(sigma_max=cap, n_max=float(n))
    return n_a, n_z, cap


def child(n, j):
    """In this process: the pieces of range ``j`` for ``n`` tokens, into PHASEFIELD_TABLES."""
    from phasefield.theory.attention import exact_table

    n_a, n_z, cap = sizes(n)
    lo, hi = exact_table.point_ranges(cap)[j]
    t0 = time.process_time()
    exact_table._scale_pieces.cache_clear()
    pieces = exact_table.point_pieces.__wrapped__(float(n), n_a, n_z, cap, lo, hi)
    print(f"n {n} range [{lo}, {hi}]: {len(pieces)} piece(s), {time.process_time() - t0:.1f} CPU-s", flush=True)


def assemble(n, work):
    """Write the shipped file of ``n`` from the work folder's pieces."""
    import numpy as np

    from phasefield.theory import table_cache
    from phasefield.theory.attention import exact_table

    os.environ["PHASEFIELD_TABLES"] = work
    n_a, n_z, cap = sizes(n)
    arrays = {}
    for j, (lo, hi) in enumerate(exact_table.point_ranges(cap)):
        pieces = exact_table.point_pieces.__wrapped__(float(n), n_a, n_z, cap, lo, hi)
        arrays[f"r{j}_lo"] = np.array([p[0] for p in pieces])
        arrays[f"r{j}_hi"] = np.array([p[1] for p in pieces])
        for i, (_, _, x, s, t) in enumerate(pieces):
            arrays.update({f"r{j}_x{i}": x, f"r{j}_s{i}": s, f"r{j}_t{i}": t})
    path = exact_table.shipped_path(n)
    if not table_cache.save(path, exact_table.shipped_key(n, n_a, n_z, cap), arrays):
        raise SystemExit(f"could not write {path}")
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=list(COMMON_N))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--work", default=os.path.join("out", "tables-work"))
    ap.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ["JAX_PLATFORMS"] = "cpu"  # before JAX loads: the tables' key names the backend
    if args.child:
        return child(*args.child)
    work = os.path.abspath(args.work)
    env = dict(os.environ, PHASEFIELD_TABLES=work, JAX_PLATFORMS="cpu", OMP_NUM_THREADS="1")
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
    from phasefield.theory.attention import exact_table

    jobs = [(n, j) for n in args.n for j in range(len(exact_table.point_ranges(exact_table.POINT_CAP)))]

    def run(job):
        out = subprocess.run(
            [sys.executable, __file__, "--child", *map(str, job)], env=env, text=True, capture_output=True
        )
        sys.stdout.write(out.stdout)
        if out.returncode:
            raise SystemExit(f"{job} failed:\n{out.stderr[-2000:]}")

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(run, jobs))
    for n in args.n:
        assemble(n, work)


if __name__ == "__main__":
    main()
