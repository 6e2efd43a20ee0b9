"""The chunk driver of every sweep (phasefield.driver): the loop's bookkeeping (chunks of
any shape, resume, the multi-host split, locks), the one placement of a chunk's points over
devices, and the simulation sweeps running through it (interrupted and resumed: the same
numbers as one uninterrupted run)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phasefield import driver, grid, io
from phasefield.simulate import measure
from phasefield.simulate import sweep as simsweep

VARS = ("a", "b")


def _evaluate(calls):
    def evaluate(c):  # chunk c's values: 10 c + point, padded to 3 points
        calls.append(c)
        return {"a": 10.0 * c + np.arange(3), "b": -(10.0 * c + np.arange(3))}

    return evaluate


# chunks of up to three points that need not be contiguous in the flat result (a span may be
# the indices themselves): chunk 0 fills 0, 2, 4; chunk 1 fills 1, 3; chunk 2 fills 5
PLACES = [np.array([0, 2, 4]), np.array([1, 3]), (5, 6)]


def _expected():
    a = np.empty(6)
    for c, p in enumerate(PLACES):
        where = driver.store.places(p)
        a[where] = 10.0 * c + np.arange(where.size)
    return a


def test_chunks_fill_their_places_resume_and_write(tmp_path):
    out = tmp_path / "d.nc"
    calls = []
    with driver.Driver(out, {"what": "test"}) as drv:
        res = drv.run(_evaluate(calls), 3, PLACES.__getitem__, 6, VARS)
    np.testing.assert_array_equal(res["a"], _expected())
    np.testing.assert_array_equal(res["b"], -_expected())
    assert calls == [0, 1, 2] and (tmp_path / "d.nc.chunks" / "chunk_000002.npz").exists()

    # a rerun reads every stored chunk back (nothing computed) and writes the file atomically
    calls.clear()
    with driver.Driver(out, {"what": "test"}) as drv:
        again = drv.run(_evaluate(calls), 3, PLACES.__getitem__, 6, VARS)
        import xarray as xr

        drv.write(xr.Dataset({k: ("i", again[k]) for k in VARS}))
    assert calls == []
    np.testing.assert_array_equal(io.read_netcdf(out)["a"].values, _expected())
    assert not (tmp_path / "d.nc.chunks").exists()


def test_multi_host_split_and_assembly(tmp_path):
    """Two processes (their indices set by hand): process 1 computes the odd chunks and gets
    None, process 0 the even ones and assembles all of them from the shared store."""
    out, calls = tmp_path / "m.nc", {0: [], 1: []}
    for pid in (1, 0):
        with driver.Driver(out, {"what": "split"}) as drv:
            drv.pid, drv.pcount = pid, 2
            res = drv.run(_evaluate(calls[pid]), 3, PLACES.__getitem__, 6, VARS, wait=5.0)
        if pid == 1:
            assert res is None
    assert calls == {0: [0, 2], 1: [1]}
    np.testing.assert_array_equal(res["a"], _expected())


def test_multi_host_needs_a_store_and_a_second_writer_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ValueError, match="multi-host"):
        driver.Driver(None, {"what": "x"})
    monkeypatch.undo()
    with driver.Driver(tmp_path / "l.nc", {"what": "x"}):
        with pytest.raises(grid.StoreLocked):
            driver.Driver(tmp_path / "l.nc", {"what": "x"})


def test_over_points_places_a_chunk_over_the_devices():
    """One definition of the placement: the per-point arguments split over every local
    device (the CPU cores the suite exposes), the others replicated; the whole-chunk program
    and the per-device one give what one device gives."""
    devices = jax.local_devices()
    n = 4 * len(devices)

    def fn(x, table, y):
        return x * table[0] + y

    x, y = jnp.arange(n, dtype=jnp.float32), jnp.ones(n, jnp.float32)
    table = jnp.asarray([3.0], jnp.float32)
    ref = np.asarray(driver.over_points(fn, devices[:1], (True, False, True))(x, table, y))
    xs, ys = driver.shard((x, y), devices)
    assert len(xs.sharding.device_set) == len(devices)
    for per_device in (False, True):
        got = driver.over_points(fn, devices, (True, False, True), per_device=per_device)(xs, table, ys)
        np.testing.assert_array_equal(np.asarray(got), ref)
    assert driver.shard(x, devices[:1]) is x


def test_grid_flattens_outer_axes_first_and_labels_in_the_given_order():
    """An outer axis given last (the simulated sweep's n_tokens): the flat points run slab by
    slab, each chunk within one slab (the last one short, or padded by wrapping), and the
    dataset keeps the dimensions in the order given."""
    a, n = np.array([0.1, 0.2, 0.3]), np.array([3, 5])
    g = driver.Grid({"a": a, "n": n}, {"s": 2.0}, outer=("n",))
    assert g.dims == ("a", "n") and tuple(g.axes) == ("n", "a") and g.shape == (2, 3)
    chunks = g.chunks(2)
    assert chunks.count == 4 and [chunks.span(c) for c in range(4)] == [(0, 2), (2, 3), (3, 5), (5, 6)]
    np.testing.assert_array_equal(chunks.index(1), [2, 0])  # padded by wrapping within slab 0
    at = g.values(np.arange(*chunks.span(2)))
    np.testing.assert_array_equal(at["n"], [5, 5])
    np.testing.assert_array_equal(at["a"], [0.1, 0.2])
    np.testing.assert_array_equal(at["s"], [2.0, 2.0])
    flat = g.values(np.arange(g.size))
    ds = g.dataset({"v": 10 * flat["n"] + flat["a"]}, {"v": {"long_name": "v"}})
    assert ds["v"].dims == ("a", "n") and float(ds["s"]) == 2.0
    np.testing.assert_array_equal(ds["v"].values, 10 * n[None, :] + a[:, None])


def test_values_per_position_are_stored_resumed_and_labelled(tmp_path):
    """A variable with a trailing shape (a causal sweep's value per position) beside a
    number per point: an interrupted run keeps its finished chunks' [points, 4] values, the
    rerun computes only the rest, and the dataset labels them after the grid's dimensions
    (in the order given; the outer axis first in the flat order)."""
    a, n = np.array([0.1, 0.2, 0.3]), np.array([3, 5])
    g = driver.Grid({"a": a, "n": n}, outer=("n",))
    chunks = g.chunks(2)
    flat = g.values(np.arange(g.size))
    want = (10 * flat["n"] + flat["a"])[:, None] + 100 * np.arange(4)  # [points, position]
    calls = []

    def evaluate(c):
        calls.append(c)
        if c == 2 and len(calls) == 3:
            raise KeyboardInterrupt
        rows = want[driver.store.places(chunks.span(c))]
        rows = np.resize(rows, (chunks.size, 4))  # padded, as a chunk's last points are
        return {"s": rows[:, 0], "p": rows}

    out, spec, shapes = tmp_path / "p.nc", {"what": "positions"}, {"p": (4,)}
    with pytest.raises(KeyboardInterrupt), driver.Driver(out, spec) as drv:
        drv.run(evaluate, chunks.count, chunks.span, g.size, ("s", "p"), shapes=shapes)
    assert calls == [0, 1, 2]
    calls.clear()
    with driver.Driver(out, spec) as drv:
        res = drv.run(evaluate, chunks.count, chunks.span, g.size, ("s", "p"), shapes=shapes)
        ds = g.dataset(res, {"s": {}, "p": {}}, trailing={"p": ("position",)})
        drv.write(ds)
    assert calls == [2, 3]
    np.testing.assert_array_equal(res["p"], want)
    np.testing.assert_array_equal(res["s"], want[:, 0])
    ds = io.read_netcdf(out)
    assert ds["p"].dims == ("a", "n", "position") and ds["s"].dims == ("a", "n")
    for i, j in np.ndindex(3, 2):  # point (a_i, n_j) sits at flat index j * 3 + i
        np.testing.assert_array_equal(ds["p"].values[i, j], want[j * 3 + i])
        assert float(ds["s"].values[i, j]) == want[j * 3 + i, 0]


def test_pad_to_devices_and_replicate():
    """The trainer's placement: a batch padded to whole points per device by repeating its
    last point (unchanged when it divides), shared data whole on every device."""
    devices = jax.local_devices()
    k = 2 * len(devices) - 1 if len(devices) > 1 else 3
    tree = {"x": jnp.arange(k, dtype=jnp.float32), "y": jnp.ones((k, 2), jnp.float32)}
    padded = driver.pad_to_devices(tree, devices)
    m = -(-k // len(devices)) * len(devices)
    np.testing.assert_array_equal(padded["x"], np.r_[np.arange(k), [k - 1] * (m - k)])
    assert padded["y"].shape == (m, 2)
    assert driver.pad_to_devices(tree, devices[:1]) is tree
    data = driver.replicate((np.arange(4.0), np.zeros(3)), devices)
    assert all(a.sharding.device_set == set(devices) for a in data)
    np.testing.assert_array_equal(data[0], np.arange(4.0))
    one = driver.replicate(np.arange(4.0), devices[-1:])
    assert one.sharding.device_set == {devices[-1]}


def test_draws_on_accelerators_go_through_the_one_placement(monkeypatch):
    """The simulator spreads its draws over several accelerators with the driver's
    :func:`phasefield.driver.shard` (no CPU here has them: the devices are stand-ins)."""

    class Accelerator:
        platform = "gpu"

    placed = []
    monkeypatch.setattr(measure.jax, "local_devices", lambda: [Accelerator(), Accelerator()])
    monkeypatch.setattr(driver, "shard", lambda tree, devices: placed.append(len(devices)) or tree)
    keys, three = np.zeros((4, 2), np.uint32), np.zeros((3, 2), np.uint32)
    assert measure.shard_draws(keys) is keys and placed == [2]
    assert measure.shard_draws(three) is three and placed == [2]  # 3 draws over 2: left alone


def _interrupt_after(monkeypatch, n_saved):
    """``grid.ChunkStore.save`` stops the run (Ctrl-C) once ``n_saved`` chunks are stored."""
    real, saved = grid.ChunkStore.save, []

    def save(store, i, arrays):
        real(store, i, arrays)
        saved.append(i)
        if len(saved) == n_saved:
            raise KeyboardInterrupt

    monkeypatch.setattr(grid.ChunkStore, "save", save)
    return real


SIM = dict(width=8, draws=2, seed=3, n_tokens=3, chunk=2)
# two shapes (depth, the outer axis), two whole chunks each (one compiled chunk size per shape;
# a short last chunk would compile one more: test_grid_flattens_outer_axes_first_... covers it)
SIM_AXES = dict(sigma_w=np.array([1.0, 1.5, 2.0, 2.5]), depth=np.array([1, 2]))


def test_simulated_sweep_interrupted_and_resumed_equals_one_run(tmp_path, monkeypatch):
    whole = simsweep.fixed_point_grid(**SIM, **SIM_AXES)
    out = tmp_path / "sim.nc"
    real = _interrupt_after(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        simsweep.fixed_point_grid(**SIM, **SIM_AXES, out=out)
    assert not out.exists() and len(list((tmp_path / "sim.nc.parts").glob("chunk_*.npz"))) == 2
    monkeypatch.setattr(grid.ChunkStore, "save", real)
    computed, run_chunk = [], simsweep._run_chunk
    monkeypatch.setattr(simsweep, "_run_chunk", lambda *a, **k: computed.append(1) or run_chunk(*a, **k))
    resumed = simsweep.fixed_point_grid(**SIM, **SIM_AXES, out=out)
    assert len(computed) == 2  # 4 chunks, 2 stored
    assert out.exists() and not (tmp_path / "sim.nc.parts").exists()
    on_disk = io.read_netcdf(out)
    assert set(resumed.data_vars) == set(whole.data_vars) == set(on_disk.data_vars)
    assert resumed.attrs == whole.attrs
    for v in whole.data_vars:
        assert whole[v].values.tobytes() == resumed[v].values.tobytes() == on_disk[v].values.tobytes(), v


def test_simulated_block_sweep_interrupted_and_resumed_equals_one_run(tmp_path, monkeypatch):
    args = ("pre-ln", {"sigma": np.array([0.5, 1.0])}, {"alpha": 0.5, "heads": 2})
    opts = dict(n_tokens=4, depth=1, width=8, draws=2, seed=1)
    whole = simsweep.rates_grid(*args, **opts)
    out = tmp_path / "blk.nc"
    real = _interrupt_after(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        simsweep.rates_grid(*args, **opts, out=out)
    assert not out.exists() and len(list((tmp_path / "blk.nc.parts").glob("chunk_*.npz"))) == 1
    monkeypatch.setattr(grid.ChunkStore, "save", real)
    computed, rates = [], measure.rates
    monkeypatch.setattr(measure, "rates", lambda *a, **k: computed.append(1) or rates(*a, **k))
    resumed = simsweep.rates_grid(*args, **opts, out=out)
    assert len(computed) == 1
    assert out.exists() and not (tmp_path / "blk.nc.parts").exists()
    assert resumed.attrs == whole.attrs
    for v in whole.data_vars:
        assert whole[v].values.tobytes() == resumed[v].values.tobytes(), v
