"""Where a model fails, per block: the first block whose gradient factor or angle growth
leaves the band that keeps the whole stack within ``recommend --block``'s criteria.

The criteria (as for ``phasefield recommend --block``): over the whole stack of L blocks the
gradient grows or shrinks by at most a factor F (``|L lambda_g(L)| <= log F``), and nearby
tokens neither merge nor separate faster than r per block (``|angle_rate| <= r``). Spread
evenly over the blocks, each block's share is

* **gradient**: ``|log(grad_{l-1} / grad_l)| <= log(F) / L``, the log of the factor by
  which block l multiplies the squared gradient passing back through it (per init, from
  the gradient at every block's output; a ``stack=`` callable measures only the whole
  stack, so no block is named for the gradient);
* **angle**: ``|angle_l| <= r``, the angle growth of nearby tokens in block l.

A block leaves its band when its mean is outside the band by more than ``Z`` standard
errors over initializations (``Z`` = 3, as for the phase): noise alone names no block.

A causal model's bands read the last token's (``last=True``): its gap to the earlier tokens
(``angle_last``) and its squared gradient (``grad_last``) after each block (:mod:`.positions`).
"""

from __future__ import annotations

import math

import numpy as np

MAX_FACTOR = 10.0
MAX_ANGLE_RATE = 0.05
Z = 3.0


def _mean_se(per_init):
    a = np.asarray(per_init, float)
    n = a.shape[0]
    se = a.std(0, ddof=1) / math.sqrt(n) if n > 1 else np.full(a.shape[1:], np.nan)
    return a.mean(0), se


def grad_rate_init(ds, key: str = "grad") -> np.ndarray | None:
    """``log(grad_{l-1} / grad_l)`` per init and block l = 1..L (``[inits, L + 1]``, NaN at
    block 0), or None without a per-block gradient (``key``: ``grad_last`` for the last
    token's)."""
    if key + "_init" not in ds:
        return None
    g = np.asarray(ds[key + "_init"].values, float)
    if not np.all(np.isfinite(g[:, 1:-1])):
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.log(g[:, :-1] / g[:, 1:])
    return np.concatenate([np.full((g.shape[0], 1), np.nan), r], axis=1)


def diagnose(
    ds, max_factor: float = MAX_FACTOR, max_angle_rate: float = MAX_ANGLE_RATE, z: float = Z, last: bool = False
) -> dict:
    """Per-block rates against their bands (module docstring): ``grad_rate`` and
    ``angle`` (mean and se per block), the bands, and ``first_failing_block``: None when
    every block stays inside, else ``{"block": l (1 = the first block), "quantities": [...],
    "gradient"|"angle": {"value", "se", "band", "direction"}}``; ``last``: the last token's
    (a causal model)."""
    L = int(ds.sizes["block"]) - 1
    g_band = math.log(max_factor) / L
    out = dict(
        max_gradient_factor=float(max_factor),
        max_angle_rate=float(max_angle_rate),
        gradient_band=g_band,
        angle_band=float(max_angle_rate),
    )
    a_key, g_key = ("angle_last", "grad_last") if last else ("angle", "grad")
    if last:
        out["token"] = "last"
    angle, angle_se = _mean_se(ds[a_key + "_init"].values) if a_key + "_init" in ds else (None, None)
    gr = grad_rate_init(ds, g_key)
    grad, grad_se = _mean_se(gr) if gr is not None else (None, None)
    out["grad_rate"] = grad
    out["grad_rate_se"] = grad_se
    first = None
    for b in range(1, L + 1):
        hit = {}
        for name, mean, se, band, words in (
            ("gradient", grad, grad_se, g_band, ("shrinks", "grows")),
            ("angle", angle, angle_se, max_angle_rate, ("merge", "separate")),
        ):
            if mean is None or not np.isfinite(mean[b]):
                continue
            v, s = float(mean[b]), float(se[b]) if np.isfinite(se[b]) else 0.0
            if abs(v) > band and abs(v) - band > z * s:
                hit[name] = dict(value=v, se=s, band=band, direction=words[v > 0])
        if hit:
            first = dict(block=b, quantities=list(hit), **hit)
            break
    out["first_failing_block"] = first
    return out


def describe(first: dict | None, L: int, max_factor: float, max_angle_rate: float) -> str:
    """One sentence on the first failing block (None: every block inside its band)."""
    if first is None:
        return (
            f"Every block stays within its band (gradient factor within {max_factor:g}^(1/{L}) per block, "
            f"angle growth within +-{max_angle_rate:g})."
        )
    parts = []
    if "gradient" in first:
        g = first["gradient"]
        parts.append(
            f"the squared gradient {g['direction']} by a factor {math.exp(abs(g['value'])):.3g} through it "
            f"(log {g['value']:+.3f} +- {g['se']:.3f}; band +-{g['band']:.3f})"
        )
    if "angle" in first:
        a = first["angle"]
        parts.append(f"nearby tokens {a['direction']} at {a['value']:+.3f} +- {a['se']:.3f} (band +-{a['band']:.3g})")
    return f"Block {first['block']} of {L} is the first to leave its band: " + " and ".join(parts) + "."
