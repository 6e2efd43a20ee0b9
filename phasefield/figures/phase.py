"""Phases of a theory grid and the point where both exponents vanish.

* :func:`classify` labels every grid point with one of four phases: ordered (λ_a < 0) or
  chaotic (λ_a ≥ 0) × vanishing (λ_g < 0) or exploding (λ_g ≥ 0) gradients (the same
  sign convention as :func:`phasefield.simulate.compare.phases`).
* :func:`bistable` marks the grid points with more than one attractor (``n_stable >= 2``).
* :func:`zero_contour` extracts the λ = 0 contour of a 2-D slice as polylines (contourpy,
  linear interpolation between grid points).
* :func:`critical_point` finds where the λ_a = 0 and λ_g = 0 contours intersect: it walks
  the λ_a = 0 contour, interpolates λ_g (bilinearly) along it and returns the points where
  λ_g changes sign (linearly interpolated along the contour). When the contours do not
  cross inside the grid it returns the point of the λ_a = 0 contour with the smallest
  |λ_g| instead (``kind='closest'``) — for the default transformer (σ_A = 1, n = 32,
  L = 16) that is what happens: on λ_a = 0, λ_g(L) = (1/L) log[(1 − 1/n) + μ^L / n] with the
  mean-mode eigenvalue μ = 1 + α_A² σ_V² / (β_A² q*) > 1 (docs/theory.md §7), so λ_g(L) > 0 for
  every α > 0 and the two contours meet only in the limit α → 0.
"""

from __future__ import annotations

import numpy as np

PHASES = {
    0: "ordered, vanishing",
    1: "ordered, exploding",
    2: "chaotic, vanishing",
    3: "chaotic, exploding",
}


def classify(ds, angle: str = "lambda_a", gradient: str = "lambda_g_collapse"):
    """Integer phase code per grid point: ``2·[λ_a ≥ 0] + [λ_g ≥ 0]`` (see :data:`PHASES`),
    −1 where either exponent is not finite. Returns an ``xarray.DataArray`` (int8) with
    ``flag_values`` / ``flag_meanings`` attributes."""
    import xarray as xr

    la = ds[angle]
    lg = ds[gradient]
    code = 2 * (la >= 0).astype(np.int8) + (lg >= 0).astype(np.int8)
    ok = np.isfinite(la) & np.isfinite(lg)
    code = xr.where(ok, code, -1).astype(np.int8)
    code.name = "phase"
    code.attrs = dict(
        long_name="phase (angle exponent x gradient exponent)",
        flag_values=np.array(list(PHASES), np.int8),
        flag_meanings=" ".join(v.replace(", ", "_") for v in PHASES.values()),
        angle=angle,
        gradient=gradient,
    )
    return code


def bistable(ds, x: str, y: str):
    """The (y, x) slice of ``n_stable >= 2`` (points with two or more attractors; docs/theory.md
    §6 "Several attractors"), or None when the grid has no ``n_stable`` variable (sweeps
    written by older versions) or no such point."""
    if "n_stable" not in getattr(ds, "data_vars", {}):
        return None
    mask = slice2d(ds, x, y, "n_stable") >= 2
    return mask if bool(mask.any()) else None


def slice2d(ds, x: str, y: str, var: str | None = None):
    """The 2-D (y, x) slice of ``ds`` (or of ``ds[var]``): size-1 dimensions are dropped,
    any other dimension is an error."""
    obj = ds if var is None else ds[var]
    for name in (x, y):
        if name not in obj.dims:
            raise ValueError(f"the grid has no {name} dimension (dims: {', '.join(obj.dims) or 'none'})")
    extra = [d for d in obj.dims if d not in (x, y)]
    bad = [d for d in extra if obj.sizes[d] != 1]
    if bad:
        raise ValueError(
            f"cannot take the ({x}, {y}) slice: dimension(s) {', '.join(bad)} have "
            "more than one value; select one first"
        )
    if extra:
        obj = obj.isel({d: 0 for d in extra})
    return obj.transpose(y, x)


def zero_contour(z, x, y, level: float = 0.0) -> list[np.ndarray]:
    """Polylines ``[(k, 2) array of (x, y)]`` of the level set ``z = level``; ``z`` has
    shape ``(len(y), len(x))``; non-finite values are masked."""
    import contourpy

    z = np.ma.masked_invalid(np.asarray(z, float))
    if z.count() == 0:
        return []
    gen = contourpy.contour_generator(np.asarray(x, float), np.asarray(y, float), z, line_type="Separate")
    return [np.asarray(p, float) for p in gen.lines(level) if len(p) >= 2]


def _interpolator(z, x, y):
    from scipy.interpolate import RegularGridInterpolator

    x = np.asarray(x, float)
    y = np.asarray(y, float)
    z = np.asarray(z, float)
    # RegularGridInterpolator needs increasing coordinates
    if x[0] > x[-1]:
        x, z = x[::-1], z[:, ::-1]
    if y[0] > y[-1]:
        y, z = y[::-1], z[::-1]
    f = RegularGridInterpolator((y, x), z, method="linear", bounds_error=False, fill_value=None)
    return lambda pts: f(np.stack([pts[:, 1], pts[:, 0]], axis=-1))


def zero_crossings(f, g, x, y):
    """Points ``(x, y)`` where the contours ``f = 0`` and ``g = 0`` cross (both of shape
    ``(len(y), len(x))``), and the polylines of ``f = 0`` with ``g`` interpolated along
    them. Returns ``(points, lines)``; ``lines`` is a list of ``(xy, g_on_line)``."""
    g_at = _interpolator(g, x, y)
    points, lines = [], []
    for line in zero_contour(f, x, y):
        gv = g_at(line)
        lines.append((line, gv))
        for i in range(len(line) - 1):
            a, b = gv[i], gv[i + 1]
            if not (np.isfinite(a) and np.isfinite(b)):
                continue
            if a == 0.0:
                points.append(tuple(line[i]))
            elif a * b < 0:
                t = a / (a - b)
                points.append(tuple(line[i] + t * (line[i + 1] - line[i])))
        if len(gv) and gv[-1] == 0.0:
            points.append(tuple(line[-1]))
    # de-duplicate (a vertex exactly on the crossing is seen from two segments)
    out = []
    for p in points:
        if not any(np.hypot(p[0] - q[0], p[1] - q[1]) < 1e-12 for q in out):
            out.append(p)
    return out, lines


def critical_point(
    ds, x: str = "alpha", y: str = "sigma_w", angle: str = "lambda_a", gradient: str = "lambda_g_collapse"
) -> dict | None:
    """Where λ_a = λ_g = 0 on the (x, y) slice of a theory grid (see the module docstring).

    Returns ``None`` when the λ_a = 0 contour does not enter the grid, else a dict
    ``kind`` ('crossing' or 'closest'), ``x``/``y`` names and the point's coordinates
    under those names, the ``angle`` and ``gradient`` variables (``lambda_a``,
    ``lambda_g_collapse``) interpolated there, ``points`` (every
    crossing, sorted by x) and ``min_abs_gradient`` (smallest |λ_g| on the λ_a = 0
    contour)."""
    fa = slice2d(ds, x, y, angle)
    fg = slice2d(ds, x, y, gradient)
    xs, ys = fa[x].values.astype(float), fa[y].values.astype(float)
    points, lines = zero_crossings(fa.values, fg.values, xs, ys)
    if not lines:
        return None
    la_at = _interpolator(fa.values, xs, ys)
    g_at = _interpolator(fg.values, xs, ys)
    best = None
    for line, gv in lines:
        ok = np.isfinite(gv)
        if not ok.any():
            continue
        i = int(np.argmin(np.where(ok, np.abs(gv), np.inf)))
        if best is None or abs(gv[i]) < abs(best[1]):
            best = (line[i], gv[i])
    if best is None:
        return None
    result = dict(x=x, y=y, at_edge=False, min_abs_gradient=float(abs(best[1])), angle=angle, gradient=gradient)
    if points:
        points = sorted(points)
        px, py = points[0]
        result.update(kind="crossing", points=[(float(a), float(b)) for a, b in points])
    else:
        px, py = best[0]
        result.update(kind="closest", points=[])
    span = max(abs(xs.max() - xs.min()), 1e-300)
    result["at_edge"] = bool(min(abs(px - xs.min()), abs(px - xs.max())) < 1e-6 * span)
    pt = np.array([[px, py]])
    result.update({x: float(px), y: float(py), angle: float(la_at(pt)[0]), gradient: float(g_at(pt)[0])})
    return result


def describe(cp: dict | None, fixed: dict | None = None) -> str:
    """One or two lines describing a :func:`critical_point` result."""
    if cp is None:
        return "no lambda_a = 0 contour in this slice"
    x, y = cp["x"], cp["y"]
    where = f"{x} = {cp[x]:.3f}, {y} = {cp[y]:.3f}"
    if fixed:
        where += " (" + ", ".join(f"{k} = {v:g}" for k, v in fixed.items()) + ")"
    if cp["kind"] == "crossing":
        more = f"; {len(cp['points'])} crossings in all" if len(cp["points"]) > 1 else ""
        return f"lambda_a = lambda_g = 0 at {where}{more}"
    g = cp[cp["gradient"]]
    gs = f"{g:+.1e}" if 0 < abs(g) < 1e-3 else f"{g:+.4f}"
    if cp.get("at_edge"):
        return (
            f"the zero contours do not cross inside the grid; they meet at its {x} edge: "
            f"{where}, where {cp['gradient']} = {gs} (for {x} -> 0 both exponents vanish)"
        )
    return (
        f"the zero contours do not cross inside the grid; closest approach on lambda_a = 0 "
        f"at {where}, where {cp['gradient']} = {gs}"
    )
