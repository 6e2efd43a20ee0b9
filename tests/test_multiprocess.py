"""A real multi-process sweep: two processes on localhost, ``jax.distributed``
with a local coordinator (CPU), one shared output; the assembled file must equal the
single-process one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from phasefield import io

# three chunks each (process 0 computes two, process 1 one); pre-LN at the sizes of the other
# modules' block points (8 tokens, depth 3, 4 heads): its per-scale exact-softmax tables cost
# each process less at 8 tokens than at 4
ARGS = {
    "paper": ["sweep", "--sigma-w", "0.5:3:3", "--alpha", "0.2,0.6", "--chunk", "2", "--quiet"],
    "pre-ln": [
        "sweep",
        "--block",
        "pre-ln:heads=4",
        "--axis",
        "sigma=0.4,1.1,1.7",
        "--axis",
        "alpha=0.3,0.8",
        "--depth",
        "3",
        "--n-tokens",
        "8",
        "--chunk",
        "2",
        "--quiet",
    ],
}

# one CPU device per process; the other XLA flags the suite set (its fast compiles) are kept.
# Each process runs the sweeps of argv[3] (a JSON list of argument lists) in turn, one output
# section per sweep, and exits with the first non-zero exit code: one pair of processes (one
# interpreter start, JAX import and distributed start-up each) serves both tests.
SECTION = "=== next sweep ==="
WORKER = textwrap.dedent(f"""
    import json, os, sys
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    os.environ["XLA_FLAGS"] = " ".join(flags + ["--xla_force_host_platform_device_count=1"])
    import jax
    jax.config.update("jax_platforms", "cpu")
    jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=2,
                               process_id=int(sys.argv[2]), initialization_timeout=120)
    from phasefield.cli import main
    rcs = []
    for args in json.loads(sys.argv[3]):
        print({SECTION!r}, flush=True)
        rcs.append(main(args))
    jax.distributed.shutdown()
    sys.exit(next((rc for rc in rcs if rc), 0))
""")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env():
    env = dict(os.environ, PHASEFIELD_HOST_DEVICES="1", JAX_PLATFORMS="cpu")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture(scope="module")
def two_process_sweeps(tmp_path_factory):
    """Every sweep of ARGS by one pair of processes: block -> (shared file, [process 0's
    output, process 1's output] for that sweep)."""
    folder = tmp_path_factory.mktemp("two-processes")
    blocks = sorted(ARGS)
    files = {b: folder / f"shared-{b}.nc" for b in blocks}
    argv = json.dumps([[*ARGS[b], "--out", str(files[b])] for b in blocks])
    addr = f"127.0.0.1:{_free_port()}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, addr, str(i), argv],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=300))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    sections = [out.split(SECTION)[1:] for out, _ in outs]
    assert all(len(s) == len(blocks) for s in sections)
    return {b: (files[b], [sections[0][i], sections[1][i]]) for i, b in enumerate(blocks)}


@pytest.mark.parametrize("block", sorted(ARGS))
def test_two_processes_assemble_the_single_process_file(tmp_path, block, two_process_sweeps):
    from phasefield.cli import main

    args = ARGS[block]
    single = tmp_path / "single.nc"  # this process (no interpreter start-up to pay)
    assert main([*args, "--out", str(single)]) == 0

    shared, outs = two_process_sweeps[block]
    assert "process 1: chunks done" in outs[1]
    assert "wrote" in outs[0]
    a, b = io.read_netcdf(single), io.read_netcdf(shared)
    assert dict(a.sizes) == dict(b.sizes)
    for c in a.coords:
        np.testing.assert_array_equal(a[c].values, b[c].values)
    # equal to rounding: the distributed CPU runtime compiles the same program with a few
    # ulp of difference (measured: at most 3e-15 relative)
    for v in a.data_vars:
        np.testing.assert_allclose(b[v].values, a[v].values, rtol=1e-12, atol=1e-14)
        assert np.array_equal(np.isfinite(b[v].values), np.isfinite(a[v].values))
        assert block != "paper" or np.isfinite(b[v].values).all()  # (pre-ln: lambda_a NaN, no fixed point)
    assert not os.path.exists(str(shared) + ".chunks")
