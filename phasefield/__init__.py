"""phasefield: mean-field signal propagation in deep transformers (JAX/Flax).

    import phasefield
    from phasefield import HParams, theory

    hp = HParams(sigma_w=2.0, sigma_a=1.0, alpha_a=0.5, alpha_m=0.5, n_tokens=32, depth=16)
    theory.exponents(hp)                    # lambda_a, lambda_g, lambda_g_inf, q_star, rho_star
    ds = phasefield.sweep(sigma_w=[...], alpha=[...], sigma_a=1.0)   # xarray.Dataset

Subpackages: ``theory`` (the mean-field maps), ``simulate`` (finite-width random
transformers), ``sweep`` (grids), ``figures``, ``vit`` (trainer and loss predictor),
``seeds`` (the other seed papers' theories), ``cli``.
"""
from __future__ import annotations

import importlib
import os as _os

# One XLA CPU program runs on one core; exposing each core as a host device lets the
# sweeps, simulations and trainers shard over all of them (no effect on GPU/TPU backends,
# and none once JAX is initialised). Opt out with PHASEFIELD_HOST_DEVICES=1.
if "xla_force_host_platform_device_count" not in _os.environ.get("XLA_FLAGS", ""):
    _n = int(_os.environ.get("PHASEFIELD_HOST_DEVICES", _os.cpu_count() or 1))
    if _n > 1:
        _os.environ["XLA_FLAGS"] = (_os.environ.get("XLA_FLAGS", "") +
                                    f" --xla_force_host_platform_device_count={_n}").strip()

import jax as _jax  # noqa: E402

_jax.config.update("jax_enable_x64", True)  # theory runs in float64; networks pick their own dtype

from .config import HParams  # noqa: E402

__all__ = ["HParams", "theory", "sweep", "simulate"]
__version__ = "0.1.0"

_LAZY = ("theory", "sweep", "simulate", "figures", "vit", "seeds")


def __getattr__(name):  # lazy subpackages: ``phasefield.sweep(...)`` works without an import
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
