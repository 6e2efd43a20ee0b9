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
    """The lowest range of n = 4 integrated again (the disk caches off): the same nodes,
    and (S, T) within 1e-13 (the build and this process may differ in XLA version)."""
    monkeypatch.setenv("PHASEFIELD_TABLES", "off")
    n = 4.0
    n_a, n_z, cap = _sizes(n)
    lo, hi = exact_table.point_ranges(cap)[0]
    shipped = exact_table.shipped_pieces(n, n_a, n_z, cap, lo, hi)
    fresh = exact_table._scale_pieces.__wrapped__(
        n, n_a, n_z, lo, hi, cap, adaptive=False, nodes=exact_table.POINT_NODES
    )
    assert len(fresh) == len(shipped["lo"])
    for i, (a, b, x, s, t) in enumerate(fresh):
        assert (a, b) == (shipped["lo"][i], shipped["hi"][i])
        np.testing.assert_array_equal(x, shipped[f"x{i}"])
        np.testing.assert_allclose(s, shipped[f"s{i}"], rtol=0, atol=1e-13)
        np.testing.assert_allclose(t, shipped[f"t{i}"], rtol=0, atol=1e-13)


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
