"""The paper's block (docs/theory.md §1, the ``paper`` preset) analysed in (q, p): its block map,
fixed points and exponents, its grid evaluator and its full-Gram mean field, as pure
functions of one :class:`phasefield.HParams` pytree (float64, jit-compiled once per static
configuration, :func:`phasefield.theory._api.public`). This package registers the ``paper``
preset with its engine (:class:`phasefield.layers.registry.Engine`); the rest of the library
reaches it through the registry (``registry.lookup("paper").engine``), never by import.

    from phasefield import HParams
    from phasefield.layers import paper

    hp = HParams(sigma_w=2.0, sigma_a=1.0, alpha_a=0.5, alpha_m=0.5, n_tokens=32, depth=16)
    paper.exponents(hp)             # lambda_a, lambda_g_collapse, lambda_g_inf, q_star, rho_star, ...

The block map is the composition of the ``paper`` preset's layers (:func:`.preset.paper`), so the layer kinds' mean-field maps are the only
copy; the Gaussian-integral kernels they use (the MLP tables, the attention maps) are in
:mod:`phasefield.theory`, which imports nothing from here.

Modules (imports point down)::

    numbers        HParams, the block's numbers
    preset         the block as layers, and its registration
    block          the block map, forward (q, p) -> (q', p') and backward (§5, §7)
    fixed_points   collapsed and stable fixed points, lambda_a (§6)
    lyapunov       lambda_g and :func:`exponents`, everything at one point (§7)
    sweep          the grid evaluator (phase diagrams)
    gram           full-Gram / causal mean field and its figure helpers (§8)
"""

import sys as _sys

from .. import registry as _registry
from . import gram, sweep  # noqa: F401
from . import preset as _preset
from .block import attention_step, backward_block, block_map, gradient_matrix, trajectory  # noqa: F401
from .fixed_points import (  # noqa: F401
    angle_exponent,
    angle_growth,
    collapsed_fixed_point,
    simplex_fixed_point,
    stable_fixed_point,
    stable_points,
)
from .lyapunov import (  # noqa: F401
    attractors,
    exponents,
    gradient_exponent,
    gradient_exponent_collapsed,
    gradient_exponent_inf,
    mean_mode,
)
from .numbers import HParams  # noqa: F401
from .preset import paper  # noqa: F401

ENGINE = _registry.Engine(
    numbers_class=HParams,
    exponents=exponents,
    trajectory=trajectory,
    gradient_exponent=gradient_exponent,
    stable_points=stable_points,
    sweep=sweep.sweep_grid,
    namespace=_sys.modules[__name__],
)
_preset.register(ENGINE)
