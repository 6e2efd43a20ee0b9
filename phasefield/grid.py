"""Grids of hyperparameter points: axes, the branch-weight rule, validation, the chunk store.

Used by the theory sweep (:mod:`phasefield.diagram`), the simulator sweep
(:mod:`phasefield.simulate.sweep`), the figures and the CLI.

* Axes: :func:`parse_axis` reads ``start:stop:count``, ``a,b,c`` or a number; axis names
  are :data:`AXES` (``alpha`` ties alpha_A = alpha_M). Swept hyperparameters are
  dimensions, fixed ones scalar coordinates (the one metadata convention of the sweeps);
  :func:`canonical` rounds coordinate values so grids from different programs align.
* The branch-weight rule, :func:`branch_weights`: ``alpha`` ties both; otherwise alpha_A
  and alpha_M are separate and a missing one is 0.5 (the ``HParams`` default). Giving
  ``alpha`` together with either of the pair is an error.
* :func:`check_values`: the one place hyperparameter ranges are checked (vectorized; one-line
  ``ValueError``); ``HParams.validate`` uses it too.
* Limits (:data:`LIMITS`): the documented upper bounds of every size a user can ask for,
  and :func:`check_grid` / :func:`check_memory`, size and memory estimates checked before
  any work starts (one-line ``ValueError`` a user understands: "grid of 1e+09 points needs
  37 GiB ..."). :func:`check_option` checks one scalar option against its range.
* :class:`ChunkStore`: finished chunks of a long grid computation in one folder
  (``meta.json`` with the key of the computation's spec, ``chunk_000000.npz``, ...): write,
  resume, assemble; a folder holding another computation's chunks is refused. Every chunk
  carries a SHA-256 of its arrays: a corrupt, zeroed, truncated or empty chunk is reported
  and recomputed. The store is locked (``fcntl.flock`` on ``.lock.<process index>``): a
  second writer of the same store gets a one-line ``StoreLocked`` error at once (it does
  not wait); the processes of one multi-host run have different indices and share it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil

import numpy as np

from . import io
from .io import StoreLocked  # noqa: F401  (defined with the lock, io.dir_lock)

AXES = ("sigma_w", "sigma_a", "alpha", "alpha_a", "alpha_m", "sigma_v", "n_tokens", "depth")
DEFAULT_BRANCH_WEIGHT = 0.5
COORD_DIGITS = 10  # coordinates are compared after rounding to this many decimals

# ---- limits (documented in the README, "Limits") --------------------------------------
SIGMA_MAX = 100.0  # sigma_w, sigma_A, sigma_V (and other scales): beyond, exp/erf overflow
N_TOKENS_MAX = 1_000_000  # the theory's n (a number in formulas; simulations have a memory check)
DEPTH_MAX = 10_000  # blocks L (maps are iterated L times)
AXIS_POINTS_MAX = 10_000_000  # values on one axis (start:stop:count)
GRID_POINTS_MAX = 1 << 26  # points of one grid (67 million: 2.5 GiB of float64 results)
CHUNK_MAX = 1 << 20  # --chunk
LIMITS = dict(
    sigma=SIGMA_MAX,
    n_tokens=N_TOKENS_MAX,
    depth=DEPTH_MAX,
    axis_points=AXIS_POINTS_MAX,
    grid_points=GRID_POINTS_MAX,
    chunk=CHUNK_MAX,
)
GiB = float(1 << 30)


def flag(name: str) -> str:
    """The option name of an axis: sigma_w -> sigma-w."""
    return name.replace("_", "-")


def parse_axis(text, name: str = "value") -> np.ndarray:
    """'start:stop:count' -> linspace; 'a,b,c' -> the list; 'x' -> [x]. ValueError otherwise."""
    text = str(text).strip()
    try:
        if ":" in text:
            parts = text.split(":")
            if len(parts) != 3:
                raise ValueError
            start, stop, count = float(parts[0]), float(parts[1]), int(parts[2])
            if count < 1 or not (math.isfinite(start) and math.isfinite(stop)):
                raise ValueError
            if count > AXIS_POINTS_MAX:
                raise OverflowError
            return np.linspace(start, stop, count)
        vals = np.array([float(v) for v in text.split(",") if v.strip() != ""])
        if vals.size == 0 or not np.all(np.isfinite(vals)):
            raise ValueError
        return vals
    except OverflowError:
        raise ValueError(
            f"--{flag(name)} asks for {count:,} points on one axis; the limit is "
            f"{AXIS_POINTS_MAX:,} (use a coarser range)"
        ) from None
    except ValueError:
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise ValueError(
            f"malformed range for --{flag(name)}: {shown!r} (use start:stop:count, a,b,c or a number)"
        ) from None


def canonical(values) -> np.ndarray:
    """Float64 coordinate values rounded to :data:`COORD_DIGITS` decimals, so grids written
    by different programs (or parsed from text) line up exactly."""
    return np.round(np.asarray(values, np.float64), COORD_DIGITS)


def branch_weights(alpha=None, alpha_a=None, alpha_m=None, default=DEFAULT_BRANCH_WEIGHT) -> dict:
    """The one branch-weight rule: ``{"alpha": alpha}`` (ties alpha_A = alpha_M) or
    ``{"alpha_a": ..., "alpha_m": ...}`` with ``default`` for the one not given."""
    if alpha is not None and (alpha_a is not None or alpha_m is not None):
        raise ValueError("give alpha (--alpha, ties alpha_a = alpha_m) or alpha_a/alpha_m, not both")
    if alpha is not None:
        return {"alpha": alpha}
    return {"alpha_a": default if alpha_a is None else alpha_a, "alpha_m": default if alpha_m is None else alpha_m}


def untie(values: dict) -> dict:
    """``alpha`` -> ``alpha_a`` and ``alpha_m`` (a copy; the pair is left as it is)."""
    values = dict(values)
    if "alpha" in values:
        values["alpha_a"] = values["alpha_m"] = values.pop("alpha")
    return values


def check_values(values: dict) -> None:
    """Validate hyperparameter values (numbers or arrays, keyed by axis name); raise
    ``ValueError`` with one line naming the option and the first offending value."""
    for name, v in values.items():
        v = np.asarray(v, dtype=float)
        if v.ndim > 1:
            raise ValueError(f"{name} must be a number or a 1-D sequence")
        if v.size == 0:
            raise ValueError(f"{name} is empty")
        opt = "--" + flag(name)
        if not np.all(np.isfinite(v)):
            raise ValueError(f"{opt} must be finite (got {v[~np.isfinite(v)].flat[0]:g})")
        if name.startswith("sigma") and not np.all(v > 0):
            raise ValueError(f"{opt} must be > 0 (got {v.min():g})")
        if name.startswith("sigma") and not np.all(v <= SIGMA_MAX):
            raise ValueError(f"{opt} must be <= {SIGMA_MAX:g} (got {v.max():g})")
        if name.startswith("alpha") and not np.all((v >= 0) & (v <= 1)):
            raise ValueError(f"{opt} must lie in [0, 1] (got {v[(v < 0) | (v > 1)].flat[0]:g})")
        if name == "n_tokens" and not np.all((v >= 2) & (v == np.round(v))):
            raise ValueError(f"{opt} must be an integer >= 2 (got {v.min():g})")
        if name == "n_tokens" and not np.all(v <= N_TOKENS_MAX):
            raise ValueError(f"{opt} must be <= {N_TOKENS_MAX:,} (got {v.max():g})")
        if name == "depth" and not np.all((v >= 1) & (v == np.round(v))):
            raise ValueError(f"{opt} must be an integer >= 1 (got {v.min():g})")
        if name == "lr" and not np.all(v > 0):
            raise ValueError(f"{opt} must be > 0 (got {v.min():g})")
        if name == "depth" and not np.all(v <= DEPTH_MAX):
            raise ValueError(f"{opt} must be <= {DEPTH_MAX:,} (got {v.max():g})")


def check_option(
    name: str,
    value,
    lo=None,
    hi=None,
    *,
    integer: bool = False,
    lo_open: bool = False,
    hi_open: bool = False,
    hint: str = "",
) -> None:
    """One scalar option against its range: finite, a whole number if ``integer``, and in
    [lo, hi] (open ends with ``lo_open``/``hi_open``; None: unbounded). ``name`` is the
    option as the user typed it (``--width``). One-line ``ValueError`` otherwise."""
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a number (got {value!r})") from None
    if integer and isinstance(value, int) and abs(value) > 2**53:
        v = float("inf") if value > 0 else float("-inf")
    if not math.isfinite(v) and not (integer and isinstance(value, int)):
        raise ValueError(f"{name} must be finite (got {value})")
    if integer and math.isfinite(v) and v != round(v):
        raise ValueError(f"{name} must be a whole number (got {value})")
    shown = f"{value:,}" if isinstance(value, int) and abs(value) >= 10_000 else f"{v:g}"
    if lo is None and hi is None:
        return
    fmt = lambda x: f"{x:,}" if isinstance(x, int) else f"{x:g}"
    if lo is not None and (v < lo or (lo_open and v == lo)):
        upto = f"; at most {fmt(hi)}" if hi is not None else ""
        raise ValueError(f"{name} must be {'>' if lo_open else '>='} {fmt(lo)} (got {shown}{upto}){hint}")
    if hi is not None and (v > hi or (hi_open and v == hi)):
        raise ValueError(f"{name} must be {'<' if hi_open else '<='} {fmt(hi)} (got {shown}){hint}")


def memory_limit() -> int:
    """Bytes one command may plan to use: ``PHASEFIELD_MEMORY_LIMIT`` (bytes, or with a
    K/M/G suffix) or else half of this machine's physical memory."""
    env = os.environ.get("PHASEFIELD_MEMORY_LIMIT", "").strip()
    if env:
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(env[-1].upper(), 1)
        try:
            return int(float(env.rstrip("kKmMgGtT")) * mult)
        except ValueError:
            pass
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2)
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 8 << 30


def format_bytes(n: float) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def check_memory(nbytes: float, what: str, hint: str) -> None:
    """Refuse work whose estimated memory ``nbytes`` exceeds :func:`memory_limit`:
    ``"<what> needs 37 GiB of memory, more than the 11 GiB limit; <hint>"``."""
    limit = memory_limit()
    if nbytes > limit:
        raise ValueError(
            f"{what} needs about {format_bytes(nbytes)} of memory, more than the "
            f"{format_bytes(limit)} limit (half the machine's memory, or "
            f"PHASEFIELD_MEMORY_LIMIT); {hint}"
        )


def grid_size(sizes) -> int:
    """Number of points of a grid with these axis sizes (Python ints: no overflow)."""
    total = 1
    for n in sizes:
        total *= int(n)
    return total


def check_grid(sizes, bytes_per_point: int = 8 * 8, what: str = "grid") -> int:
    """Points of a grid, checked against :data:`GRID_POINTS_MAX` and the memory its results
    take (``bytes_per_point``) before any work starts; returns the number of points."""
    total = grid_size(sizes)
    if total > GRID_POINTS_MAX:
        raise ValueError(
            f"{what} of {total:,} points is more than the limit of {GRID_POINTS_MAX:,} "
            f"(its results alone need {format_bytes(total * bytes_per_point)}); "
            f"use a smaller grid"
        )
    check_memory(total * bytes_per_point, f"{what} of {total:,} points", "use a smaller grid")
    return total


def simulation_bytes(
    width: int, n_tokens: int, depth: int, mlp_hidden=None, itemsize: int = 4, points: int = 1, weights: str = "dense"
) -> int:
    """Least memory of one simulated draw for ``points`` points vmapped together: the
    gradient kernel keeps the block inputs of every layer (each block is rematerialized in
    the backward pass) plus one layer's random linear maps at a time — dense: the d x d
    matrices; lazy: the n x d slabs, noise and token bases (~16 n max(d, h) numbers)."""
    d, n, L = int(width), int(n_tokens), int(depth)
    h = int(mlp_hidden or d)
    layer = 2 * (3 * d * d + 2 * d * h) if weights == "dense" else 16 * n * max(d, h)
    return points * itemsize * (L * 8 * n * max(d, h) + layer + 4 * n * n)


def spec_key(spec: dict) -> str:
    """A short hash of a JSON-able description (arrays as float64 lists)."""
    text = json.dumps(spec, sort_keys=True, default=io.json_default)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


CHECKSUM_KEY = "__sha256__"


def arrays_digest(arrays: dict) -> str:
    """SHA-256 of named arrays (names, dtypes, shapes and bytes, in name order)."""
    h = hashlib.sha256()
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(f"{k}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


class ChunkStore:
    """Finished chunks of one computation, kept in ``folder`` so a rerun resumes.

    ``spec`` describes the computation (JSON-able); its key is written to
    ``folder/meta.json`` and a folder whose key differs is refused (``ValueError``).

    Each chunk file holds its arrays and their SHA-256 (:func:`arrays_digest`); :meth:`has`
    verifies it, so a corrupt, zeroed, truncated or empty chunk (or one written before the
    checksums) is reported through ``log`` (default: a line on stderr), removed and
    recomputed. ``lock=True`` takes an exclusive, non-blocking lock on
    ``folder/.lock.<process index>`` for the store's lifetime (released by :meth:`close`,
    :meth:`remove` or the process's exit); a second writer gets :class:`StoreLocked`."""

    def __init__(self, folder, spec: dict, log=None, lock: bool = True, process_index: int = 0):
        self.folder = os.fspath(folder)
        self.key = spec_key(spec)
        self.log = log if log is not None else _stderr
        self._lock_fd = None
        self._verified = set()
        created = not os.path.exists(self.folder)
        os.makedirs(self.folder, exist_ok=True)
        try:
            if lock:
                self._lock(process_index)
            meta = os.path.join(self.folder, "meta.json")
            if os.path.exists(meta):
                try:
                    key = io.read_json(meta).get("key")
                except (OSError, ValueError, AttributeError):
                    key = None
                if key != self.key:
                    raise ValueError(
                        f"{self.folder} holds chunks of a different sweep (or a damaged "
                        f"meta.json); remove it or choose another output"
                    )
            else:
                io.write_json(meta, dict(key=self.key, spec=spec))
        except BaseException:
            self.close()
            if created:
                shutil.rmtree(self.folder, ignore_errors=True)
            raise

    def _lock(self, process_index: int) -> None:
        import fcntl

        path = os.path.join(self.folder, f".lock.{int(process_index)}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                owner = os.read(fd, 64).decode(errors="replace").strip()
            except OSError:
                owner = ""
            os.close(fd)
            raise StoreLocked(
                f"another phasefield process{' (' + owner + ')' if owner else ''} is writing "
                f"{self.folder}; wait for it to finish or choose another output"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {_hostname()}".encode())
        self._lock_fd = fd

    def __del__(self):
        self.close()

    def close(self) -> None:
        """Release the lock (the chunks stay)."""
        if self._lock_fd is not None:
            try:
                os.close(self._lock_fd)
            finally:
                self._lock_fd = None

    def path(self, i: int) -> str:
        return os.path.join(self.folder, f"chunk_{i:06d}.npz")

    def _read(self, i: int):
        """The chunk's arrays if its checksum holds, else None (after telling the user and
        removing the file)."""
        path = self.path(i)
        try:
            if os.path.getsize(path) == 0:
                raise ValueError("empty file")
            with np.load(path) as z:
                arrays = {k: z[k] for k in z.files}
            stored = str(arrays.pop(CHECKSUM_KEY)) if CHECKSUM_KEY in arrays else None
            if stored is None:
                raise ValueError("no checksum")
            if stored != arrays_digest(arrays):
                raise ValueError("checksum mismatch")
        except FileNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001 - any unreadable chunk is recomputed
            reason = str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__
            self.log(f"chunk {i} in {self.folder} is corrupt ({reason}); recomputing it")
            try:
                os.remove(path)
            except OSError:
                pass
            return None
        return arrays

    def has(self, i: int) -> bool:
        if i in self._verified and os.path.exists(self.path(i)):
            return True
        if not os.path.exists(self.path(i)):
            return False
        ok = self._read(i) is not None
        if ok:
            self._verified.add(i)
        return ok

    def load(self, i: int) -> dict:
        arrays = self._read(i)
        if arrays is None:
            raise ValueError(f"chunk {i} in {self.folder} is missing or corrupt; rerun to recompute it")
        return arrays

    def save(self, i: int, arrays: dict) -> None:
        arrays = {k: np.asarray(v) for k, v in arrays.items()}
        io.write_npz(self.path(i), dict(arrays, **{CHECKSUM_KEY: np.array(arrays_digest(arrays))}))
        self._verified.add(i)

    def missing(self, n_chunks: int) -> list:
        return [i for i in range(n_chunks) if not self.has(i)]

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _stderr(msg: str) -> None:
    import sys

    print(f"phasefield: {msg}", file=sys.stderr, flush=True)


def _hostname() -> str:
    import socket

    return socket.gethostname()
