"""Mean-field theory of signal propagation in the transformer of docs/theory.md (float64).

Every function is a pure function of one :class:`phasefield.HParams` pytree (plus, for
speed, an optional precomputed :class:`MLPKernel`), so ``jax.jit``/``jax.vmap``/``grad``
apply to every numeric field. Approximation switches are static fields of ``HParams``:
``attention`` ('paper' or 'exact') and ``softmax_correction``. Results are float64 whatever
the global ``jax_enable_x64`` (:mod:`.precision`).

Floors (imports point down only)::

    precision, quadrature      float64 scope; dense trapezoid Gaussian integrals
    mlp                        the MLP branch map: Gaussian-integral kernels of phi (§4)
    attention/                 the attention branch map: paper | exact modes, chosen by
                               hp.attention in attention/__init__.py; full-Gram
                               expectations; the softmax-derivative terms (§3, §7, §8)
    block                      the block map, forward (q, p) -> (q', p') and backward (§5, §7)
    fixed_points               collapsed and stable fixed points, lambda_a (§6)
    lyapunov                   lambda_g and :func:`exponents`, everything at one point (§7)
    gram                       full-Gram / causal mean field and its figure helpers (§8)
    reference                  the independent NumPy/SciPy reference (tests, benchmarks)
"""
from .attention import forward as attention_map  # noqa: F401
from .block import attention_step, backward_block, block_map, gradient_matrix, trajectory  # noqa: F401
from .fixed_points import (angle_exponent, angle_growth, collapsed_fixed_point,  # noqa: F401
                           simplex_fixed_point, stable_fixed_point, stable_points)
from .lyapunov import (attractors, exponents, gradient_exponent, gradient_exponent_collapsed,  # noqa: F401
                       gradient_exponent_inf, mean_mode)
from .mlp import MLPKernel, d_m, kernel, p_m  # noqa: F401
