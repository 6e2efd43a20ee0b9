"""The exact-softmax mesh values as a function of the logit scale, read inside a program.

A layer whose attention reads tokens of any norm (behind DyT) meets a new logit scale
``sigma_A q`` at every layer of every point. Integrating the softmax expectations at each
costs ~10 ms a layer. :class:`ScaleTable` holds instead the Chebyshev interpolants in the
scale that :func:`.exact_table.point_pieces` builds once per (n, range) and keeps on disk
(each piece's (S, T) mesh values at :data:`NODES` Chebyshev–Lobatto nodes of its range),
and evaluates them at a traced scale: a barycentric sum over the nodes of the piece that
holds it, then the usual interpolant in rho (:func:`.exact_table.interpolate`). Within the
pieces' accuracy (their tails reach :data:`.exact_table.SCALE_TAIL`) the values are the
integrated ones; :meth:`ScaleTable.holds` says where a scale has no piece (a range not
built, a scale beyond it), where the caller integrates as before.

Its shapes are fixed (:data:`PIECES` pieces of :data:`NODES` nodes, unused ones NaN), so
one compiled program serves every table of one grid size, whichever ranges are built.
"""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import struct

from ..precision import float64
from . import exact, exact_table

NODES = max(exact_table.POINT_NODES)  # every piece resampled to this many nodes (exactly: the
# same polynomial, evaluated at more nodes)
PIECES = 16  # the most pieces one table holds (a range is halved at most 4 times)


@struct.dataclass
class ScaleTable:
    lo: Any  # [PIECES] each piece's range (NaN: unused)
    hi: Any
    s: Any  # [PIECES, NODES, 2, MESH_FULL + 1] (S_1, S_rho) at the nodes
    t: Any  # the same for (T_1, T_rho)
    interp: bool = struct.field(pytree_node=False, default=False)  # every node's rho interpolant is exact
    interp_t: bool = struct.field(pytree_node=False, default=False)

    def holds(self, scale):
        """Whether a piece holds the logit scale ``scale`` (traced)."""
        return jnp.any((scale >= self.lo) & (scale <= self.hi))

    def at(self, scale):
        """(S, T) mesh values [2, MESH_FULL + 1] at the logit scale ``scale`` (garbage where
        :meth:`holds` is false)."""
        inside = (scale >= self.lo) & (scale <= self.hi)
        i = jnp.argmax(inside)
        lo, hi = self.lo[i], self.hi[i]
        j = jnp.arange(NODES)
        x = lo + (hi - lo) * (1.0 - jnp.cos(jnp.pi * j / (NODES - 1))) / 2.0
        w = jnp.where(j % 2 == 0, 1.0, -1.0).at[0].mul(0.5).at[-1].mul(0.5)
        d = scale - x
        hit = d == 0
        c = w / jnp.where(hit, 1.0, d)
        c = jnp.where(jnp.any(hit), hit.astype(c.dtype), c / jnp.sum(c))
        return jnp.tensordot(c, self.s[i], axes=1), jnp.tensordot(c, self.t[i], axes=1)


@functools.lru_cache(maxsize=32)
@float64
def build(n: float, n_a: int, n_z: int, cap: float, ranges: int) -> ScaleTable | None:
    """The table of ``n`` tokens and grid sizes (n_a, n_z) (scales up to ``cap``) whose pieces
    cover the first ``ranges`` ranges of :func:`.exact_table.point_ranges` (built, read from
    the package or from disk: :func:`.exact_table.point_pieces`). None where they need more
    than :data:`PIECES` pieces or no range has any. Once per process and key: every point
    whose scale falls in the same range reads the same table."""
    pieces = []
    for lo, hi in exact_table.point_ranges(cap)[:ranges]:
        pieces += exact_table.point_pieces(float(n), n_a, n_z, float(cap), lo, hi)
    if not pieces or len(pieces) > PIECES:
        return None
    lo = np.full(PIECES, np.nan)
    hi = np.full(PIECES, np.nan)
    shape = (PIECES, NODES, 2, exact_table.MESH_FULL + 1)
    s, t = np.full(shape, np.nan), np.full(shape, np.nan)
    for k, (a, b, x, sk, tk) in enumerate(pieces):
        c = exact_table.barycentric_matrix(x, exact_table.scale_nodes(a, b, NODES))
        lo[k], hi[k] = a, b
        s[k], t[k] = np.tensordot(c, sk, axes=1), np.tensordot(c, tk, axes=1)
    used = slice(0, len(pieces))
    interp, interp_t = exact_table.interpolant_exact(s[used]), exact_table.interpolant_exact(t[used])
    return ScaleTable(
        jnp.asarray(lo), jnp.asarray(hi), jnp.asarray(s), jnp.asarray(t), interp=interp, interp_t=interp_t
    )


def for_point(sigma_a: float, n: float) -> ScaleTable | None:
    """The table a point of logit scale ``sigma_a`` and ``n`` tokens reads at every scale up
    to ``sigma_a`` (the grid sizes of :func:`.exact_table.point_kernel`), or None where that
    point integrates on its scale's own grid (above :data:`.exact_table.POINT_CAP`, or a
    cap whose grid is over the cost bound)."""
    sa, n = float(sigma_a), float(n)
    if sa > exact_table.POINT_CAP:
        return None
    cap = exact_table.point_cap(sa)
    try:
        n_a, n_z = exact.sizes(sigma_max=cap, n_max=n)
    except ValueError:
        return None
    lo, hi = exact_table.point_range(sa, cap)
    return build(n, n_a, n_z, cap, exact_table.point_ranges(cap).index((lo, hi)) + 1)
