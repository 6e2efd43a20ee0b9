"""Process-level settings phasefield never makes on import; call them yourself.

:func:`use_all_cpu_cores` exposes every CPU core as a JAX host device (one XLA CPU program
runs on one core, so the sweeps, simulations and trainers shard over the devices). It must
run before JAX initialises its backends (before the first computation). The ``phasefield``
command calls it for its own process; ``PHASEFIELD_HOST_DEVICES=N`` sets the count
(``1`` opts out). :func:`use_compilation_cache` keeps compiled programs in a folder
(``PHASEFIELD_CACHE``) for the next process; the command and the test suite call it.
:func:`use_fast_compilation` trades XLA:CPU's run-time optimisation for compile time (about 4x
faster compiles, programs several times slower): for a process that compiles many programs
and runs each briefly, such as the test suite. A program whose run time dominates even
there (the simulators' draws) is made with :func:`optimized_jit`, which compiles it with
run-time optimisation (:data:`OPTIMIZED`) in such a process, and is ``jax.jit`` elsewhere.
"""

from __future__ import annotations

import functools
import os

from jax._src import xla_bridge  # private: JAX has no public "initialised?" query

FLAG = "xla_force_host_platform_device_count"


def use_all_cpu_cores(count: int | None = None) -> int:
    """Expose ``count`` (default: ``PHASEFIELD_HOST_DEVICES`` or every core) CPU devices.

    Appends ``--xla_force_host_platform_device_count`` to ``XLA_FLAGS`` unless the flag is
    already there (the user's choice wins). Returns the device count requested (1: nothing
    done). Raises ``RuntimeError`` when JAX's backends are already initialised (too late).
    No effect on GPU/TPU backends."""
    if count is None:
        count = int(os.environ.get("PHASEFIELD_HOST_DEVICES", os.cpu_count() or 1))
    flags = os.environ.get("XLA_FLAGS", "")
    if count <= 1 or FLAG in flags:
        return max(int(count), 1)
    if xla_bridge.backends_are_initialized():
        raise RuntimeError(
            "use_all_cpu_cores() must be called before JAX initialises (before the first JAX computation)"
        )
    os.environ["XLA_FLAGS"] = f"{flags} --{FLAG}={int(count)}".strip()
    return int(count)


# XLA:CPU flags for fast compiles (use_fast_compilation): LLVM at -O0 and the classic
# elemental emitters instead of the fusion emitters. On a 2-core CPU (the
# pre-LN, post-LN and paper blocks' exponents and finite-depth rates): compile 24.3 -> 6.6
# CPU-s, values within 1.5e-14 (relative) of the defaults; a paper sweep runs ~6x slower.
# The LLVM module compiled whole instead of split for parallel codegen (it spends CPU on
# the split, and a process whose cores are all busy gains nothing from the threads): a
# further -18 % compile CPU on the same programs (4.8 -> 3.9 CPU-s; values
# within 4.4e-16 of the split build). Run time is not affected.
FAST_COMPILE_FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_cpu_parallel_codegen_split_count=1",
)
# Run-time optimisation for optimized_jit programs in a process that lowered XLA's
# (FAST_COMPILE_FLAGS in XLA_FLAGS), as per-program compiler options: LLVM -O1 with the
# classic emitters. Against XLA's defaults (-O3, fusion emitters) on the
# simulator's gradient draws: compile 4.4 -> 2.9 CPU-s, run 0.27 -> 0.31 s; test_simulate
# and test_simulate_theory 62 -> 56 CPU-s. The codegen split is left as the flags set it.
OPTIMIZED = {"xla_backend_optimization_level": 1, "xla_cpu_use_fusion_emitters": False}
_FAST_NAMES = tuple(f.split("=")[0] for f in FAST_COMPILE_FLAGS)


def use_fast_compilation() -> bool:
    """Append :data:`FAST_COMPILE_FLAGS` to ``XLA_FLAGS`` (each unless already set there: the
    user's choice wins). For processes that compile many short-running programs (the test
    suite); :func:`optimized_jit` programs are not affected. The flags are first tried in a
    subprocess (XLA aborts a process on a flag its version does not know; older jaxlibs lack
    the emitter flag): none is added where that fails. Returns whether flags were added.
    Raises ``RuntimeError`` when JAX's backends are already initialised (too late)."""
    flags = os.environ.get("XLA_FLAGS", "")
    new = [f for f, name in zip(FAST_COMPILE_FLAGS, _FAST_NAMES) if name not in flags]
    if not new:
        return False
    if xla_bridge.backends_are_initialized():
        raise RuntimeError(
            "use_fast_compilation() must be called before JAX initialises (before the first JAX computation)"
        )
    import subprocess
    import sys

    env = dict(os.environ, XLA_FLAGS=" ".join([flags, *new]).strip(), JAX_PLATFORMS="cpu")
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import jax.numpy as jnp; jnp.zeros(2).block_until_ready()"],
            env=env,
            capture_output=True,
            timeout=300,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    if probe.returncode != 0:
        return False
    os.environ["XLA_FLAGS"] = env["XLA_FLAGS"]
    return True


def options_known(options: dict) -> bool:
    """Whether this process's XLA accepts ``options`` as per-program compiler options
    (checked once per set of options, by compiling a trivial program; XLA rejects a name its
    version does not know)."""
    key = tuple(sorted(options.items()))
    if key not in _KNOWN:
        import jax

        try:
            jax.jit(lambda a: a + 1, compiler_options=dict(options)).lower(0.0).compile()
            _KNOWN[key] = True
        except Exception:  # noqa: BLE001 - an XLA without these options
            _KNOWN[key] = False
    return _KNOWN[key]


_KNOWN: dict = {}


def optimized_options():
    """:data:`OPTIMIZED` where this process lowered XLA's optimisation (a
    :data:`FAST_COMPILE_FLAGS` flag in ``XLA_FLAGS``) and its XLA knows the options
    (:func:`options_known`), else None: XLA's defaults already apply."""
    flags = os.environ.get("XLA_FLAGS", "")
    if not any(name in flags for name in _FAST_NAMES) or not options_known(OPTIMIZED):
        return None
    return dict(OPTIMIZED)


class _OptimizedJit:
    """``jax.jit(fun, **jit_kwargs)``, made on first use with :func:`optimized_options`;
    with ``when``, calls for which ``when(*args, **kwargs)`` is false use the plain program."""

    def __init__(self, fun, jit_kwargs, when=None):
        functools.update_wrapper(self, fun)
        self._fun, self._kwargs, self._when, self._jitted, self._plain = fun, jit_kwargs, when, None, None

    def _jit(self):
        if self._jitted is None:
            import jax

            opts = optimized_options()
            self._jitted = jax.jit(self._fun, **self._kwargs, **({"compiler_options": opts} if opts else {}))
            self._plain = jax.jit(self._fun, **self._kwargs) if opts else self._jitted
        return self._jitted

    def __call__(self, *args, **kwargs):
        jitted = self._jit()
        if self._when is not None and jitted is not self._plain and not self._when(*args, **kwargs):
            return self._plain(*args, **kwargs)
        return jitted(*args, **kwargs)

    def __getattr__(self, name):  # lower, trace, eval_shape, clear_cache, ...
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._jit(), name)


def optimized_jit(fun=None, *, when=None, **jit_kwargs):
    """``jax.jit`` for programs whose run time matters more than their compile time even in
    a process that compiles for speed (the simulator's transient and gradient draws, whose
    Monte Carlo runs ~5x slower at -O0): compiled with run-time optimisation
    (:data:`OPTIMIZED`) even in a process that lowered it with :func:`use_fast_compilation`;
    elsewhere exactly ``jax.jit``. ``when(*args, **kwargs)`` (optional) says per call whether
    the work is large enough to pay for the slower compile; where it is not, the call uses
    the process's own compile settings. Usable as ``optimized_jit(f, ...)``,
    ``@optimized_jit`` or ``partial(optimized_jit, static_argnames=...)``."""
    if fun is None:
        return lambda f: optimized_jit(f, when=when, **jit_kwargs)
    return _OptimizedJit(fun, jit_kwargs, when)


CACHE_OFF = ("", "off", "0", "none")


def use_compilation_cache(min_compile_secs: float = 0.5) -> str | None:
    """Persist XLA compilations in ``PHASEFIELD_CACHE`` (default ``~/.cache/phasefield/jax``;
    ``off``, ``0``, ``none`` or empty: no cache). Returns the folder, or ``None`` when off or
    it cannot be made (a read-only home: just compile).

    Programs that compile in under ``min_compile_secs`` are not stored. The cache is
    size-limited (8 GiB, least recently used entries go first), which also makes JAX lock
    it: processes running side by side (a multi-process sweep) never read an entry another
    is writing. The ``phasefield`` command calls this for its process.

    Two environment variables override these for every process that inherits them (the
    test suite's throwaway per-run folder, ``tests/conftest.py``):
    ``PHASEFIELD_CACHE_MIN_SECS`` (the minimum compile time of a stored program; ``0``: store
    every program) and ``PHASEFIELD_CACHE_MAX_BYTES`` (the size limit; ``-1``: none, and then
    no lock: JAX's size-limited cache lists and reads every entry's access time before each
    write, which costs more than a compile once a folder holds thousands of small programs.
    Without the lock a process may find an entry another is still writing; JAX then warns
    and compiles that program itself)."""
    import jax

    path = os.environ.get("PHASEFIELD_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "phasefield", "jax"))
    if path.strip().lower() in CACHE_OFF:
        return None
    min_secs = _env_number("PHASEFIELD_CACHE_MIN_SECS", float(min_compile_secs), float)
    max_bytes = _env_number("PHASEFIELD_CACHE_MAX_BYTES", 8 << 30, int)
    from .grid import check_option

    check_option("PHASEFIELD_CACHE_MIN_SECS", min_secs, 0.0)
    if max_bytes != -1:
        check_option("PHASEFIELD_CACHE_MAX_BYTES", max_bytes, 1, integer=True, hint="; -1: no limit")
    try:
        os.makedirs(path, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_secs)
        jax.config.update("jax_compilation_cache_max_size", max_bytes)
    except Exception:  # noqa: BLE001 - a read-only home: just compile
        return None
    if max_bytes != -1:  # only a size-limited cache reads the access-time files
        _date_unsized_entries(path)
    return path


def _env_number(name: str, default, kind):
    """``kind(os.environ[name])``, or ``default`` where it is unset or empty; ValueError (one
    line) naming the variable where it is not a number of that kind."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{name} must be {'an integer' if kind is int else 'a number'} (got {text!r})") from None


def _date_unsized_entries(path: str) -> None:
    """Give every entry of the cache folder ``path`` that has no access-time file one (its
    modification time). Entries written without a size limit (older phasefield versions)
    have none, and JAX's size-limited cache reads one for every entry before each write: it
    then fails every write with a warning and stores nothing new."""
    try:
        names = set(os.listdir(path))
    except OSError:
        return
    for name in names:
        key = name[: -len("-cache")] if name.endswith("-cache") else None
        if key is None or key + "-atime" in names:
            continue
        try:
            stamp = os.stat(os.path.join(path, name)).st_mtime_ns
            with open(os.path.join(path, key + "-atime"), "wb") as fh:
                fh.write(stamp.to_bytes(8, "little"))
        except OSError:
            pass
