"""Which runs a training sweep trains: grids, scrambled Sobol designs and point files.

Every function returns a list of *runs*, one dict per trained model::

    {"sigma_w", "sigma_a", "alpha_a", "alpha_m", "depth", "lr", "seed", "run"}

``run`` is the run's name, made of its values (:func:`run_id`), so a sweep directory knows
which runs are already done whatever design produced them. A *configuration* is a run
without its seed; ``seeds`` copies of each configuration are trained (seeds 0..seeds-1).

    grid(...)          Cartesian product of axes (alpha_m=None ties alpha_M to alpha_A)
    sobol(n, bounds)   n scrambled Sobol points (scipy.stats.qmc) in a box, seeded
    read_points(path)  any list of configurations from a CSV file
    expand(configs)    configurations x depths x learning rates x seeds -> runs
"""

from __future__ import annotations

import csv
import itertools
import math
import warnings
from collections.abc import Iterable, Sequence

import numpy as np

from ..grid import check_values

HP_NAMES = ("sigma_w", "sigma_a", "alpha_a", "alpha_m")
MAX_DEPTH = 4096
CONFIG_NAMES = HP_NAMES + ("depth", "lr")


class DesignError(ValueError):
    """A malformed design request or point file (one-line message)."""


def config_id(run: dict) -> str:
    """The name of a run's configuration (its values but the seed): the seeds of one
    configuration share it."""
    return (
        f"sw{run['sigma_w']:.6g}_sa{run['sigma_a']:.6g}_aa{run['alpha_a']:.6g}_am{run['alpha_m']:.6g}"
        f"_lr{run['lr']:.6g}_L{int(run['depth'])}"
    )


def run_id(run: dict) -> str:
    """The name of one run: its configuration and seed."""
    return f"{config_id(run)}_s{int(run['seed'])}"


def expand(
    configs: Iterable[dict], depths: Sequence[int] = (16,), lrs: Sequence[float] = (1e-3,), seeds: int = 1
) -> list[dict]:
    """Every configuration at every depth and learning rate it does not fix itself, times
    ``seeds`` seeds; duplicates (same values) are kept once, in first-seen order."""
    out, seen = [], set()
    for c in configs:
        for depth in [c["depth"]] if c.get("depth") is not None else depths:
            for lr in [c["lr"]] if c.get("lr") is not None else lrs:
                for s in range(seeds):
                    r = {k: float(c[k]) for k in HP_NAMES}
                    r.update(depth=int(depth), lr=float(lr), seed=int(s))
                    r["run"] = run_id(r)
                    if r["run"] not in seen:
                        seen.add(r["run"])
                        out.append(r)
    return out


def grid(
    sigma_w: Iterable[float],
    alpha_a: Iterable[float],
    alpha_m: Iterable[float] | None = None,
    sigma_a: Iterable[float] = (1.0,),
) -> list[dict]:
    """Configurations of the Cartesian product; ``alpha_m=None`` ties alpha_M to alpha_A."""
    am_list = [None] if alpha_m is None else list(alpha_m)
    return [
        dict(sigma_w=float(sw), sigma_a=float(sa), alpha_a=float(aa), alpha_m=float(aa if am is None else am))
        for sa, aa, am, sw in itertools.product(sigma_a, alpha_a, am_list, sigma_w)
    ]


def sobol(n: int, bounds: dict, seed: int = 0) -> list[dict]:
    """``n`` configurations from a scrambled Sobol sequence over the box ``bounds``
    ({name: (lo, hi)} for each of sigma_w, sigma_a, alpha_a, alpha_m; lo == hi fixes a value).

    The first 2^k points of a Sobol sequence are balanced, so the first n of a longer
    design (same seed) are the same points: a design can be extended by raising n."""
    from scipy.stats import qmc

    if not (isinstance(n, (int, np.integer)) and n >= 1):
        raise DesignError(f"a Sobol design needs n >= 1 points (got {n!r})")
    if n > 2**20:
        raise DesignError(f"a Sobol design of {n} points is too large (at most 2^20)")
    free = [k for k in HP_NAMES if bounds[k][1] > bounds[k][0]]
    for k in HP_NAMES:
        lo, hi = bounds[k]
        if hi < lo:
            raise DesignError(f"--{k.replace('_', '-')}: the range {lo:g}:{hi:g} is empty")
    u = np.zeros((n, 0))
    if free:
        m = math.ceil(math.log2(n))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            u = qmc.Sobol(d=len(free), scramble=True, seed=seed).random_base2(m)[:n]
    out = []
    for i in range(n):
        c = {}
        for k in HP_NAMES:
            lo, hi = bounds[k]
            c[k] = float(lo + (hi - lo) * u[i, free.index(k)]) if k in free else float(lo)
        out.append(c)
    return out


def read_points(path: str) -> list[dict]:
    """Configurations from a CSV file with a header naming sigma_w, sigma_a and alpha_a and
    alpha_m (or alpha for both), and optionally depth and lr (other columns are ignored)."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DesignError(f"cannot read points file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not rows:
        raise DesignError(f"points file {path} has no rows (a header line and one row per configuration)")
    cols = set(rows[0])
    need = {"sigma_w", "sigma_a"} | ({"alpha"} if "alpha" in cols else {"alpha_a", "alpha_m"})
    if not need <= cols:
        raise DesignError(f"points file {path} lacks column(s) {', '.join(sorted(need - cols))}")
    out = []
    for i, r in enumerate(rows, start=2):
        try:
            c = dict(
                sigma_w=float(r["sigma_w"]),
                sigma_a=float(r["sigma_a"]),
                alpha_a=float(r.get("alpha_a") or r["alpha"]),
                alpha_m=float(r.get("alpha_m") or r["alpha"]),
            )
            if r.get("depth") not in (None, ""):
                d = float(r["depth"])
                if d != round(d):
                    raise ValueError
                c["depth"] = int(d)
            if r.get("lr") not in (None, ""):
                c["lr"] = float(r["lr"])
        except (TypeError, ValueError):
            raise DesignError(f"points file {path}, line {i}: not a number where one is needed") from None
        out.append(c)
    return out


def check_configs(configs: list[dict]) -> None:
    """One-line DesignError for any value outside the model's domain (the ranges are
    :func:`phasefield.grid.check_values`'s, the one place they are checked)."""
    columns = {}
    for c in configs:
        for k, v in c.items():
            columns.setdefault(k, []).append(v)
    try:
        check_values(columns)
    except ValueError as exc:
        raise DesignError(str(exc)) from None
    if "depth" in columns and max(columns["depth"]) > MAX_DEPTH:
        raise DesignError(f"--depth must be an integer in [1, {MAX_DEPTH}] (got {max(columns['depth'])})")


DEFAULT_ALPHA = "0.1:0.95:6"  # the tied alpha axis of a design given no alpha at all


def _bounds(text: str, name: str) -> tuple:
    """'lo:hi' (or 'lo:hi:count', count ignored) or one number -> (lo, hi) of a design axis."""
    parts = str(text).strip().split(":")
    try:
        if len(parts) == 1:
            lo = hi = float(parts[0])
        elif len(parts) in (2, 3):
            lo, hi = float(parts[0]), float(parts[1])
        else:
            raise ValueError
        if not (math.isfinite(lo) and math.isfinite(hi)) or hi < lo:
            raise ValueError
    except ValueError:
        raise DesignError(
            f"malformed range for --{name.replace('_', '-')} in a Sobol design: {text!r} "
            "(use lo:hi with lo <= hi, or a number)"
        ) from None
    return lo, hi


def from_axes(design: str, seed: int, sigma_w, alpha, alpha_a, alpha_m, sigma_a) -> list[dict]:
    """Configurations of ``design`` 'grid' (the product of the axes, each a range text
    ``start:stop:count``, a list ``a,b,c`` or a number) or 'sobol:N' (N scrambled Sobol points,
    scrambling ``seed``, in the box the axes span, each ``lo:hi`` or a number). ``alpha``
    ties alpha_A = alpha_M (default :data:`DEFAULT_ALPHA` when no alpha is given); otherwise
    ``alpha_a`` and ``alpha_m`` are axes of their own (default 0.5). One-line ``ValueError``."""
    from ..grid import parse_axis

    if alpha is None and alpha_a is None and alpha_m is None:
        alpha = DEFAULT_ALPHA
    if alpha is not None and (alpha_a is not None or alpha_m is not None):
        raise DesignError("give either --alpha or --alpha-a/--alpha-m, not both")
    axes = dict(sigma_w=sigma_w, sigma_a=sigma_a)
    if alpha is not None:
        axes["alpha"] = alpha
    else:
        axes.update(alpha_a="0.5" if alpha_a is None else alpha_a, alpha_m="0.5" if alpha_m is None else alpha_m)
    if design == "grid":
        vals = {k: parse_axis(v, k) for k, v in axes.items()}
        check_values(vals)
        tied = "alpha" in vals
        return grid(
            vals["sigma_w"],
            vals["alpha"] if tied else vals["alpha_a"],
            None if tied else vals["alpha_m"],
            vals["sigma_a"],
        )
    kind, _, n = design.partition(":")
    if kind != "sobol" or not n.strip().isdigit() or int(n) < 1:
        raise DesignError(f"--design must be 'grid' or 'sobol:N' with N >= 1 (got {design!r})")
    bounds = {k: _bounds(v, k) for k, v in axes.items()}
    check_values({k: list(v) for k, v in bounds.items()})
    if "alpha" in bounds:  # tied: one Sobol axis, copied to both branch weights
        box = dict(sigma_w=bounds["sigma_w"], sigma_a=bounds["sigma_a"], alpha_a=bounds["alpha"], alpha_m=(0.0, 0.0))
        return [dict(c, alpha_m=c["alpha_a"]) for c in sobol(int(n), box, seed=seed)]
    return sobol(int(n), bounds, seed=seed)
