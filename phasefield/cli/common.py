"""Shared CLI helpers: range parsing, hyperparameter options, atomic output files."""
from __future__ import annotations

import json
import math
import os
import tempfile
from contextlib import contextmanager

import click
import numpy as np


class UsageError(Exception):
    """Bad user input: reported as one line, exit code 2."""


def parse_range(text: str, name: str = "value") -> np.ndarray:
    """'start:stop:count' -> linspace; 'a,b,c' -> list; 'x' -> [x]."""
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
        raise UsageError(
            f"malformed range for --{name.replace('_', '-')}: {text!r} (use start:stop:count, a,b,c or a number)"
        ) from None


def check_hparams_values(values: dict) -> None:
    """Validate arrays of hyperparameter values; raise UsageError with one line."""
    for k, v in values.items():
        v = np.asarray(v, dtype=float)
        flag = "--" + k.replace("_", "-")
        if k in ("sigma_w", "sigma_a", "sigma_v") and not np.all(v > 0):
            raise UsageError(f"{flag} must be > 0 (got {v.min():g})")
        if k in ("alpha", "alpha_a", "alpha_m") and not np.all((v >= 0) & (v <= 1)):
            bad = v[(v < 0) | (v > 1)][0]
            raise UsageError(f"{flag} must lie in [0, 1] (got {bad:g})")
        if k == "n_tokens" and not np.all((v >= 2) & (v == np.round(v))):
            raise UsageError(f"{flag} must be an integer >= 2 (got {v.min():g})")
        if k == "depth" and not np.all((v >= 1) & (v == np.round(v))):
            raise UsageError(f"{flag} must be an integer >= 1 (got {v.min():g})")


def grid_options(f):
    """The hyperparameter axes of a grid command (each a range, a list or a number)."""
    opts = [
        click.option("--sigma-w", default="1.0", show_default=True, help="start:stop:count, a,b,c or x"),
        click.option("--sigma-a", default="1.0", show_default=True),
        click.option("--alpha", default=None, help="sets alpha_a = alpha_m (one axis)"),
        click.option("--alpha-a", default=None, help="(default 0.5)"),
        click.option("--alpha-m", default=None, help="(default 0.5)"),
        click.option("--sigma-v", default="1.0", show_default=True),
        click.option("--n-tokens", default="32", show_default=True),
        click.option("--depth", default="16", show_default=True),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def grid_values(sigma_w, sigma_a, alpha, alpha_a, alpha_m, sigma_v, n_tokens, depth) -> dict:
    """Parse and validate the :func:`grid_options` into arrays (``alpha`` or the pair)."""
    from ..sweep import branch_weights
    raw = dict(sigma_w=sigma_w, sigma_a=sigma_a, sigma_v=sigma_v, n_tokens=n_tokens, depth=depth,
               **branch_weights(alpha, alpha_a, alpha_m, default="0.5"))
    vals = {k: parse_range(v, k) for k, v in raw.items()}
    check_hparams_values(vals)
    return vals


def echo_json(obj) -> None:
    click.echo(json.dumps(obj, indent=None, sort_keys=False, default=_json_default))


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    try:
        return float(o)
    except Exception:
        return str(o)


@contextmanager
def atomic_path(path: str):
    """Yield a temporary path next to ``path``; move it into place only on success."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".part", dir=d)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
