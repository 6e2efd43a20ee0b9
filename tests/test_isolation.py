"""Importing phasefield changes no global state: the user's dtype and device
settings stay as they were, and the theory still computes in float64 by itself."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# paper.exponents(hp) at this point, pinned in float64 (a regression pin, not the accuracy
# check: tests/test_exact.py and scripts/bench_theory.py hold the engine to the dense
# reference). Here s = 2, where the MLP tables take the plain 2-D rule (its grid is small);
# against theory.reference lambda_g_inf and rho_star are 1.3e-11 and 2.0e-12 off. Another
# quadrature (e.g. tanh's erf split + fixed-rule remainder) moves them by ~2e-11, within the
# reference's accuracy but beyond this pin: such a change re-pins these values.
EXPECTED = {
    "lambda_a": 0.024630451834784056,
    "lambda_g_collapse": 0.045395793776727214,
    "lambda_g_inf": 0.13866265862754945,
    "q_star": 1.8805971068730059,
    "q_z_star": 1.6604478301547543,
    "rho_star": 0.9263315109502598,
}

SCRIPT = r"""
import json, os, sys
import jax
if sys.argv[1] == "explicit-off":
    jax.config.update("jax_enable_x64", False)
flags = os.environ.get("XLA_FLAGS")
import jax.numpy as jnp
import phasefield
from phasefield import HParams, theory
from phasefield.layers import paper
import phasefield.diagram, phasefield.simulate, phasefield.figures, phasefield.cli  # noqa: E401
from phasefield.seeds import deepscalelm, rank_collapse, sensitivity
ex, seeds = {}, []
if sys.argv[1] != "flags-only":
    hp = HParams(sigma_w=2.0, sigma_a=1.0, alpha_a=0.5, alpha_m=0.5, n_tokens=32, depth=16)
    ex = paper.exponents(hp)
    seeds = [rank_collapse.query_grad_gaussian(1.3, 0.3, 4, 8),
             rank_collapse.gaussian_tokens(jax.random.PRNGKey(0), 4, 8),
             deepscalelm.sha(deepscalelm.Fwd(0.0, 1.0, 0.5), 16, var_logit=0.1),
             sensitivity.profile("pre-norm", depth=2, width=8, draws=4)]
print(json.dumps(dict(
    seed_dtypes=sorted({str(x.dtype) for x in jax.tree.leaves(seeds) if getattr(x, "dtype", None) is not None
                         and x.dtype.kind == "f"}),
    ones=str(jnp.ones(3).dtype), x64=bool(jax.config.jax_enable_x64),
    flags_same=os.environ.get("XLA_FLAGS") == flags, devices=jax.device_count(),
    dtypes=sorted({str(v.dtype) for v in ex.values() if v.dtype.kind == "f"}),
    int_dtypes=sorted({str(v.dtype) for v in ex.values() if v.dtype.kind != "f"}),
    values={k: float(v) for k, v in ex.items()},
    ones_after=str(jnp.ones(3).dtype))))
"""


def _run(mode, env_extra=None):
    """SCRIPT in a fresh process with no JAX_ENABLE_X64 and no device-count flag; of the
    suite's XLA_FLAGS only its fast-compile flags are kept (they set how XLA optimises, not
    devices or dtypes: tests/test_suite_setup.py checks that they give the defaults' numbers)."""
    from phasefield._runtime import _FAST_NAMES

    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_ENABLE_X64")}
    fast = [f for f in os.environ.get("XLA_FLAGS", "").split() if f.split("=")[0] in _FAST_NAMES]
    if fast:
        env["XLA_FLAGS"] = " ".join(fast)
    env.update(PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", **(env_extra or {}))
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["default", "explicit-off"])
def test_import_leaves_dtype_and_devices_alone(mode):
    res = _run(mode)
    assert res["ones"] == res["ones_after"] == "float32"
    assert res["x64"] is False
    assert res["flags_same"]
    assert res["devices"] == 1  # no device-count flag in the environment: one CPU device
    assert res["dtypes"] == ["float64"]
    assert res["int_dtypes"] in ([], ["int64"])  # counts (n_stable) are integers
    assert res["seed_dtypes"] == ["float64"]  # the seed theories enter the x64 scope too
    for k, v in EXPECTED.items():
        assert abs(res["values"][k] - v) < 1e-12, k


def test_user_xla_flags_kept():
    # imports every module but computes nothing (the computing runs are above)
    res = _run("flags-only", {"XLA_FLAGS": "--xla_force_host_platform_device_count=3"})
    assert res["flags_same"] and res["devices"] == 3 and res["ones"] == "float32"


def test_use_all_cpu_cores_is_explicit():
    script = (
        "import os, phasefield, jax; n = phasefield.use_all_cpu_cores(2); "
        "print(n, jax.device_count(), os.environ['XLA_FLAGS'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout.split()
    assert out[:2] == ["2", "2"] and "--xla_force_host_platform_device_count=2" in out[2]
    late = (
        "import phasefield, jax; jax.numpy.ones(1); "
        "exec('try:\\n phasefield.use_all_cpu_cores(2)\\nexcept RuntimeError: print(\"late\")')"
    )
    res = subprocess.run([sys.executable, "-c", late], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert res.stdout.strip() == "late"


def test_compilation_cache_setup_is_one_call(tmp_path, monkeypatch):
    """The CLI and tests/conftest.py share one set-up (``use_compilation_cache``): the folder
    from PHASEFIELD_CACHE, the minimum compile time asked for, the size limit, both
    overridden by PHASEFIELD_CACHE_MIN_SECS / PHASEFIELD_CACHE_MAX_BYTES (the suite's
    throwaway folder: every program, no limit; a malformed value is a one-line ValueError);
    ``off`` and friends leave JAX's settings alone."""
    import jax

    from phasefield._runtime import use_compilation_cache

    names = (
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_compilation_cache_max_size",
    )
    before = {k: getattr(jax.config, k) for k in names}
    try:
        for off in ("off", "0", "None", " "):
            monkeypatch.setenv("PHASEFIELD_CACHE", off)
            assert use_compilation_cache(0.3) is None
            assert {k: getattr(jax.config, k) for k in names} == before
        monkeypatch.setenv("PHASEFIELD_CACHE", str(tmp_path / "c"))
        for var in ("PHASEFIELD_CACHE_MIN_SECS", "PHASEFIELD_CACHE_MAX_BYTES"):  # the suite's
            monkeypatch.delenv(var, raising=False)
        assert use_compilation_cache(0.3) == str(tmp_path / "c") and (tmp_path / "c").is_dir()
        assert [getattr(jax.config, k) for k in names] == [str(tmp_path / "c"), 0.3, 8 << 30]
        monkeypatch.setenv("PHASEFIELD_CACHE_MIN_SECS", "0")
        monkeypatch.setenv("PHASEFIELD_CACHE_MAX_BYTES", "-1")
        assert use_compilation_cache(0.3) == str(tmp_path / "c")
        assert [getattr(jax.config, k) for k in names] == [str(tmp_path / "c"), 0.0, -1]
        monkeypatch.setenv("PHASEFIELD_CACHE_MAX_BYTES", "8GB")
        with pytest.raises(ValueError, match="^PHASEFIELD_CACHE_MAX_BYTES must be an integer"):
            use_compilation_cache(0.3)
    finally:
        for k, v in before.items():
            jax.config.update(k, v)


def test_a_cache_written_without_a_size_limit_still_takes_writes(tmp_path, monkeypatch):
    """Entries of a cache folder written before it had a size limit have no access-time
    file; JAX's size-limited cache reads one for every entry before each write, so without
    one every write failed (a warning, nothing stored). ``use_compilation_cache`` dates them
    (their modification time) and leaves existing access times alone; JAX's cache then
    stores a new entry. A cache without a size limit (``PHASEFIELD_CACHE_MAX_BYTES=-1``, the
    suite's per-run folder) never reads them and is left as it is (dating its ~3,000 entries
    at every in-process CLI run would cost the suite ~7 CPU-s)."""
    import os

    import jax

    from phasefield._runtime import use_compilation_cache

    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "old-cache").write_bytes(b"x" * 10)  # no atime: unsized era
    (folder / "kept-cache").write_bytes(b"y" * 10)
    (folder / "kept-atime").write_bytes((123).to_bytes(8, "little"))
    names = (
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_compilation_cache_max_size",
    )
    before = {k: getattr(jax.config, k) for k in names}
    try:
        monkeypatch.setenv("PHASEFIELD_CACHE", str(folder))
        monkeypatch.setenv("PHASEFIELD_CACHE_MAX_BYTES", "-1")
        assert use_compilation_cache(0.3) == str(folder)
        assert not (folder / "old-atime").exists()  # no limit: untouched
        monkeypatch.delenv("PHASEFIELD_CACHE_MAX_BYTES")  # the default limit
        assert use_compilation_cache(0.3) == str(folder)
    finally:
        for k, v in before.items():
            jax.config.update(k, v)
    stamp = int.from_bytes((folder / "old-atime").read_bytes(), "little")
    assert stamp == os.stat(folder / "old-cache").st_mtime_ns
    assert int.from_bytes((folder / "kept-atime").read_bytes(), "little") == 123
    lru = pytest.importorskip("jax._src.lru_cache")  # JAX's own cache class
    cache = lru.LRUCache(str(folder), max_size=8 << 30)
    cache.put("new", b"z" * 10)
    assert (folder / "new-cache").read_bytes() == b"z" * 10
