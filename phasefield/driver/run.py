"""The chunk loop of a sweep (:class:`Driver`): resume, this process's share of the chunks,
progress, the store kept on an interruption, the multi-host assembly."""

from __future__ import annotations

import os

import numpy as np

from . import store as st

WAIT = 24 * 3600.0


class Driver:
    """One sweep's chunk store and its chunk loop; a context manager that releases the
    store's lock on the way out (the chunks stay unless :meth:`write` removed them).

    ``out``: the sweep's netCDF file (None: the caller keeps the dataset). ``store``: the
    chunk folder (default ``<out>.chunks``; None with ``out`` None: no store, nothing kept).
    ``spec``: what the sweep computes (JSON-able); a folder of another sweep is refused."""

    def __init__(self, out, spec: dict, log=None, store=None):
        import jax

        self.out = None if out is None else os.fspath(out)
        self.pid, self.pcount = jax.process_index(), jax.process_count()
        folder = os.fspath(store) if store is not None else None if out is None else self.out + ".chunks"
        if self.pcount > 1 and folder is None:
            raise ValueError("a multi-host sweep needs out= on a filesystem shared by the hosts")
        self.folder = folder
        self.store = None if folder is None else st.open_store(folder, spec, log=log, process_index=self.pid)

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
        unit: str = "chunk",
        shapes: dict | None = None,
    ):
        """Flat float64 results ``{variable: [total]}`` (None on a multi-host process other
        than 0, once its chunks are stored).

        ``evaluate(c)``: chunk ``c``'s values ``{variable: array}``, of which the first
        ``len(places)`` are kept; ``span(c)``: the flat positions it fills, ``(lo, hi)`` or
        an index array (:func:`phasefield.driver.store.places`). Chunks already stored are
        read back; of the rest this process computes ``c % process_count == process_index``,
        each stored as soon as it is done (an interruption, Ctrl-C included, loses at most
        the chunk in flight: a chunk file is written atomically). ``unit``: the progress
        bar counts chunks (``"chunk"``) or points (any other unit's name). ``shapes``:
        variable -> the trailing shape of its values at a point (default: one number), its
        result then ``[total, *shape]``."""
        from tqdm.auto import tqdm

        variables = tuple(variables)
        shapes = dict(shapes or {})
        results = {k: np.full((total, *shapes.get(k, ())), np.nan) for k in variables}
        todo = st.resume(self.store, n_chunks, span, results, variables, lambda c: c % self.pcount == self.pid)
        by_points = unit != "chunk"
        size = sum(st.places(span(c)).size for c in todo) if by_points else len(todo)
        bar = tqdm(total=size, desc=desc, unit=unit, disable=not progress, leave=False)
        try:
            for c in todo:
                where = st.places(span(c))
                out = evaluate(c)
                vals = {
                    k: np.asarray(out[k], np.float64).reshape((-1, *shapes.get(k, ())))[: where.size] for k in variables
                }
                st.fill(results, where, vals, variables)
                if self.store is not None:
                    self.store.save(c, vals)
                bar.update(where.size if by_points else 1)
        finally:
            bar.close()
        if self.pcount > 1:
            if self.pid != 0:
                return None  # process 0 assembles
            st.assemble(self.store, n_chunks, span, results, variables, wait, self.out or self.folder)
        return results

    def write(self, ds) -> None:
        """The finished dataset to ``out`` (atomically), then the chunk store removed; with
        no ``out``, nothing (the store stays for its caller)."""
        if self.out is None:
            return
        st.write(ds, self.out, self.store)
