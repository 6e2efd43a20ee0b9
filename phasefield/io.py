"""Files: every output appears atomically (complete or not at all) and honours the umask.

    with atomic_path("out.nc") as tmp:      # write tmp; moved onto out.nc only on success
        ds.to_netcdf(tmp, engine="h5netcdf")

:func:`write_netcdf`, :func:`write_netcdf_groups`, :func:`write_npz`, :func:`write_json` are
the common cases; :func:`read_netcdf` / :func:`read_netcdf_groups` read them back.

* The temporary file is ``.<name>.<host>-<pid>.<random>.part<ext>``; a kill leaves it
  behind, so every :func:`atomic_path` first removes the stale ones of the same target
  (their process is gone on this host, or they are older than a day).
* :func:`check_output` checks an output path before any work starts (empty, a directory,
  an unwritable or read-only place, ``/proc``, too little free space): one-line
  ``ValueError``.
* JSON from a user (block, fit and results files) is read by :func:`read_json` /
  :func:`loads_json`: a size and a nesting limit, each a one-line ``ValueError``.
* JSON is RFC 8259: no bare NaN/Infinity. :func:`finite` turns NaN and ±inf into ``null``
  (None) and NumPy values into plain ones; :func:`dumps` and :func:`write_json` use it
  with ``allow_nan=False``.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import socket
import tempfile
import time
from contextlib import contextmanager

import numpy as np

ENGINE = "h5netcdf"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


STALE_PART_SECONDS = 24 * 3600
_PART_RE = re.compile(r"^\.(?P<name>.+)\.(?P<host>[^.]*)-(?P<pid>\d+)\.[^.]+\.part(\.[^.]*)?$")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:40]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def clean_stale_parts(path) -> list:
    """Remove the temporary files a killed writer of ``path`` left behind: those of a
    process no longer alive on this host, or older than :data:`STALE_PART_SECONDS`.
    Returns the removed paths."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    removed = []
    try:
        names = os.listdir(d)
    except OSError:
        return removed
    host, now = _host(), time.time()
    for n in names:
        m = _PART_RE.match(n)
        if not m or m.group("name") != base:
            continue
        full = os.path.join(d, n)
        try:
            stale = (m.group("host") == host and not _alive(int(m.group("pid")))) or now - os.path.getmtime(
                full
            ) > STALE_PART_SECONDS
            if stale:
                os.remove(full)
                removed.append(full)
        except OSError:
            continue
    return removed


@contextmanager
def atomic_path(path):
    """Yield a temporary path next to ``path`` (same extension, so writers that go by the
    extension work); on success give it the permissions a new file gets (0666 minus the
    umask, not mkstemp's 0600) and move it onto ``path``; on failure remove it. Stale
    temporary files of earlier, killed writers of ``path`` are removed first."""
    path = os.fspath(path)
    if not path:
        raise ValueError("the output path is empty")
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "is a directory", path)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    clean_stale_parts(path)
    ext = os.path.splitext(path)[1]
    fd, tmp = tempfile.mkstemp(
        prefix=f".{os.path.basename(path)}.{_host()}-{os.getpid()}.", suffix=".part" + ext, dir=d
    )
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _netcdf_attrs(ds):
    """A copy of ``ds`` whose attributes netCDF can store (bool -> int, None -> '',
    dict -> JSON)."""
    ds = ds.copy()
    for obj in [ds] + [ds[v] for v in ds.variables]:
        for k, v in list(obj.attrs.items()):
            if isinstance(v, bool):
                obj.attrs[k] = int(v)
            elif v is None:
                obj.attrs[k] = ""
            elif isinstance(v, dict):
                obj.attrs[k] = json.dumps(v)
    return ds


def write_netcdf(ds, path) -> None:
    """One dataset -> netCDF (h5netcdf), atomically."""
    with atomic_path(path) as tmp:
        _netcdf_attrs(ds).to_netcdf(tmp, engine=ENGINE)


def write_netcdf_groups(groups: dict, path) -> None:
    """``{name: Dataset}`` -> the groups of one netCDF file, atomically."""
    import xarray as xr

    tree = xr.DataTree.from_dict({f"/{k}": _netcdf_attrs(v) for k, v in groups.items()})
    with atomic_path(path) as tmp:
        tree.to_netcdf(tmp, engine=ENGINE)


def read_netcdf(path):
    """A netCDF file as an in-memory ``xarray.Dataset`` (the file is closed)."""
    import xarray as xr

    with xr.open_dataset(path, engine=ENGINE) as ds:
        return ds.load()


def write_npz(path, arrays: dict) -> None:
    """``{name: array}`` -> ``.npz``, atomically."""
    with atomic_path(path) as tmp:
        np.savez(tmp, **arrays)


def finite(obj):
    """A copy of ``obj`` that JSON can hold as RFC 8259: NaN and ±inf become None (null),
    NumPy/JAX scalars and arrays plain numbers and lists, tuples lists."""
    if isinstance(obj, dict):
        return {str(k) if not isinstance(k, str) else k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, np.ndarray) or hasattr(obj, "__array__"):
        a = np.asarray(obj)
        return finite(a.item() if a.ndim == 0 else a.tolist())
    return obj


def dumps(obj, **kw) -> str:
    """``json.dumps`` of :func:`finite` ``(obj)``, ``allow_nan=False`` (valid RFC 8259)."""
    return json.dumps(finite(obj), allow_nan=False, default=json_default, **kw)


def check_output(path, flag: str = "--out", kind: str = "file", need_bytes: int = 0) -> None:
    """Check an output path before any work: a non-empty path, not a directory (``kind``
    'file') or not a file (``kind`` 'dir'), a place this process can create files in and
    with ``need_bytes`` (plus 16 MiB) free. One-line ``ValueError`` otherwise. Nothing is
    left behind (a probe file is created and removed in the nearest existing folder)."""
    path = os.fspath(path) if path is not None else ""
    if not str(path).strip():
        raise ValueError(f"{flag} is empty: give a file name" if kind == "file" else f"{flag} is empty")
    if "\0" in path:
        raise ValueError(f"{flag} contains a NUL character")
    if kind == "file" and os.path.isdir(path):
        raise ValueError(f"{flag} {path} is a directory, not a file")
    if kind == "dir" and os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{flag} {path} exists and is not a directory")
    target = os.path.abspath(path) if kind == "dir" else os.path.dirname(os.path.abspath(path))
    d = target
    while not os.path.isdir(d):
        parent = os.path.dirname(d)
        if os.path.exists(d) or parent == d:  # a file in the way
            raise ValueError(f"{flag} {path}: {d} is not a directory")
        d = parent
    if os.path.realpath(d).startswith(("/proc", "/sys")):
        raise ValueError(
            f"{flag} {path}: cannot write files under {os.path.realpath(d).split(os.sep)[1] and '/' + os.path.realpath(d).split(os.sep)[1]}"
        )
    try:
        fd, probe = tempfile.mkstemp(prefix=".phasefield-probe.", dir=d)
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot write in {d} ({exc.strerror or exc})") from None
    free = shutil.disk_usage(d).free
    need = int(need_bytes) + (16 << 20)
    if free < need:
        raise ValueError(f"{flag} {path}: not enough free space in {d} ({_fmt(free)} free, about {_fmt(need)} needed)")


def _fmt(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def remove_empty_dirs(folder) -> None:
    """Remove ``folder`` and its subfolders if they hold no files (bottom up)."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        return
    for root, _dirs, _files in os.walk(folder, topdown=False):
        try:
            os.rmdir(root)
        except OSError:
            pass


class StoreLocked(ValueError):
    """Another process is writing the same store (one-line message); also
    ``phasefield.grid.StoreLocked``."""


@contextmanager
def dir_lock(folder, name: str = ".lock"):
    """Hold an exclusive, non-blocking lock on ``folder/<name>`` (``fcntl.flock``) while the
    block runs; a second holder gets :class:`StoreLocked` at once (it does not
    wait). The folder is created if needed; if it was, and the block fails, it is removed
    again when nothing but empty folders is left in it."""
    import fcntl

    folder = os.fspath(folder)
    created = not os.path.exists(folder)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        owner = os.read(fd, 64).decode(errors="replace").strip()
        os.close(fd)
        raise StoreLocked(
            f"another phasefield process{' (' + owner + ')' if owner else ''} is writing "
            f"{folder}; wait for it to finish or choose another --out"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
    ok = False
    try:
        yield folder
        ok = True
    finally:
        if not ok and created:
            try:
                os.remove(path)
            except OSError:
                pass
            remove_empty_dirs(folder)
        os.close(fd)


def json_default(o):
    """``json.dumps(default=...)`` for NumPy/JAX scalars and arrays."""
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    try:
        return float(o)
    except Exception:
        return str(o)


def write_json(path, obj, indent=1) -> None:
    """``obj`` -> JSON file, atomically."""
    text = dumps(obj, indent=indent)
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(text)


# JSON read from a user (block, fit and results files; --set values): at most this many bytes
# (a fit file is under 1 MiB) and this many levels of nesting (a fit file has 6); beyond
# either, one-line ValueError instead of exhausting memory or Python's recursion limit
JSON_MAX_BYTES = 256 << 20
JSON_MAX_DEPTH = 100
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def json_depth(text: str, limit: int | None = None) -> int:
    """The deepest nesting of ``[`` and ``{`` in JSON ``text`` (brackets inside strings do
    not count); with ``limit``, the scan ends once past it and returns a level beyond it."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)).encode("ascii")
    deepest, level, chunk = 0, 0, 1 << 20
    for start in range(0, len(brackets), chunk):
        b = np.frombuffer(brackets, np.uint8, min(chunk, len(brackets) - start), start)
        run = level + np.cumsum(np.where((b == ord("[")) | (b == ord("{")), 1, -1), dtype=np.int64)
        deepest, level = max(deepest, int(run.max())), int(run[-1])
        if limit is not None and deepest > limit:
            break
    return deepest


def loads_json(text, what: str = "JSON", max_bytes: int | None = None, max_depth: int | None = None):
    """``json.loads`` for text from a user: ValueError (one line, naming ``what``) when it is
    longer than ``max_bytes`` or nested deeper than ``max_depth`` (default
    :data:`JSON_MAX_BYTES`, :data:`JSON_MAX_DEPTH`); malformed JSON raises
    ``json.JSONDecodeError`` (a ValueError) as ``json.loads`` does."""
    max_bytes = JSON_MAX_BYTES if max_bytes is None else max_bytes
    max_depth = JSON_MAX_DEPTH if max_depth is None else max_depth
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")
    if len(text) > max_bytes:
        raise ValueError(f"{what} is too large ({len(text):,} characters; the limit is {max_bytes:,})")
    if json_depth(text, max_depth) > max_depth:
        raise ValueError(f"{what} is nested more than {max_depth} levels deep")
    return json.loads(text)


def read_json(path, what: str | None = None, max_bytes: int | None = None, max_depth: int | None = None):
    """A JSON file, read through :func:`loads_json` (``what`` names it in the message; default
    its path): a file larger than ``max_bytes`` is refused before it is read. ``OSError`` and
    ``UnicodeDecodeError`` as ``open``/``read`` raise them."""
    what = what or str(path)
    max_bytes = JSON_MAX_BYTES if max_bytes is None else max_bytes
    with open(path, encoding="utf-8") as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise ValueError(f"{what} is too large ({size:,} bytes; the limit is {max_bytes:,})")
        text = f.read(max_bytes + 1)
    return loads_json(text, what, max_bytes, max_depth)


def append_jsonl(path, record) -> None:
    """Append one record as a JSON line (``json.dumps``: NaN stays NaN, as :func:`read_jsonl`
    reads it): a kill in mid-write leaves at most a torn last line, which the reader skips."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def read_jsonl(path) -> list:
    """The complete records of a JSON-lines file ([] if it does not exist): a torn line,
    left by a kill in mid-write, is skipped."""
    records = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    records.append(loads_json(line, f"a line of {path}"))
                except json.JSONDecodeError:
                    continue
    return records
