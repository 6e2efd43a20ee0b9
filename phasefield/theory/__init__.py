"""Mean-field kernels of signal propagation in the transformer of docs/theory.md (float64).

Every function is a pure function of the numbers it reads (the MLP's ``sigma_w``, the
attention's ``sigma_a``, ``n_tokens``, ``sigma_v``; for speed, a precomputed
:class:`MLPKernel` or exact-attention tables), so ``jax.jit``/``jax.vmap``/``grad`` apply
to every one of them. Structure is static: the activation and the number of hidden layers,
the attention map (``attention``: 'paper' or 'exact') and ``softmax_correction``. Results
are float64 whatever the global ``jax_enable_x64`` (:mod:`.precision`).

Floors (imports point down only)::

    precision, quadrature      float64 scope; dense trapezoid Gaussian integrals
    mlp                        the MLP branch map: Gaussian-integral kernels of phi (§4)
    attention/                 the attention branch map: paper | exact modes, chosen by
                               ``attention`` in attention/__init__.py; full-Gram
                               expectations; the softmax-derivative terms (§3, §7, §8)
    _api                       the jit-compiled, float64 public wrapper of the paper
                               block's functions of one HParams
    reference                  the independent NumPy/SciPy reference (tests, benchmarks)

This package holds the kernels and imports nothing from the rest of phasefield above it
(:mod:`phasefield.layers` and up; ``tests/test_imports.py``). Blocks are compositions of
layers (:mod:`phasefield.layers`); the paper's block map, its fixed points, exponents and
full-Gram mean field are :mod:`phasefield.layers.paper` (``paper.exponents(hp)``).
"""

from .attention import forward as attention_map  # noqa: F401
from .mlp import MLPKernel, d_m, kernel, p_m  # noqa: F401
