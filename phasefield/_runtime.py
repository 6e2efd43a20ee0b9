"""Process-level settings phasefield never makes on import; call them yourself.

:func:`use_all_cpu_cores` exposes every CPU core as a JAX host device (one XLA CPU program
runs on one core, so the sweeps, simulations and trainers shard over the devices). It must
run before JAX initialises its backends (before the first computation). The ``phasefield``
command calls it for its own process; ``PHASEFIELD_HOST_DEVICES=N`` sets the count
(``1`` opts out).
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
