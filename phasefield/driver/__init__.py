"""The chunk driver of every sweep: the theory sweeps (the paper block's closed form,
:mod:`phasefield.diagram`, and the layers evaluator of any block, :mod:`phasefield.layers.sweep`)
and the finite-width simulation sweeps (:mod:`phasefield.simulate.sweep`).

    points = driver.Grid(axes, scalars, outer=("n_tokens",))   # the grid's points
    chunks = points.chunks(size, multiple=len(devices))
    with driver.Driver(out, spec) as drv:
        results = drv.run(evaluate, chunks.count, chunks.span, points.size, variables, progress=True)
        if results is None:          # a multi-host process other than 0: its chunks are stored
            return None
        ds = points.dataset(results, {name: attrs, ...})   # labelled
        drv.write(ds)                # atomic netCDF write, then the chunk store is removed

* :mod:`~phasefield.driver.store`: with ``out`` (or a ``store`` folder) every finished chunk
  goes to ``<out>.chunks/`` at once (:class:`phasefield.grid.ChunkStore`: integrity checks,
  resume, a lock against a second writer), and the netCDF file appears, atomically, only
  when the grid is complete; an exception or Ctrl-C leaves the chunks for a rerun;
* :mod:`~phasefield.driver.run`: :class:`Driver`, the loop: the stored chunks read back,
  multi-host (after ``jax.distributed.initialize()`` each process computes the chunks
  ``c % process_count == process_index``; process 0 waits, up to ``wait`` seconds, for every
  chunk and assembles; the others get None from :meth:`Driver.run`), a tqdm bar;
* :mod:`~phasefield.driver.grid`: the grid's points (:class:`Grid`): flattening, chunk sizing,
  the padding of the last chunk of each slab, the points' values and the labelled dataset;
* :mod:`~phasefield.driver.shard`: a chunk's points over devices, the one placement of every
  sweep, simulation and training chunk (:func:`shard` places the per-point arrays,
  :func:`over_points` compiles the chunk function for that placement, :func:`pad_to_devices`
  fills a batch to whole points per device, :func:`replicate` places shared data on each).

The caller checks the grid's size first (:func:`phasefield.grid.check_grid`) and builds its
:class:`Grid`; ``Grid.chunks`` gives each chunk's ``span`` (the points of the flat result it
fills) and its ``index`` padded to the evaluator's width; ``evaluate(c)`` returns its values.
"""

from .grid import Chunks, Grid
from .run import WAIT, Driver
from .shard import over_points, pad_to_devices, place_like, replicate, shard

__all__ = ["WAIT", "Chunks", "Driver", "Grid", "over_points", "pad_to_devices", "place_like", "replicate", "shard"]
