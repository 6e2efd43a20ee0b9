"""A sweep's finished chunks on disk and its output file.

* :func:`open_store`: the chunk folder (:class:`phasefield.grid.ChunkStore`: a checksum per
  chunk, a lock against a second writer, another sweep's folder refused);
* :func:`resume`: the stored chunks into the flat results, the chunks still to compute
  returned (an interrupted sweep recomputes only those);
* :func:`assemble`: every chunk, once the other processes of a multi-host sweep stored theirs;
* :func:`write`: the finished dataset to its netCDF file atomically, then the folder removed.

A chunk fills the positions ``places(span(c))`` of the flat results: ``span(c)`` is a range
``(lo, hi)`` or the flat indices themselves (chunks of points that are not contiguous). A
variable's result is ``[total]`` or, with a trailing shape (``shapes``: a value per position
of a causal stack), ``[total, *shape]``; a chunk's values of it ``[points, *shape]``.
"""

from __future__ import annotations

import time

import numpy as np

from .. import grid, io


def open_store(folder, spec: dict, log=None, process_index: int = 0) -> grid.ChunkStore:
    """The chunk store of the sweep ``spec`` in ``folder`` (created, or reopened to resume),
    locked by this process until it is closed."""
    return grid.ChunkStore(folder, spec, log=log, process_index=process_index)


def places(span) -> np.ndarray:
    """The flat result indices of a chunk: ``span`` is ``(lo, hi)`` or the indices."""
    if isinstance(span, tuple) and len(span) == 2 and all(np.ndim(v) == 0 for v in span):
        return np.arange(int(span[0]), int(span[1]))
    return np.asarray(span, np.int64).reshape(-1)


def fill(results: dict, where: np.ndarray, vals: dict, variables) -> None:
    """A chunk's values (their first ``len(where)`` points; a chunk may be padded) into the
    flat results (each variable's trailing shape that of its result)."""
    for k in variables:
        trailing = results[k].shape[1:]
        results[k][where] = np.asarray(vals[k], np.float64).reshape((-1, *trailing))[: where.size]


def resume(store, n_chunks: int, span, results: dict, variables, mine) -> list:
    """The stored chunks filled into ``results``; returns the chunks ``c`` not stored for
    which ``mine(c)`` (this process's share)."""
    todo = []
    for c in range(n_chunks):
        if store is not None and store.has(c):
            fill(results, places(span(c)), store.load(c), variables)
        elif mine(c):
            todo.append(c)
    return todo


def assemble(store, n_chunks: int, span, results: dict, variables, wait: float, label: str) -> None:
    """Waits (up to ``wait`` seconds) until every chunk is stored, then fills them all into
    ``results``."""
    deadline = time.monotonic() + wait
    while store.missing(n_chunks):
        if time.monotonic() > deadline:
            raise ValueError(
                f"{len(store.missing(n_chunks))} chunks of {label} still missing after "
                f"{wait:.0f} s; rerun on process 0 once the other processes finish"
            )
        time.sleep(0.2)
    for c in range(n_chunks):
        fill(results, places(span(c)), store.load(c), variables)


def write(ds, out, store) -> None:
    """``ds`` to the netCDF file ``out`` (atomically: the file appears whole or not at all),
    then the chunk store removed."""
    io.write_netcdf(ds, out)
    if store is not None:
        store.remove()
