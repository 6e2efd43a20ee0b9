"""Process-level settings phasefield never makes on import; call them yourself.

:func:`use_all_cpu_cores` exposes every CPU core as a JAX host device (one XLA CPU program
runs on one core, so the sweeps, simulations and trainers shard over the devices). It must
run before JAX initialises its backends (before the first computation). The ``phasefield``
command calls it for its own process; ``PHASEFIELD_HOST_DEVICES=N`` sets the count
(``1`` opts out). :func:`use_compilation_cache` keeps compiled programs in a folder
(``PHASEFIELD_CACHE``) for the next process; the command and the test suite call it.
"""
from __future__ import annotations

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
        raise RuntimeError("use_all_cpu_cores() must be called before JAX initialises "
                           "(before the first JAX computation)")
    os.environ["XLA_FLAGS"] = f"{flags} --{FLAG}={int(count)}".strip()
    return int(count)


CACHE_OFF = ("", "off", "0", "none")


def use_compilation_cache(min_compile_secs: float = 0.5) -> str | None:
    """Persist XLA compilations in ``PHASEFIELD_CACHE`` (default ``~/.cache/phasefield/jax``;
    ``off``, ``0``, ``none`` or empty: no cache). Returns the folder, or ``None`` when off or
    it cannot be made (a read-only home: just compile).

    Programs that compile in under ``min_compile_secs`` are not stored. The cache is
    size-limited (8 GiB, least recently used entries go first), which also makes JAX lock
    it: processes running side by side (a multi-process sweep, the test suite's workers)
    never read an entry another is writing. The ``phasefield`` command calls this for its
    process; the test suite's ``conftest.py`` calls it with 0.2 s."""
    import jax

    path = os.environ.get("PHASEFIELD_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "phasefield", "jax"))
    if path.strip().lower() in CACHE_OFF:
        return None
    try:
        os.makedirs(path, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_secs))
        jax.config.update("jax_compilation_cache_max_size", 8 << 30)
    except Exception:  # noqa: BLE001 - a read-only home: just compile
        return None
    _date_unsized_entries(path)
    return path


def _date_unsized_entries(path: str) -> None:
    """Give every entry of the cache folder ``path`` that has no access-time file one (its
    modification time). Entries written without a size limit (phasefield before 2026-11-26)
    have none, and JAX's size-limited cache reads one for every entry before each write: it
    then fails every write with a warning and stores nothing new."""
    try:
        names = set(os.listdir(path))
    except OSError:
        return
    for name in names:
        key = name[:-len("-cache")] if name.endswith("-cache") else None
        if key is None or key + "-atime" in names:
            continue
        try:
            stamp = os.stat(os.path.join(path, name)).st_mtime_ns
            with open(os.path.join(path, key + "-atime"), "wb") as fh:
                fh.write(stamp.to_bytes(8, "little"))
        except OSError:
            pass
