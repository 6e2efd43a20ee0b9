"""What the figures compute: grid sizes, simulation widths and the fixed hyperparameters
(:class:`Settings`), and the presets ``full``, ``quick`` and ``tiny``."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np

from .. import grid


def lin(spec):
    """``(start, stop, count)`` -> the grid's coordinate values."""
    lo, hi, k = spec
    return grid.canonical(np.linspace(lo, hi, int(k)))


@dataclasses.dataclass(frozen=True)
class Settings:
    """Grid sizes, simulation widths and the figures' fixed hyperparameters."""

    name: str = "full"
    # theory grids: (start, stop, count)
    theory_sigma_w: tuple = (0.3, 4.0, 241)
    theory_alpha: tuple = (0.01, 0.99, 197)
    theory_sigma_a: tuple = (0.1, 5.0, 197)
    slice_sigma_w: float = 2.0  # sigma_w of the (sigma_A, alpha) slice
    # simulated grids
    sim_sigma_w: tuple = (0.5, 3.5, 13)
    sim_alpha: tuple = (0.1, 0.9, 9)
    sim_sigma_a: tuple = (0.25, 4.0, 7)
    sim_alpha_b: tuple = (0.1, 0.9, 7)
    width: int = 512
    seeds: int = 16
    causal_width: int = 512
    causal_seeds: int = 16
    # Figs. 2-3
    fig_sigma_w: tuple = (1.0, 3.0)  # either side of the transition at alpha = .5
    geometry_width: int = 512
    geometry_seeds: int = 16
    q0: float = 1.0
    rho0: float = 0.7
    rho_intra: float = 0.8  # Eq. 12 two-group input (q0 = 1)
    rho_inter: float = 0.2
    # fixed hyperparameters
    sigma_a: float = 1.0
    alpha: float = 0.5
    n_tokens: int = 32
    depth: int = 16
    seed: int = 0

    def key(self) -> str:
        return hashlib.sha1(json.dumps(dataclasses.asdict(self), sort_keys=True).encode()).hexdigest()[:10]


FULL = Settings()
QUICK = Settings(
    name="quick",
    theory_sigma_w=(0.3, 4.0, 149),
    theory_alpha=(0.01, 0.99, 99),
    theory_sigma_a=(0.1, 5.0, 99),
    sim_sigma_w=(0.5, 3.5, 7),
    sim_alpha=(0.1, 0.9, 5),
    sim_sigma_a=(0.25, 4.0, 4),
    sim_alpha_b=(0.1, 0.9, 4),
    width=256,
    seeds=16,
    causal_width=256,
    causal_seeds=16,  # width 128 biases lambda_a by
    geometry_width=256,
    geometry_seeds=8,  # -0.25 at alpha = .9
)
TINY = Settings(  # tests and notebooks: seconds, not minutes
    name="tiny",
    theory_sigma_w=(0.3, 4.0, 24),
    theory_alpha=(0.01, 0.99, 16),
    theory_sigma_a=(0.1, 5.0, 12),
    sim_sigma_w=(1.0, 3.0, 3),
    sim_alpha=(0.3, 0.7, 2),
    sim_sigma_a=(0.5, 3.0, 2),
    sim_alpha_b=(0.3, 0.7, 2),
    width=32,
    seeds=2,
    causal_width=32,
    causal_seeds=2,
    geometry_width=32,
    geometry_seeds=2,
    n_tokens=8,
    depth=4,
)
PRESETS = {"full": FULL, "quick": QUICK, "tiny": TINY}
