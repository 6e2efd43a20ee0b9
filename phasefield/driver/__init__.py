"""The chunk driver of every sweep: the theory sweeps (the paper block's closed form,
:mod:`phasefield.diagram`, and the layers evaluator of any block, :mod:`phasefield.layers.sweep`)
and the finite-width simulation sweeps (:mod:`phasefield.simulate.sweep`).

    with driver.Driver(out, spec) as drv:
        results = drv.run(evaluate, n_chunks, span, total, variables, progress=True)
        if results is None:          # a multi-host process other than 0: its chunks are stored
            return None
        ds = ...                     # the caller labels ``results`` (flat float64 arrays)
        drv.write(ds)                # atomic netCDF write, then the chunk store is removed

* :mod:`~phasefield.driver.store`: with ``out`` (or a ``store`` folder) every finished chunk
  goes to ``<out>.chunks/`` at once (:class:`phasefield.grid.ChunkStore`: integrity checks,
  resume, a lock against a second writer), and the netCDF file appears, atomically, only
  when the grid is complete; an exception or Ctrl-C leaves the chunks for a rerun;
* :mod:`~phasefield.driver.run`: :class:`Driver`, the loop: the stored chunks read back,
  multi-host (after ``jax.distributed.initialize()`` each process computes the chunks
  ``c % process_count == process_index``; process 0 waits, up to ``wait`` seconds, for every
  chunk and assembles; the others get None from :meth:`Driver.run`), a tqdm bar;
* :mod:`~phasefield.driver.shard`: a chunk's points over devices (:func:`shard` places the
  per-point arrays, :func:`over_points` compiles the chunk function for that placement).

The caller checks the grid's size first (:func:`phasefield.grid.check_grid`) and pads each
chunk to its evaluator's width; ``span(c)`` says which points of the flat result chunk ``c``
fills, ``evaluate(c)`` returns its values.
"""

from .run import WAIT, Driver
from .shard import over_points, shard

__all__ = ["WAIT", "Driver", "over_points", "shard"]
