"""Shared CLI helpers: hyperparameter options, bad input as :class:`UsageError`, JSON output.

The logic lives in the library: axes, the branch-weight rule and the range checks in
:mod:`phasefield.grid`, atomic files in :mod:`phasefield.io` (``atomic_path`` is re-exported
here for the commands that write files).
"""

from __future__ import annotations

import click
import numpy as np

from .. import grid, io
from ..io import atomic_path, json_default  # noqa: F401  (re-exported for the commands)


class UsageError(Exception):
    """Bad user input: reported as one line, exit code 2."""


def parse_range(text: str, name: str = "value") -> np.ndarray:
    """:func:`phasefield.grid.parse_axis`, bad input as :class:`UsageError`."""
    try:
        return grid.parse_axis(text, name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def check(fn, *args, **kw):
    """Call a library check (``grid.check_option``, ``io.check_output`` ...), its
    ``ValueError`` as :class:`UsageError`."""
    try:
        return fn(*args, **kw)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def option(name, value, lo=None, hi=None, **kw) -> None:
    """:func:`phasefield.grid.check_option` (``name`` is the flag, e.g. ``--width``)."""
    if value is not None:
        check(grid.check_option, name, value, lo, hi, **kw)


def output(path, flag="--out", kind="file", need_bytes=0) -> None:
    """:func:`phasefield.io.check_output`: the output can be written (before any work)."""
    check(io.check_output, path, flag, kind, need_bytes)


def check_hparams_values(values: dict) -> None:
    """:func:`phasefield.grid.check_values`, bad input as :class:`UsageError`."""
    try:
        grid.check_values(values)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def point_options(n_tokens: int = 32, depth: int = 16):
    """Decorator: the hyperparameters of one point (``alpha`` ties alpha_A = alpha_M);
    :func:`point_hparams` turns them into ``HParams``."""
    opts = [
        click.option("--sigma-w", type=float, default=1.0, show_default=True, help="MLP weight scale σ_w"),
        click.option("--sigma-a", type=float, default=1.0, show_default=True, help="attention logit scale σ_A"),
        click.option("--alpha", type=float, default=None, help="sets α_A = α_M"),
        click.option(
            "--alpha-a", type=float, default=None, help=f"attention branch weight α_A [{grid.DEFAULT_BRANCH_WEIGHT}]"
        ),
        click.option(
            "--alpha-m", type=float, default=None, help=f"MLP branch weight α_M [{grid.DEFAULT_BRANCH_WEIGHT}]"
        ),
        click.option("--sigma-v", type=float, default=1.0, show_default=True, help="value weight scale σ_V"),
        click.option("--n-tokens", type=int, default=n_tokens, show_default=True),
        click.option("--depth", type=int, default=depth, show_default=True),
    ]

    def deco(f):
        for o in reversed(opts):
            f = o(f)
        return f

    return deco


def point_hparams(sigma_w, sigma_a, alpha, alpha_a, alpha_m, sigma_v, n_tokens, depth, **static):
    """``HParams`` of the :func:`point_options` (and static fields), validated."""
    from .. import HParams

    tied = grid.branch_weights(alpha, alpha_a, alpha_m)
    check_hparams_values(
        {
            k: v
            for k, v in dict(
                tied, sigma_w=sigma_w, sigma_a=sigma_a, sigma_v=sigma_v, n_tokens=n_tokens, depth=depth
            ).items()
            if v is not None
        }
    )
    w = grid.untie(tied)
    return HParams(
        sigma_w=float(sigma_w),
        sigma_a=float(sigma_a),
        alpha_a=float(w["alpha_a"]),
        alpha_m=float(w["alpha_m"]),
        sigma_v=float(sigma_v),
        n_tokens=int(n_tokens),
        depth=int(depth),
        **static,
    ).validate()


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
    try:
        weights = grid.branch_weights(alpha, alpha_a, alpha_m, default=str(grid.DEFAULT_BRANCH_WEIGHT))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    raw = dict(sigma_w=sigma_w, sigma_a=sigma_a, sigma_v=sigma_v, n_tokens=n_tokens, depth=depth, **weights)
    vals = {k: parse_range(v, k) for k, v in raw.items()}
    check_hparams_values(vals)
    return vals


def echo_json(obj) -> None:
    """One JSON object on stdout, RFC 8259: NaN and ±inf are printed as null."""
    click.echo(io.dumps(obj))


def options(*opts):
    """Decorator: the click options ``opts`` (decorators) in the order listed, as if written
    one above the other (the first listed first in ``--help``)."""

    def deco(f):
        for o in reversed(opts):
            f = o(f)
        return f

    return deco
