"""The exact-softmax point tables shipped with the package (``theory/attention/tables``,
written by ``scripts/build_tables.py``): each file is read for its token count, and its
values are what the code computes today (one range recomputed here)."""

import numpy as np
import pytest

from phasefield.theory.attention import exact, exact_table, scale_table

SHIPPED = sorted(exact_table.SHIPPED.glob("exact-point-n*.npz"))


def _sizes(n):
    cap = exact_table.POINT_CAP
    return (*exact.sizes(sigma_max=cap, n_max=n), cap)


def _n(path):
    return float(path.stem.removeprefix("exact-point-n"))


def test_the_common_token_counts_are_shipped():
    assert {_n(p) for p in SHIPPED} >= {4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 197.0, 256.0}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_file_serves_every_range_of_its_n(path):
    """A file whose key no longer matches what the code asks (grid sizes, nodes, mesh,
    format) would be skipped in silence: each must serve each range of its n."""
    n = _n(path)
    n_a, n_z, cap = _sizes(n)
    for lo, hi in exact_table.point_ranges(cap):
        got = exact_table.shipped_pieces(n, n_a, n_z, cap, lo, hi)
        assert got is not None, (path.name, lo, hi)
        assert np.all(got["lo"] >= lo) and np.all(got["hi"] <= hi)


def test_the_shipped_values_are_what_the_code_computes(monkeypatch):
    """The lowest range of n = 4 (the disk caches off): its nodes are the Chebyshev-Lobatto
    nodes of the first count of POINT_NODES whose interpolant reaches SCALE_TAIL (the rule of
    ``_scale_pieces``, applied to the shipped tables, which nest), and the tables integrated
    again at both ends of each of its two mesh buckets (4 of its 29 scales: a change of the
    integrator moves every scale) are the shipped (S, T) within 1e-13 (the build and this
    process may differ in XLA version)."""
    from phasefield.theory.precision import float64

    monkeypatch.setenv("PHASEFIELD_TABLES", "off")
    n = 4.0
    n_a, n_z, cap = _sizes(n)
    lo, hi = exact_table.point_ranges(cap)[0]
    shipped = exact_table.shipped_pieces(n, n_a, n_z, cap, lo, hi)
    assert len(shipped["lo"]) == 1 and (shipped["lo"][0], shipped["hi"][0]) == (lo, hi)  # one piece: no halving
    x, s, t = shipped["x0"], shipped["s0"], shipped["t0"]
    tails = {}
    for m in exact_table.POINT_NODES:  # the nested node sets of the shipped nodes
        step = (len(x) - 1) // (m - 1)
        if step < 1 or (len(x) - 1) % (m - 1):
            continue
        np.testing.assert_array_equal(x[::step], exact_table.scale_nodes(lo, hi, m))
        tails[m] = max(exact_table.scale_tail(s[::step]), exact_table.scale_tail(t[::step]))
    first = next(m for m in exact_table.POINT_NODES if tails.get(m, np.inf) <= exact_table.SCALE_TAIL)
    assert first == len(x) and all(np.isfinite(v) for v in tails.values()), tails
    caps = exact_table.bucket_caps(np.append(x, cap))[:-1]
    ends = sorted({i for c in np.unique(caps) for i in np.flatnonzero(caps == c)[[0, -1]]})
    assert len(np.unique(caps)) == 2 and len(ends) == 4, caps
    fs, ft = float64(exact_table._direct_tables)(x[ends], n, n_a, n_z, cap, adaptive=False)
    np.testing.assert_allclose(fs, s[ends], rtol=0, atol=1e-13)
    np.testing.assert_allclose(ft, t[ends], rtol=0, atol=1e-13)


def test_a_point_reads_them_without_integrating(monkeypatch):
    """A point of a shipped n builds no piece (the integrating route would raise)."""
    monkeypatch.setenv("PHASEFIELD_TABLES", "off")

    def refuse(*a, **k):
        raise AssertionError("integrated a piece the package ships")

    monkeypatch.setattr(exact_table, "_scale_pieces", refuse)
    exact_table.point_pieces.cache_clear()
    scale_table.build.cache_clear()
    k = exact_table.point_kernel(2.5, 16.0)
    assert k.interp and k.interp_t and np.all(np.isfinite(np.asarray(k.s)))
    table = scale_table.for_point(3.7, 16.0)
    assert table is not None and table.interp_t
