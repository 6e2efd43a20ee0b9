"""Grids of hyperparameter points: axes, the branch-weight rule, validation, the chunk store.

Used by the theory sweep (:mod:`phasefield.sweep`), the simulator sweep
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
* :class:`ChunkStore`: finished chunks of a long grid computation in one folder
  (``meta.json`` with the key of the computation's spec, ``chunk_000000.npz``, ...): write,
  resume, assemble; a folder holding another computation's chunks is refused.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil

import numpy as np

from . import io

AXES = ("sigma_w", "sigma_a", "alpha", "alpha_a", "alpha_m", "sigma_v", "n_tokens", "depth")
DEFAULT_BRANCH_WEIGHT = 0.5
COORD_DIGITS = 10      # coordinates are compared after rounding to this many decimals


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
            return np.linspace(start, stop, count)
        vals = np.array([float(v) for v in text.split(",") if v.strip() != ""])
        if vals.size == 0 or not np.all(np.isfinite(vals)):
            raise ValueError
        return vals
    except ValueError:
        raise ValueError(f"malformed range for --{flag(name)}: {text!r} "
                         f"(use start:stop:count, a,b,c or a number)") from None


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
    return {"alpha_a": default if alpha_a is None else alpha_a,
            "alpha_m": default if alpha_m is None else alpha_m}


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
        if name.startswith("alpha") and not np.all((v >= 0) & (v <= 1)):
            raise ValueError(f"{opt} must lie in [0, 1] (got {v[(v < 0) | (v > 1)].flat[0]:g})")
        if name == "n_tokens" and not np.all((v >= 2) & (v == np.round(v))):
            raise ValueError(f"{opt} must be an integer >= 2 (got {v.min():g})")
        if name == "depth" and not np.all((v >= 1) & (v == np.round(v))):
            raise ValueError(f"{opt} must be an integer >= 1 (got {v.min():g})")
        if name == "lr" and not np.all(v > 0):
            raise ValueError(f"{opt} must be > 0 (got {v.min():g})")


def spec_key(spec: dict) -> str:
    """A short hash of a JSON-able description (arrays as float64 lists)."""
    text = json.dumps(spec, sort_keys=True, default=io.json_default)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class ChunkStore:
    """Finished chunks of one computation, kept in ``folder`` so a rerun resumes.

    ``spec`` describes the computation (JSON-able); its key is written to
    ``folder/meta.json`` and a folder whose key differs is refused (``ValueError``)."""

    def __init__(self, folder, spec: dict):
        self.folder = os.fspath(folder)
        self.key = spec_key(spec)
        os.makedirs(self.folder, exist_ok=True)
        meta = os.path.join(self.folder, "meta.json")
        if os.path.exists(meta):
            if io.read_json(meta).get("key") != self.key:
                raise ValueError(f"{self.folder} holds chunks of a different sweep; remove it or "
                                 f"choose another output")
        else:
            io.write_json(meta, dict(key=self.key, spec=spec))

    def path(self, i: int) -> str:
        return os.path.join(self.folder, f"chunk_{i:06d}.npz")

    def has(self, i: int) -> bool:
        return os.path.exists(self.path(i))

    def load(self, i: int) -> dict:
        return io.read_npz(self.path(i))

    def save(self, i: int, arrays: dict) -> None:
        io.write_npz(self.path(i), arrays)

    def missing(self, n_chunks: int) -> list:
        return [i for i in range(n_chunks) if not self.has(i)]

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
