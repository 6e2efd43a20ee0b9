"""phasefield: mean-field signal propagation in deep transformers (JAX/Flax).

    import phasefield

    phasefield.exponents("paper:sigma_w=2,alpha_a=0.5,alpha_m=0.5", n_tokens=32, depth=16)
    phasefield.exponents("pre-ln:sigma=0.55,alpha=0.2", n_tokens=64, depth=24)   # any block
    ds = phasefield.sweep(sigma_w=[...], alpha=[...], sigma_a=1.0)   # xarray.Dataset
    phasefield.HParams(sigma_w=2.0)         # the paper block's numbers (its closed-form engine's)

Importing phasefield changes no global state: the theory computes in float64 inside JAX's
scoped ``jax.enable_x64`` (``phasefield.theory.precision``), and using every CPU core as a
JAX device is the explicit call :func:`use_all_cpu_cores` (before JAX initialises).

Subpackages, loaded on first use: ``theory`` (the mean-field kernels: MLP tables, attention
maps, quadrature, the reference oracle), ``layers`` (blocks built from layers, each with its
mean-field maps; the paper's block is the ``paper`` preset with its closed-form engine), ``simulate`` (finite-width random
transformers), ``diagram`` (phase diagrams: grid sweeps of the theory; the function
``phasefield.sweep`` is :func:`phasefield.diagram.sweep`), ``probing`` (any JAX model at
initialization; the function ``phasefield.probe`` is :func:`phasefield.probing.probe`),
``figures``, ``vit`` (trainer and loss predictor), ``seeds`` (the other seed papers'
theories), ``cli``. The functions ``sweep``, ``probe`` and ``exponents`` load their module on
first use too. Imports point one way: cli -> vit, figures, diagram, ... -> layers -> theory
(``tests/test_imports.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for readers and documentation tools; at run time __getattr__ loads them
    from ._runtime import use_all_cpu_cores
    from .diagram import sweep
    from .layers.point import exponents
    from .probing import probe

__all__ = [
    "HParams",
    "exponents",
    "sweep",
    "probe",
    "theory",
    "layers",
    "diagram",
    "simulate",
    "probing",
    "use_all_cpu_cores",
]
# the release: the one place it is written (setup.cfg, ``phasefield --version`` and the
# CHANGELOG's latest section follow it; tests/test_cli_start.py checks they agree)
__version__ = "0.3.0"

_LAZY = ("theory", "layers", "diagram", "simulate", "probing", "figures", "vit", "seeds")
# names loaded on first use, like the subpackages: importing phasefield imports no JAX
_NAMES = {
    "use_all_cpu_cores": "_runtime",
    "exponents": "layers.point",
    "sweep": "diagram",
    "probe": "probing",
}


def __getattr__(name):  # lazy: ``phasefield.sweep(...)`` works without an import
    if name == "HParams":  # the paper preset's numbers, defined with it
        importlib.import_module(f"{__name__}.layers")
        return importlib.import_module(f"{__name__}.layers.registry").lookup("paper").numbers_class
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_NAMES) | {"HParams"})
