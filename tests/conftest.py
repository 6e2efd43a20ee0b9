"""Shared fixtures.

Importing phasefield leaves ``jax_enable_x64`` alone (tests/test_isolation.py); the theory
entry points compute in float64 by themselves. Tests that build their own float64 inputs or
transform theory functions with their own ``jit``/``vmap``/``grad`` use :func:`float64`
(``pytestmark = pytest.mark.usefixtures("float64")``), JAX's scoped x64 switch.

The test process owns its configuration like the ``phasefield`` command: every CPU core is a
JAX device, set here before JAX initialises. **One persistent compilation cache per run**:
the process that starts the run (the xdist controller, or the
only process) makes a fresh, empty folder and exports it as ``PHASEFIELD_TEST_CACHE``
before the workers start, so the two xdist workers and every subprocess the tests start
(``PHASEFIELD_CACHE``) share it and each program is compiled once per run; the folder is
removed when the run ends, so every run starts cold (as a fresh clone does). It stores every program,
however quick its compile, without a size limit (``PHASEFIELD_CACHE_MIN_SECS=0``,
``PHASEFIELD_CACHE_MAX_BYTES=-1``, exported): ~1,300 of the suite's ~5,100 compilations are
then loads (programs compiled again after ``jax.clear_caches``, by a fresh ``jax.jit`` of
the same function, in the other worker or in a subprocess), which saves the workers ~10 %
of their CPU (a size-limited cache would scan every entry before each write).
``PHASEFIELD_TEST_CACHE=FOLDER`` names a folder of your own (kept: a warm rerun), ``PHASEFIELD_TEST_CACHE=off`` turns the
cache off. The computed tables' disk cache (the exact-softmax tables of each token
count, :mod:`phasefield.theory.table_cache`) is per run the same way: a fresh folder
exported as ``PHASEFIELD_TEST_TABLES`` and ``PHASEFIELD_TABLES``, removed at the end, so
every run computes its tables once and no test touches the user's own folder
(``PHASEFIELD_TEST_TABLES=FOLDER`` keeps one, ``off`` computes them in every process). A segmentation fault late in a run in ``put_executable_and_time`` /
``backend_compile_and_load`` (with or without the cache) is the worker running out of
memory maps (below), not the cache. The :func:`no_compilation_cache` fixture keeps the
cache away from the DeepScaleLM moments (crashes seen in the cache write there, cause not
known).

Compiled programs are shared between tests and modules of a worker; each XLA:CPU
executable holds about 3.4 memory maps, and a worker that kept all of the suite's programs
(~42,000 maps after 16 minutes) would reach the kernel's ``vm.max_map_count`` (65,530) and
segfault, so :func:`_release_executables` drops JAX's compiled programs
(``jax.clear_caches()``, the maps go with them) after any test that leaves the process
above :data:`MAPS_HIGH` maps (the persistent cache reloads what is needed again).

**Fast compiles**: the suite compiles ~4,000 distinct XLA programs and runs most of them
once, so it lowers XLA:CPU's optimisation (:func:`phasefield._runtime.use_fast_compilation`:
LLVM -O0, the classic emitters, one codegen module; about 5x faster compiles, values within
~1e-14 of the defaults) for itself and its subprocesses; the programs whose run time
dominates even here are compiled with run-time optimisation (``optimized_jit``, LLVM -O1):
the simulator's transient and gradient draws where their work is large, the block
simulator's draws, the DeepScaleLM stack simulation, and the tests' own Monte Carlo loops
(test_correction, test_seeds_deepscalelm). Marking more (sweep chunks, tables, training)
was measured to cost the suite more compile time than it saved in run time.
``PHASEFIELD_TEST_XLA=default`` runs the suite with XLA's defaults everywhere (what a user's
process compiles); tests/test_suite_setup.py checks that the defaults and the fast flags give
the same numbers.

**Process set-up**: OpenBLAS and OpenMP run one thread per test
process (their idle threads spun beside the two workers), and Python's garbage collector runs
less often, with the imports' and the test modules' objects frozen (it took ~4 % of the
suite's CPU); the many-scales table test integrates its ~190 tables with an ``optimized_jit``
program (:func:`optimized_tables`).

**Cheaper bookkeeping**: memory maps are counted every :data:`MAPS_EVERY` tests, not after
each; JAX lowers without Python source locations (``JAX_TRACEBACK_IN_LOCATIONS_LIMIT=0``,
exported: metadata only profilers read).

``PHASEFIELD_COMPILE_PROFILE=FOLDER`` (opt-in) loads ``tests/compile_profile.py``: each
worker writes the seconds JAX spent tracing, lowering and compiling, per test and per
jitted function, to ``FOLDER``; ``python tests/compile_profile.py FOLDER`` ranks them.
"""

import gc
import os
import shutil
import tempfile

# One thread each for OpenBLAS and OpenMP (scikit-learn's trees): the two xdist workers keep
# both cores busy, and idle BLAS/OpenMP threads spin-waiting beside them cost CPU the suite
# needs (test_trainability 55.5 -> 46.3 CPU-s at the same wall time). Set before
# NumPy loads OpenBLAS; exported, so the workers and subprocesses inherit it; a value you set wins.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# No Python source locations in the lowered programs (JAX's default keeps 10 frames of every
# operation's traceback as MLIR location metadata, read only by profilers and XLA dumps):
# test_theory + test_cost 65-67 -> 50-62 user CPU-s (the suite compiles ~4,000 programs). Exported before JAX loads, so the workers and subprocesses
# inherit it; a value you set wins.
os.environ.setdefault("JAX_TRACEBACK_IN_LOCATIONS_LIMIT", "0")

import jax  # noqa: E402
import pytest  # noqa: E402

import phasefield  # noqa: E402
from phasefield._runtime import use_compilation_cache, use_fast_compilation  # noqa: E402

phasefield.use_all_cpu_cores()
if os.environ.get("PHASEFIELD_TEST_XLA", "fast") != "default":  # inherited by the CLI subprocesses
    use_fast_compilation()


def _map_limit() -> int:
    """The kernel's limit on a process's memory maps (``vm.max_map_count``; 65,530 where it
    cannot be read)."""
    try:
        with open("/proc/sys/vm/max_map_count") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return 65_530


# memory maps of a process above which its compiled programs are dropped: 75 % of the
# kernel's limit (49,147 of 65,530), which leaves ~16,000 maps for the MAPS_EVERY tests
# between two counts (at most 2,619 maps in one test and 7,399 over eight, in a whole run's
# compile profile, 2026-11-30). Kept, the workers peak at ~44,000-49,400 maps; a crossed mark
# costs a ~10 s teardown that drops everything, and the programs of the tests after it are
# traced, lowered and loaded again.
# PHASEFIELD_TEST_MAPS_HIGH=N sets another mark (a check of the release path: a low mark
# drops them after nearly every test)
MAPS_HIGH = int(os.environ.get("PHASEFIELD_TEST_MAPS_HIGH", _map_limit() * 3 // 4))
_MADE_CACHE = []  # the run's cache folder, when this process made it (removed at the end)


def _run_cache_folder() -> str:
    """PHASEFIELD_TEST_CACHE, or a fresh empty folder made by the process that starts the run
    (exported, so the xdist workers started after this and the subprocesses inherit it)."""
    asked = os.environ.get("PHASEFIELD_TEST_CACHE")
    if asked is not None:
        return asked
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker of a controller that made none
        return "off"
    folder = tempfile.mkdtemp(prefix="phasefield-test-cache-")
    os.environ["PHASEFIELD_TEST_CACHE"] = folder
    _MADE_CACHE.append(folder)
    return folder


os.environ["PHASEFIELD_CACHE"] = _run_cache_folder()  # the CLI's set-up (phasefield._runtime)
# every program stored, no size limit (and so no lock: JAX's size-limited cache reads every
# entry's access time before each write): exported, so the workers, the in-process CLI runs
# (which call use_compilation_cache again) and the subprocesses store alike
os.environ.setdefault("PHASEFIELD_CACHE_MIN_SECS", "0")
os.environ.setdefault("PHASEFIELD_CACHE_MAX_BYTES", "-1")
_CACHE = use_compilation_cache()
if _CACHE is None:
    os.environ["PHASEFIELD_CACHE"] = "off"  # the subprocesses too
else:
    os.environ["PHASEFIELD_CACHE"] = _CACHE  # the subprocesses' CLI uses the same folder


def _run_tables_folder() -> str:
    """PHASEFIELD_TEST_TABLES, or a fresh empty folder made by the process that starts the run
    (exported, so the workers and subprocesses share it): the computed tables' disk cache
    (``phasefield.theory.table_cache``), never the user's own folder."""
    asked = os.environ.get("PHASEFIELD_TEST_TABLES")
    if asked is not None:
        return asked
    folder = tempfile.mkdtemp(prefix="phasefield-test-tables-")
    os.environ["PHASEFIELD_TEST_TABLES"] = folder
    _MADE_CACHE.append(folder)
    return folder


os.environ["PHASEFIELD_TABLES"] = _run_tables_folder()  # read by phasefield.theory.table_cache

# Python's cyclic garbage collector takes ~4 % of the suite's CPU at its default thresholds
# (perf over a whole run): JAX's tracing allocates many short-lived objects, and at the default thresholds
# (700, 10, 10) the collections kept rescanning every object the imports made. The test
# processes collect less often and freeze what the imports and the collected test modules
# made (gc.freeze: never scanned again; see pytest_collection_finish). test_layers,
# test_theory and test_exact: 134.5 -> 128.9 CPU-s, the same peak memory (3.7 GB).
gc.set_threshold(100_000, 50, 100)
gc.freeze()

if os.environ.get("PHASEFIELD_COMPILE_PROFILE"):  # opt-in: compile seconds per test and program
    from compile_profile import pytest_runtest_protocol, pytest_sessionfinish  # noqa: F401


def pytest_unconfigure(config):  # noqa: ARG001 - a pytest hook
    for folder in _MADE_CACHE:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_finish(session):  # noqa: ARG001 - a pytest hook
    """The test modules are imported: freeze their objects too (the garbage collector above)."""
    gc.freeze()


def memory_maps() -> int:
    """The process's memory maps (lines of /proc/self/maps; 0 where there is none)."""
    try:
        with open("/proc/self/maps", "rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


# tests between two counts of the memory maps: the kernel writes ~1 us of text per map, so a
# count at ~20,000 maps takes ~25 ms (~10 CPU-s over the suite's ~720 tests if made after
# each); a test adds at most ~2,000 maps (1,930 measured), eight together ~5,000: far below
# the headroom between MAPS_HIGH and the kernel's limit
MAPS_EVERY = 8
_SINCE_COUNT = [0]


@pytest.fixture(autouse=True)
def _release_executables():
    """Drop JAX's compiled programs when the process is above :data:`MAPS_HIGH` memory maps
    (counted after every :data:`MAPS_EVERY`-th test). Every XLA:CPU executable holds ~3.4
    maps; a worker that kept the whole suite's (~42,000 maps after 16 minutes) would reach
    the kernel's limit (``vm.max_map_count`` = 65,530), and the next compilation or cache
    write would segfault. Below the mark, tests and modules share their compiled programs."""
    yield
    _SINCE_COUNT[0] += 1
    if _SINCE_COUNT[0] >= MAPS_EVERY or MAPS_HIGH < 1000:  # a low mark (a check of this path): every test
        _SINCE_COUNT[0] = 0
        if memory_maps() > MAPS_HIGH:
            jax.clear_caches()


@pytest.fixture
def no_compilation_cache():
    """The persistent compilation cache off for one test (restored after)."""
    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)


@pytest.fixture
def optimized_tables(monkeypatch):
    """The exact-softmax mesh tables (``exact_table.st_mesh_fn``) compiled with run-time
    optimisation (``optimized_jit``) for one test that integrates ~190 of them with one
    program (the many-scales test: 0.14 -> 0.04 CPU-s a table, +2 s of compile; values
    within ~1e-15 of the suite's -O0 program). The tables cached per process
    (``_st_values``) are dropped before and after, so no other test reads a table of this
    program."""
    import functools

    from phasefield._runtime import optimized_jit
    from phasefield.theory.attention import exact_table

    plain, cached = exact_table.st_mesh_fn, exact_table._st_values
    monkeypatch.setattr(
        exact_table,
        "st_mesh_fn",
        functools.lru_cache(maxsize=None)(lambda *sizes: optimized_jit(plain(*sizes).__wrapped__)),
    )
    cached.cache_clear()
    yield
    cached.cache_clear()


@pytest.fixture
def float64():
    with jax.enable_x64(True):
        yield


@pytest.fixture
def small_ensembles(monkeypatch):
    """Forests of 50 trees and boosting of 100 trees at 3x the rate (the same total
    shrinkage) instead of the shipped 200 and 300 (``phasefield.vit.models``), for tests
    whose claims are about the exponent and linear models, the trees being only candidates
    (equality with scikit-learn at the shipped sizes: tests/test_trainability.py). A third
    less CPU for the analysis tests. The Gaussian-process candidates fit their
    kernel from its starting numbers only (``GP.restarts`` 0, not 2; the GP's own tests keep
    the shipped restarts): these eight tests 89 -> 76 CPU-s."""
    from phasefield.vit import models

    monkeypatch.setitem(models.FOREST_PARAMS, "n_estimators", 50)
    monkeypatch.setitem(models.TREE_PARAMS, "n_estimators", 100)
    monkeypatch.setitem(models.TREE_PARAMS, "learning_rate", 3 * models.TREE_PARAMS["learning_rate"])
    monkeypatch.setattr(models.GP, "restarts", 0)


def q_star_reference(hp) -> float:
    """The paper block's q* in closed form, an independent route to the engine's (imported by
    the simulator's tests): ``q* = (beta_M^2 alpha_A^2 sigma_V^2 + alpha_M^2 q_M(1)) / (1 -
    beta_A^2 beta_M^2)`` with q_M(1) from a dense trapezoid rule in standard-normal space
    (composed over ``mlp_layers``). Requires the unit-norm residual (finite q*)."""
    import numpy as np

    from phasefield import activations
    from phasefield.theory.precision import float64

    @float64
    def value():
        phi = activations.get(hp.activation)
        z = np.linspace(-12.0, 12.0, 200001)
        w = np.exp(-0.5 * z * z)
        w /= w.sum()
        sw = float(hp.sigma_w)
        var = sw**2  # pre-activation variance of the first layer (normalised input)
        for _ in range(hp.mlp_layers):
            qm = sw**2 * float(np.sum(w * np.asarray(phi(np.sqrt(var) * z)) ** 2))
            var = qm
        aa, am, sv = float(hp.alpha_a), float(hp.alpha_m), float(hp.sigma_v)
        ba2, bm2 = float(hp.beta_a) ** 2, float(hp.beta_m) ** 2
        return (bm2 * aa**2 * sv**2 + am**2 * qm) / (1.0 - ba2 * bm2)

    return value()


class _Compiles:
    """XLA compilations of this process so far (JAX's compile-duration events)."""

    def __init__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self)

    def __call__(self, event, duration, **kw):  # noqa: ARG002 - JAX's listener signature
        if event == "/jax/core/compile/backend_compile_duration":
            self.count += 1


@pytest.fixture(scope="session")
def compiles():
    """A counter of the process's XLA compilations (``.count``): a test reads it before and
    after new numbers to show they compile nothing."""
    return _Compiles()
