"""The points of a sweep (:class:`Grid`): named axes flattened in C order, cut into chunks, each
chunk padded to its evaluator's width, and the results labelled as an ``xarray.Dataset``.
One definition for every sweep: the theory's (the layers evaluator and a preset's closed-form
engine) and the simulator's.

    g = Grid({"sigma": s, "alpha": a}, outer=("n_tokens", "depth"))
    chunks = g.chunks(1024, multiple=n_devices)
    for c in range(chunks.count):
        idx = chunks.index(c)            # the chunk's flat points, padded by wrapping
        values = g.values(idx)           # {axis: values at those points}
    ds = g.dataset(results, {"angle_rate": attrs, ...}, attrs={...})

``outer`` axes are those a compiled program holds fixed (a token count, a depth): a chunk
never mixes two of their values. The points are flattened with the outer axes first (so a
chunk's points are contiguous); the dataset's dimensions keep the order the axes were given
in (:attr:`Grid.dims`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class Chunks:
    """A grid's points cut into chunks of ``size`` points; each outer slab (one value of every
    outer axis) holds ``per_slab`` chunks, the last of each padded by wrapping within it."""

    size: int
    per_slab: int
    slab_points: int
    slabs: int

    @property
    def count(self) -> int:
        return self.slabs * self.per_slab

    def slab(self, c: int) -> int:
        """The flat index of chunk ``c``'s slab (C order over the outer axes)."""
        return c // self.per_slab

    def span(self, c: int) -> tuple[int, int]:
        """The flat positions ``[lo, hi)`` of the results chunk ``c`` fills."""
        s, off = divmod(c, self.per_slab)
        lo = s * self.slab_points + off * self.size
        return lo, s * self.slab_points + min((off + 1) * self.size, self.slab_points)

    def index(self, c: int, width: int | None = None) -> np.ndarray:
        """Chunk ``c``'s flat point indices within its slab, ``width`` of them (default the chunk
        size): past the slab's end they wrap to its start (the padding of the last chunk)."""
        s, off = divmod(c, self.per_slab)
        n = self.size if width is None else int(width)
        return np.arange(off * self.size, off * self.size + n) % self.slab_points


class Grid:
    """Named axes (1-D values) and scalars. ``axes`` keeps the flat order (``outer`` ones
    first, then the others, each in the order given); ``dims`` the order given."""

    def __init__(self, axes: dict, scalars: dict | None = None, outer=()):
        axes = {k: np.asarray(v) for k, v in axes.items()}
        self.dims = tuple(axes)
        self.outer = tuple(k for k in axes if k in outer)
        self.inner = tuple(k for k in axes if k not in outer)
        self.axes = {k: axes[k] for k in self.outer + self.inner}
        self.scalars = dict(scalars or {})
        for k, v in self.axes.items():
            if v.ndim != 1 or v.size == 0:
                raise ValueError(f"axis {k} must be a non-empty list of values")

    @property
    def shape(self) -> tuple:
        return tuple(v.size for v in self.axes.values())

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def slab_shape(self) -> tuple:
        """The shape of the inner axes (the points of one outer slab)."""
        return tuple(self.axes[k].size for k in self.inner)

    def chunks(self, size: int, multiple: int = 1) -> Chunks:
        """Chunks of at most ``size`` points (at most a slab's), rounded up to a multiple of
        ``multiple`` (whole points per device)."""
        npts = math.prod(self.slab_shape)
        size = -(-min(int(size), npts) // multiple) * multiple
        return Chunks(size, -(-npts // size), npts, self.size // npts)

    def outer_values(self, slab: int) -> dict:
        """The outer axes' values of slab ``slab``."""
        idx = np.unravel_index(slab, tuple(self.axes[k].size for k in self.outer)) if self.outer else ()
        return {k: self.axes[k][i] for k, i in zip(self.outer, idx)}

    def values(self, index, inner: bool = False) -> dict:
        """``{axis: values}`` at the flat point indices ``index`` (of the whole grid; with
        ``inner``, of one slab: its inner axes only), and each scalar broadcast to them."""
        index = np.asarray(index)
        names = self.inner if inner else tuple(self.axes)
        shape = tuple(self.axes[k].size for k in names)
        idx = np.unravel_index(index, shape) if shape else ()
        out = {k: self.axes[k][i] for k, i in zip(names, idx)}
        out.update({k: np.full(index.shape, v) for k, v in self.scalars.items()})
        return out

    def indices(self, index, axis: str) -> np.ndarray:
        """The position along ``axis`` of the flat point indices ``index`` (of the whole grid)."""
        idx = np.unravel_index(np.asarray(index), self.shape)
        return idx[list(self.axes).index(axis)]

    def dataset(
        self,
        results: dict,
        variables: dict,
        attrs: dict | None = None,
        coords: dict | None = None,
        trailing: dict | None = None,
    ):
        """``xarray.Dataset`` of the flat ``results`` ({name: [size]}) of ``variables``
        ({name: its attributes}) over the grid's dimensions (:attr:`dims`), the scalars as
        scalar coordinates (``coords``: others to add). ``trailing``: name -> the names of
        its trailing dimensions (its result ``[size, *shape]``: a value per position),
        after the grid's."""
        import xarray as xr

        trailing = dict(trailing or {})
        order = [list(self.axes).index(k) for k in self.dims]

        def labelled(v):
            v = np.asarray(v)
            extra = v.shape[1:]
            axes = order + [len(order) + i for i in range(len(extra))]
            return np.ascontiguousarray(np.transpose(v.reshape(self.shape + extra), axes))

        data = {
            k: (self.dims + tuple(trailing.get(k, ())), labelled(results[k]), dict(a)) for k, a in variables.items()
        }
        cs = {k: (k, self.axes[k]) for k in self.dims}
        cs.update({k: float(v) for k, v in self.scalars.items()})
        cs.update(coords or {})
        return xr.Dataset(data, coords=cs, attrs=dict(attrs or {}))
