"""The chunk driver of every theory sweep (the paper block's closed form and the layers
evaluator of any other block run through it).

    with chunks.Driver(out, spec) as drv:
        results = drv.run(evaluate, n_chunks, span, total, variables, progress=True)
        if results is None:          # a multi-host process other than 0: its chunks are stored
            return None
        ds = ...                     # the caller labels ``results`` (flat float64 arrays)
        drv.write(ds)                # atomic netCDF write, then the chunk store is removed

* ``out`` given: every finished chunk goes to ``<out>.chunks/`` at once
  (:class:`phasefield.grid.ChunkStore`: integrity checks, resume, a lock against a second
  writer), and the netCDF file appears, atomically, only when the grid is complete;
  an exception leaves the chunks for a rerun;
* multi-host: after ``jax.distributed.initialize()`` each process computes the chunks
  ``c % process_count == process_index``; process 0 waits (up to ``wait`` seconds) for every
  chunk and assembles; the others get None from :meth:`Driver.run`;
* ``progress``: a tqdm bar over the chunks this process computes;
* :func:`shard`: a chunk's per-point arrays with their leading axis split over devices.

The caller checks the grid's size first (:func:`phasefield.grid.check_grid`) and pads each
chunk to its evaluator's width; ``span(c)`` says which points of the flat result chunk ``c``
fills, ``evaluate(c)`` returns its values (the first ``hi - lo`` of each array are kept).
"""

from __future__ import annotations

import os
import time

import numpy as np

from . import grid, io

WAIT = 24 * 3600.0


def shard(tree, devices):
    """``tree`` (arrays with a leading points axis, its length a multiple of the device
    count) placed with that axis split over ``devices``; unchanged for one device."""
    import jax

    devices = list(devices)
    if len(devices) < 2:
        return tree
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    return jax.device_put(tree, NamedSharding(Mesh(np.array(devices), ("points",)), P("points")))


class Driver:
    """One sweep's chunk store (``out`` None: no store) and its chunk loop; a context
    manager that releases the store's lock on the way out (the chunks stay unless written)."""

    def __init__(self, out, spec: dict, log=None):
        import jax

        self.out = None if out is None else os.fspath(out)
        self.pid, self.pcount = jax.process_index(), jax.process_count()
        if self.pcount > 1 and out is None:
            raise ValueError("a multi-host sweep needs out= on a filesystem shared by the hosts")
        self.store = None
        if out is not None:
            self.store = grid.ChunkStore(self.out + ".chunks", spec, log=log, process_index=self.pid)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    def run(
        self,
        evaluate,
        n_chunks: int,
        span,
        total: int,
        variables,
        progress: bool = False,
        desc: str = "sweep",
        wait: float = WAIT,
    ):
        """Flat float64 results ``{variable: [total]}`` (None on a multi-host process other
        than 0, once its chunks are stored)."""
        from tqdm.auto import tqdm

        store = self.store
        results = {k: np.full(total, np.nan) for k in variables}
        todo = []
        for c in range(n_chunks):
            if store is not None and store.has(c):
                _fill(results, span(c)[0], store.load(c), variables)
            elif c % self.pcount == self.pid:
                todo.append(c)
        bar = tqdm(todo, desc=desc, unit="chunk", disable=not progress, leave=False)
        for c in bar:
            lo, hi = span(c)
            vals = {k: np.asarray(v, np.float64)[: hi - lo] for k, v in evaluate(c).items()}
            vals = {k: vals[k] for k in variables}
            for k in variables:
                results[k][lo:hi] = vals[k]
            if store is not None:
                store.save(c, vals)
        bar.close()
        if self.pcount > 1:
            if self.pid != 0:
                return None  # process 0 assembles
            deadline = time.monotonic() + wait
            while store.missing(n_chunks):
                if time.monotonic() > deadline:
                    raise ValueError(
                        f"{len(store.missing(n_chunks))} chunks of {self.out} still missing after "
                        f"{wait:.0f} s; rerun on process 0 once the other processes finish"
                    )
                time.sleep(0.2)
            for c in range(n_chunks):
                _fill(results, span(c)[0], store.load(c), variables)
        return results

    def write(self, ds) -> None:
        """The finished dataset to ``out`` (atomically), then the chunk store removed."""
        if self.out is None:
            return
        io.write_netcdf(ds, self.out)
        self.store.remove()


def _fill(results, lo, vals, variables):
    for k in variables:
        results[k][lo : lo + vals[k].size] = vals[k]
