"""The suite's own set-up (tests/conftest.py): one fresh persistent compilation
cache per run shared by the workers and the subprocesses, compiled programs kept until the
process has many memory maps."""

import json
import os
import subprocess
import sys

import conftest
import jax
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def child():
    """What a subprocess of the run (the CLI's set-up) resolves: its compilation-cache folder
    (twice: use_compilation_cache's answer and JAX's setting) and JAX's traceback limit; one
    interpreter for both tests below."""
    code = (
        "import json, jax; from phasefield._runtime import use_compilation_cache; "
        "print(json.dumps([use_compilation_cache(0.5), jax.config.jax_compilation_cache_dir, "
        "jax.config.jax_traceback_in_locations_limit]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_run_shares_one_compilation_cache_with_its_subprocesses(child):
    folder = conftest._CACHE  # None: PHASEFIELD_TEST_CACHE=off (or a folder that cannot be made)
    if folder is None:
        assert os.environ["PHASEFIELD_CACHE"] == "off"
        return
    assert folder == os.environ["PHASEFIELD_TEST_CACHE"] and os.path.isdir(folder)
    assert os.environ["PHASEFIELD_CACHE"] == folder == jax.config.jax_compilation_cache_dir
    assert child[:2] == [folder, folder]  # a subprocess (the CLI's set-up) resolves the same folder


def test_the_suite_lowers_without_source_locations(child):
    """conftest exports JAX_TRACEBACK_IN_LOCATIONS_LIMIT (default 0) before JAX loads: this
    process and its subprocesses read it."""
    want = int(os.environ["JAX_TRACEBACK_IN_LOCATIONS_LIMIT"])
    assert jax.config.jax_traceback_in_locations_limit == want
    assert int(child[2]) == want


def test_memory_maps_are_counted_and_the_mark_is_below_the_kernel_limit():
    n = conftest.memory_maps()
    assert n > 0
    with open(os.path.join(HERE, "conftest.py")) as fh:  # sanity: a count, not a constant
        assert "/proc/self/maps" in fh.read()
    limit = conftest._map_limit()
    assert limit > 0
    assert conftest.MAPS_HIGH <= limit * 3 // 4
    # counted every MAPS_EVERY tests: room for that many tests of 2,000 maps each (the most
    # one test added was 1,930, and eight 5,216)
    assert conftest.MAPS_HIGH + conftest.MAPS_EVERY * 2000 <= limit


def test_clear_caches_returns_the_maps_of_compiled_programs():
    """The release the conftest relies on: compiled programs that stay alive (their jitted
    functions kept, as module-level and cached ``jax.jit`` functions are) hold memory maps
    (a few each), and jax.clear_caches() gives them back."""
    code = """
import jax, jax.numpy as jnp
def maps():
    with open('/proc/self/maps', 'rb') as f:
        return sum(1 for _ in f)
x = jnp.ones(3)
x.block_until_ready()
start = maps()
kept = [jax.jit(lambda x, i=i: jnp.sin(x) * i + jnp.cos(x) ** 2) for i in range(30)]
for f in kept:
    f(x).block_until_ready()
full = maps()
jax.clear_caches()
print(start, full, maps())
"""
    env = dict(os.environ, PHASEFIELD_CACHE="off", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    start, full, after = map(int, out.stdout.split())
    assert full - start >= 30  # at least one map per program
    assert after - start < (full - start) / 4  # most of them released


_NUMBERS = """
import jax, jax.numpy as jnp
from phasefield import HParams, layers
from phasefield._runtime import optimized_jit
from phasefield.layers import paper
out = {}
with jax.enable_x64(True):
    ex = paper.exponents(HParams(sigma_w=2.0, sigma_a=1.0, alpha_a=.5, alpha_m=.5))
    out["paper"] = [float(ex[k]) for k in ("lambda_a", "lambda_g_collapse", "lambda_g_inf", "q_star", "rho_star")]
    # pre-LN's defaults: the exact map with the softmax correction, a GELU MLP
    fd = layers.finite_depth(layers.presets.pre_ln(sigma=1.1, alpha=.5, heads=4), n_tokens=16, depth=8)
    out["pre-ln"] = [float(fd["angle_rate"]), float(fd["lambda_g_input"]), float(fd["lambda_g_collapse"])]
    f = optimized_jit(lambda x: jnp.sum(jnp.tanh(x) ** 2))
    out["optimized"] = [float(f(jnp.linspace(-3.0, 3.0, 101)))]
"""


def test_fast_compiles_give_the_numbers_of_xlas_defaults():
    """The suite's fast XLA flags (conftest: LLVM -O0, classic emitters, one codegen module)
    against XLA's defaults (what a user's process compiles): the paper block's exponents
    (Eq. 10 map: the fixed-point searches), a pre-LN block's finite-depth rates (the exact
    map with the softmax correction, GELU) and an ``optimized_jit`` program (LLVM -O1 under
    the fast flags, XLA's defaults in the other process) agree to 1e-13 (measured: within
    1.5e-14, relative). The
    fast numbers come from this process (it runs with the fast flags, and its programs are
    the suite's own), the defaults' from a subprocess without them."""
    from phasefield._runtime import _FAST_NAMES, FAST_COMPILE_FLAGS

    flags = os.environ.get("XLA_FLAGS", "")
    if not all(f in flags for f in FAST_COMPILE_FLAGS):
        pytest.skip(
            "this run compiles with XLA's defaults (PHASEFIELD_TEST_XLA=default, or a jaxlib without the flags)"
        )
    base = " ".join(f for f in flags.split() if f.split("=")[0] not in _FAST_NAMES)
    code = _NUMBERS + "import json, os\nprint(json.dumps(dict(out, flags=os.environ.get('XLA_FLAGS', ''))))\n"
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, XLA_FLAGS=base, PHASEFIELD_CACHE="off"),
    )
    assert res.returncode == 0, res.stderr[-2000:]
    default = json.loads(res.stdout.strip().splitlines()[-1])
    fast = {}
    exec(_NUMBERS, fast)  # noqa: S102 - the same code, in this process
    fast = fast["out"]
    assert "optimization_level" not in default.pop("flags") and "optimization_level=0" in flags
    assert default.keys() == fast.keys()
    for key in default:
        for a, b in zip(default[key], fast[key]):
            assert abs(a - b) <= 1e-13 * max(1.0, abs(a)), (key, a, b)
