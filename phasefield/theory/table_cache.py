"""Computed tables kept on disk: computed once per machine, read by every later process.

A table that depends on a few numbers (the exact-softmax tables of one token count n) costs
seconds to compute and a fraction of a millisecond to read. The package ships those of the
common token counts (:func:`phasefield.theory.attention.exact_table.shipped_pieces`, read
first); this folder holds the others. :func:`cached` reads it from a
file named by a hash of its key, or computes it and writes the file for the next process.

Where: ``PHASEFIELD_TABLES`` (a folder; ``off``, ``0``, ``none`` or empty: no disk cache),
else ``$XDG_CACHE_HOME/phasefield/tables``, else ``~/.cache/phasefield/tables``. Deleting
the folder clears it. The folder is made on the first write; importing phasefield writes
nothing.

The key holds everything the values depend on: the caller's numbers and sizes, the table
format (:data:`FORMAT`), the package version, a hash of the source files that compute the
tables, and JAX's version and backend. The file stores its key, and a file whose key differs
(another version, a hash collision), that cannot be read (truncated, corrupt) or whose
arrays are not finite float64 is ignored, computed again and replaced: never an error,
never another table's values. Writes go to a temporary file in the same folder, then
``os.replace``: two processes writing the same table at once each replace it whole (with the
same values), and a reader never sees half a file. A folder that cannot be written (a
read-only home) only means computing again next time.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

FORMAT = 1  # the file layout (a ``key`` string array beside the tables' float64 arrays)
OFF = ("", "off", "0", "none")


def folder() -> Path | None:
    """The tables' folder (not made here), or None when ``PHASEFIELD_TABLES`` turns it off."""
    asked = os.environ.get("PHASEFIELD_TABLES")
    if asked is not None:
        return None if asked.strip().lower() in OFF else Path(asked).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "phasefield" / "tables"


@functools.cache
def source_hash(*modules: str) -> str:
    """SHA-256 of the source files of ``modules`` (dotted names under phasefield, read as
    bytes; a file that cannot be read counts as its name only)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for name in modules:
        path = root.joinpath(*name.split(".")[1:]).with_suffix(".py")
        h.update(name.encode())
        try:
            h.update(path.read_bytes())
        except OSError:
            pass
    return h.hexdigest()


def full_key(kind: str, key: dict, sources: Iterable[str]) -> dict:
    """``key`` with what every table depends on: its kind, the file format, the package's
    version, the hash of ``sources``, JAX's version and default backend."""
    import jax

    return dict(
        kind=kind,
        **key,
        format=FORMAT,
        phasefield=getattr(sys.modules.get("phasefield"), "__version__", None),  # the root, already loaded
        source=source_hash(*sources),
        jax=jax.__version__,
        backend=jax.default_backend(),
    )


def path_for(kind: str, key: dict) -> Path | None:
    """The file of the table of ``key`` (a :func:`full_key`), or None when off."""
    base = folder()
    if base is None:
        return None
    digest = hashlib.sha256(_text(key).encode()).hexdigest()[:24]
    return base / f"{kind}-{digest}.npz"


def _text(key: dict) -> str:
    return json.dumps(key, sort_keys=True, default=repr)


def load(path: Path, key: dict) -> dict | None:
    """The arrays stored at ``path`` for ``key``, or None (no file, unreadable, another key,
    an array not finite float64)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if "key" not in z.files or str(z["key"]) != _text(key):
                return None
            out = {name: z[name] for name in z.files if name != "key"}
    except Exception:  # noqa: BLE001 - any unreadable file is a miss: compute again
        return None
    for v in out.values():
        if v.dtype != np.float64 or not np.all(np.isfinite(v)):
            return None
    return out


def save(path: Path, key: dict, arrays: dict) -> bool:
    """Write ``arrays`` (float64) with ``key`` to ``path`` atomically (a temporary file in its
    folder, then ``os.replace``). Returns whether it was written; never raises for a folder
    that cannot be made or written."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, key=np.asarray(_text(key)), **{k: np.asarray(v, np.float64) for k, v in arrays.items()})
        os.replace(tmp, path)
        return True
    except OSError:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False


def _accepts(check, arrays) -> bool:
    try:
        return bool(check(arrays))
    except Exception:  # noqa: BLE001 - a file the check cannot read is a miss
        return False


def cached(
    kind: str,
    key: dict,
    sources: Iterable[str],
    compute: Callable[[], dict],
    check: Callable[[dict], bool] | None = None,
) -> dict:
    """The float64 arrays ``compute()`` returns for ``key``, read from the tables' folder
    when a process already wrote them there (and ``check`` accepts them), else computed and
    written (:func:`full_key` names what the key holds besides ``key``). Non-finite results
    are returned, not stored."""
    key = full_key(kind, key, sources)
    path = path_for(kind, key)
    if path is not None:
        got = load(path, key)
        if got is not None and (check is None or _accepts(check, got)):
            return got
    out = {k: np.asarray(v, np.float64) for k, v in compute().items()}
    if path is not None and all(np.all(np.isfinite(v)) for v in out.values()):
        save(path, key, out)
    return out
