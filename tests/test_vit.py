"""ViT trainer, data pipeline, sweep bookkeeping and the loss-from-exponents predictor."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phasefield import block as shared_block
from phasefield.vit import data as vdata
from phasefield.vit import design as vdesign
from phasefield.vit import model as vmodel
from phasefield.vit import sweep as vsweep
from phasefield.vit.train import TrainConfig, Trainer, diverged, make_points

TINY = TrainConfig(
    dataset="digits", image_size=8, patch_size=2, width=16, depth=2, epochs=3, batch_size=32, eval_batch_size=128
)


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return vdata.load("digits", 8, data_dir=str(tmp_path_factory.mktemp("data")))


@pytest.fixture(scope="module")
def small(digits):
    """A 256/128-image slice of digits: fast enough for several compiled trainings."""
    return dataclasses.replace(
        digits,
        x_train=digits.x_train[:256],
        y_train=digits.y_train[:256],
        x_test=digits.x_test[:128],
        y_test=digits.y_test[:128],
    )


@pytest.fixture(scope="module")
def trainer(small):
    return Trainer(TINY, small)


# ------------------------------------------------------------------------------ model
def test_vit_uses_the_shared_block_and_its_init_scales():
    assert vmodel.Block is shared_block.Block
    cfg = dataclasses.replace(TINY, width=32, depth=3)
    hp = cfg.hparams(np.array([0.5, 2.5]), np.array([1.0, 4.0]), 0.5, 0.5)
    x = jnp.zeros((2, 16, 4), jnp.float32)
    init = lambda h, k: vmodel.ViT(h, 10, width=32, depth=3).init(k, x)["params"]
    params = jax.jit(jax.vmap(init))(hp, jax.random.split(jax.random.PRNGKey(0), 2))
    blk = params["blocks"]["block"]
    assert blk["mlp"]["dense_0"]["kernel"].shape == (2, 3, 32, 32)  # [config, depth, d, d]
    assert blk["mlp"]["dense_0"]["kernel"].dtype == jnp.float32
    sw = np.std(np.asarray(blk["mlp"]["dense_0"]["kernel"]), axis=(1, 2, 3)) * math.sqrt(32)
    np.testing.assert_allclose(sw, [0.5, 2.5], rtol=0.08)
    sq = np.std(np.asarray(blk["attention"]["query"]["kernel"]), axis=(1, 2, 3))
    np.testing.assert_allclose(sq, np.sqrt(np.array([1.0, 4.0]) / 32), rtol=0.08)
    # one compiled forward (op by op, vmap ran ~50 programs of its own)
    out = jax.jit(jax.vmap(lambda p, h: vmodel.ViT(h, 10, width=32, depth=3).apply({"params": p}, x)))(params, hp)
    assert out.shape == (2, 2, 10) and np.all(np.isfinite(out))
    assert params["pos_embedding"].shape == (2, 16, 32) and params["cls_pos_embedding"].shape == (2, 1, 32)


def test_patchify_and_preprocess():
    imgs = np.random.default_rng(0).integers(0, 256, size=(3, 8, 8, 3)).astype(np.uint8)
    p = vmodel.patchify(jnp.asarray(imgs), 4)
    assert p.shape == (3, 4, 48)
    np.testing.assert_array_equal(np.asarray(p[1, 1]), imgs[1, 0:4, 4:8].reshape(-1))  # patch (row 0, col 1)
    np.testing.assert_array_equal(np.asarray(vmodel.unpatchify(p, 8, 4, 3)), imgs)
    pre = np.asarray(vmodel.preprocess(np.array([[[[0], [255]], [[51], [255]]]], np.uint8), 255.0, 1))
    np.testing.assert_allclose(pre.ravel(), [-1.0, 1.0, -0.6, 1.0], atol=1e-6)
    assert vmodel.n_tokens(64, 8) == 65 and vmodel.n_tokens(8, 2) == 17


# ------------------------------------------------------------------------------ data
def test_digits_prepared_once_and_cached(tmp_path):
    d = vdata.load("digits", 8, data_dir=str(tmp_path))
    assert d.x_train.shape == (1437, 8, 8, 1) and d.x_test.shape == (360, 8, 8, 1)
    assert d.num_classes == 10 and d.scale == 1.0
    assert 0.0 <= d.x_train.min() and d.x_train.max() <= 1.0
    assert set(np.unique(d.y_train)) == set(range(10))
    path = vdata.cache_path("digits", 8, str(tmp_path))
    assert os.path.exists(path)
    d2 = vdata.load("digits", 8, data_dir=str(tmp_path))
    np.testing.assert_array_equal(d.x_test, d2.x_test)
    big = vdata.load("digits", 16, data_dir=str(tmp_path))
    assert big.x_train.shape == (1437, 16, 16, 1)


def test_tfds_loading_on_mock_food101(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=5):
        d = vdata.load("food101", 16, data_dir=str(tmp_path))
    assert d.x_train.shape == (5, 16, 16, 3) and d.x_train.dtype == np.uint8
    assert d.x_test.shape[1:] == (16, 16, 3) and d.num_classes == 101 and d.scale == 255.0
    assert np.all((d.y_train >= 0) & (d.y_train < 101))
    assert os.path.exists(vdata.cache_path("food101", 16, str(tmp_path)))
    # the cache is read back without tfds
    d2 = vdata.load("food101", 16, data_dir=str(tmp_path))
    np.testing.assert_array_equal(d.x_train, d2.x_train)
    # and a full (mock-sized) training step runs on it
    cfg = TrainConfig(dataset="food101", image_size=16, patch_size=8, width=8, depth=1, epochs=1, batch_size=4)
    params, m = Trainer(cfg, d).train_many(make_points(cfg, [1.0], [1.0], [0.5], [0.5], [1e-3], [0]))
    assert m["step_loss"].shape == (1, 1, 1) and np.isfinite(m["train_loss"]).all()


def test_bad_dataset_name_is_a_one_line_error(tmp_path):
    pytest.importorskip("tensorflow_datasets")
    with pytest.raises(vdata.DataError) as exc:
        vdata.load("no_such_dataset_xyz", 8, data_dir=str(tmp_path))
    assert "\n" not in str(exc.value)


# ------------------------------------------------------------------------------ training
def test_vmapped_training_matches_one_at_a_time_and_flags_divergence(trainer):
    pts = make_points(
        TINY, [1.0, 2.0, 1.0], [1.0, 1.0, 1.0], [0.5, 0.3, 0.5], [0.5, 0.3, 0.5], [1e-2, 1e-2, 1e30], [0, 1, 0]
    )
    params, m = trainer.train_many(pts)
    assert m["step_loss"].shape == (3, TINY.epochs, 256 // 32)
    # one compiled epoch serves every epoch: the state init hands back is sharded by run like
    # an epoch's (on 2+ devices the first epoch compiled a second program for init's
    # partly replicated state; the results are bitwise the same either way)
    assert trainer._epoch._cache_size() == 1
    np.testing.assert_array_equal(diverged(m), [False, False, True])
    # training works: the loss falls well below chance (log 10 = 2.30) for a good initialization
    assert m["step_loss"][0, 0, 0] > 1.9 and m["train_loss"][0] < 1.8
    assert m["train_loss"][0] < m["step_loss"][0, 0].mean() - 0.5
    # the vmapped program trains exactly what the un-vmapped one does
    one = jax.tree.map(lambda a: a[1], pts)
    p1, m1 = trainer.train_one(one)
    np.testing.assert_allclose(m1["step_loss"], m["step_loss"][1], rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(p1["head"]["kernel"], params["head"]["kernel"][1], rtol=1e-3, atol=1e-4)
    # different seeds/points give different models
    assert np.isfinite(params["head"]["kernel"][:2]).all()  # (NaN is never allclose; the third diverged)
    assert not np.allclose(params["head"]["kernel"][0], params["head"]["kernel"][1])


def test_sweep_writes_tables_metrics_checkpoints_and_resumes(tmp_path, small, trainer, monkeypatch):
    out = str(tmp_path / "runs")
    # the lr=1e30 runs diverge; chunk=5 cuts 8 runs into two balanced chunks of 4 (not 5 + 3)
    # and 4 into one: every chunk is 4 runs, the compiled chunk programs of
    # test_vmapped_training_matches_one_at_a_time_and_flags_divergence (3 runs padded to 4)
    runs = vdesign.expand(vdesign.grid([1.0, 2.0, 3.0, 4.0], [0.5]), depths=[TINY.depth], lrs=[1e-2, 1e30])
    s = vsweep.run_sweep(TINY, runs, out, small, chunk=5, progress=False, log=lambda m: None, trainer=trainer)
    assert s["trained"] == 8 and s["diverged"] == 4
    rows = vsweep.read_results(out)
    assert len(rows) == 8 and sum(r["diverged"] for r in rows) == 4
    with open(os.path.join(out, "results.json")) as f:
        assert len(json.load(f)) == 8
    with open(os.path.join(out, "results.csv")) as f:
        assert len(f.read().strip().splitlines()) == 9
    good = [r for r in rows if not r["diverged"]][0]
    with open(os.path.join(out, "metrics", good["run"] + ".jsonl")) as f:
        lines = [json.loads(l) for l in f]
    assert sum("test_loss" in l and not l.get("final") for l in lines) == TINY.epochs
    assert lines[-1]["final"] and lines[-1]["test_loss"] == pytest.approx(good["test_loss"])
    for name in ("chunk_0001", "chunk_0002"):
        params, ids = vsweep.load_checkpoint(os.path.join(out, "checkpoints", name))
        assert len(ids) == 4 and params["head"]["kernel"].shape[0] == 4
    # resume: only the four new runs are trained
    calls = []
    orig = trainer.train_many
    monkeypatch.setattr(trainer, "train_many", lambda pts, on_epoch=None: calls.append(len(pts.lr)) or orig(pts))
    more = vdesign.expand(vdesign.grid([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [0.5]), depths=[TINY.depth], lrs=[1e-2, 1e30])
    s2 = vsweep.run_sweep(TINY, more, out, small, chunk=5, progress=False, log=lambda m: None, trainer=trainer)
    assert calls == [4] and s2["already_done"] == 8 and s2["trained"] == 4
    assert len(vsweep.read_results(out)) == 12
    # a torn last line (interrupted append) is ignored, and cut before the next append so that
    # it does not swallow the next record
    with open(os.path.join(out, "results.jsonl"), "a") as f:
        f.write('{"run": "sw9')
    assert len(vsweep.read_results(out)) == 12
    # four runs, as the resume's: the theory's vmapped program of four runs serves both
    last = vdesign.expand(vdesign.grid([7.0, 8.0], [0.5]), depths=[TINY.depth], lrs=[1e-2, 1e30])
    s3 = vsweep.run_sweep(TINY, more + last, out, small, chunk=5, progress=False, log=lambda m: None, trainer=trainer)
    assert s3["trained"] == 4 and len(vsweep.read_results(out)) == 16
    # a different training config in the same directory is refused
    with pytest.raises(vsweep.SweepError):
        vsweep.run_sweep(dataclasses.replace(TINY, epochs=2), more, out, small, progress=False)


def test_sweep_records_theory_exponents():
    cfg = TrainConfig(depth=16)
    # eight runs: the vmapped program of the first eight-run sweep above
    runs = vdesign.expand(vdesign.grid([0.3, 3.0], [0.1, 0.95]), depths=[8, 16])
    lam = vsweep.theory_exponents(cfg, runs)
    for k in ("lambda_a", "lambda_g_collapse", "lambda_g_inf"):
        assert np.all(np.isfinite(lam[k])), k
    # one point per phase at least: the grid spans ordered and chaotic initializations
    assert lam["lambda_a"].min() < 0 < lam["lambda_a"].max()
    # lambda_g is the finite-depth exponent at each run's own depth
    from phasefield.layers import paper

    for i in (0, 1):
        with jax.enable_x64(True):
            hp = cfg.hparams(
                runs[i]["sigma_w"],
                runs[i]["sigma_a"],
                runs[i]["alpha_a"],
                runs[i]["alpha_m"],
                depth=runs[i]["depth"],
                dtype=jnp.float64,
            )
        assert lam["lambda_g_collapse"][i] == pytest.approx(float(paper.exponents(hp)["lambda_g_collapse"]), abs=1e-10)
    assert runs[0]["depth"] == 8 and runs[1]["depth"] == 16


def _sharded_check(data_dir):
    """Train 3 runs on all devices (padded to 4, sharded) and on one device; same numbers.
    TINY on the ``small`` slice: on all devices, the programs of
    test_vmapped_training_matches_one_at_a_time_and_flags_divergence (3 runs too)."""
    d = vdata.load("digits", 8, data_dir=data_dir)
    d = dataclasses.replace(
        d, x_train=d.x_train[:256], y_train=d.y_train[:256], x_test=d.x_test[:128], y_test=d.y_test[:128]
    )
    cfg = TINY
    pts = make_points(cfg, [1, 2, 3], [1] * 3, [0.5] * 3, [0.5] * 3, [1e-3] * 3, [0, 1, 2])
    tr = Trainer(cfg, d)
    assert len(tr.devices) >= 2, tr.devices
    p, m = tr.train_many(pts)
    p1, m1 = Trainer(cfg, d, devices=jax.devices()[:1]).train_many(pts)
    assert m["train_loss"].shape == (3,) and p["head"]["kernel"].shape[0] == 3
    np.testing.assert_allclose(m["step_loss"], m1["step_loss"], rtol=1e-4, atol=1e-5)
    # the networks train in float32 although phasefield enables x64 for the theory
    assert p["head"]["kernel"].dtype == np.float32 and m["step_loss"].dtype == np.float32
    assert m["test_acc"].dtype == np.float32


def test_chunk_is_sharded_over_devices_and_matches_one_device(tmp_path):
    """With two (host) devices the config axis is padded, sharded and gives the same numbers.
    ``import phasefield`` exposes every core as a host device; when this process was started
    with one device (PHASEFIELD_HOST_DEVICES=1) the check runs in a subprocess with two."""
    if len(jax.devices()) >= 2:
        _sharded_check(str(tmp_path))
        return
    import subprocess
    import sys

    code = (
        f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import test_vit; "
        f"test_vit._sharded_check({str(tmp_path)!r}); print('SHARDED-OK')"
    )
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "SHARDED-OK" in r.stdout, r.stderr[-2000:]


# every preset (the paper block trains in the tests above; one compile each, ~10 s);
# scripts/train_presets.py trains them at width 32, 4 blocks, 10 epochs
@pytest.mark.parametrize(
    "spec_text",
    ["pre-ln:heads=2", "post-ln:heads=2", "rms-swiglu:heads=2", "deepscalelm:heads=2", "pre-ln:heads=2,qk_norm=true"],
)
def test_the_trainer_trains_every_preset(small, spec_text):
    """A preset's own Flax module in the ViT (digits, width 16, 2 blocks, 5 epochs, sigma =
    0.55, alpha = 0.5, Adam 1e-2): the loss is finite and falls well below chance (pre-ln and
    rms-swiglu measured 1.09 and 0.89 against chance 2.30)."""
    cfg = dataclasses.replace(TINY, block=spec_text, epochs=5).validate()
    tr = Trainer(cfg, small)
    pts = make_points(cfg, [0.55], [1.0], [0.5], [0.5], [1e-2], [0])
    params, metrics = tr.train_many(pts)
    assert np.all(np.isfinite(metrics["test_loss"])) and float(metrics["train_loss"][0]) < math.log(10) - 0.5, (
        spec_text,
        metrics["train_loss"],
    )
    # the layers' module is in the model: the attention of a block with 2 heads has W_O
    leaves = jax.tree_util.tree_leaves_with_path(params)
    assert any("out" in jax.tree_util.keystr(p) for p, _ in leaves), spec_text


def test_block_sweep_records_the_block_theory():
    from phasefield import layers

    cfg = dataclasses.replace(TINY, block="pre-ln:heads=2")
    runs = [
        dict(sigma_w=0.55, sigma_a=1.0, alpha_a=0.5, alpha_m=0.5, depth=2),
        dict(sigma_w=1.0, sigma_a=1.0, alpha_a=1.0, alpha_m=1.0, depth=3),
    ]
    lam = vsweep.theory_exponents(cfg, runs)
    for i, r in enumerate(runs):
        blk = layers.presets.get("pre-ln", heads=2, sigma=r["sigma_w"], alpha=r["alpha_a"])
        fd = layers.finite_depth(blk, q0=1.0, rho0=1.0, n_tokens=cfg.n_tokens, depth=r["depth"])
        assert lam["lambda_g_collapse"][i] == pytest.approx(float(fd["lambda_g_collapse"]), abs=1e-12)
        assert lam["angle_rate"][i] == pytest.approx(float(fd["angle_rate"]), abs=1e-12)
        assert np.isnan(lam["lambda_a"][i]) and np.isnan(lam["lambda_g_inf"][i])  # no fixed point


@pytest.mark.parametrize(
    "spec_text,msg",
    [
        ("pre-ln:sigma=1", "come from the runs"),
        ("paper:sigma_w=2", "come from the runs"),
        ("pre-ln:heads=3", "multiple of heads"),
        ("gpt-9", "unknown block"),
    ],
)
def test_bad_block_in_a_train_config(spec_text, msg):
    with pytest.raises(ValueError, match=msg):
        dataclasses.replace(TINY, block=spec_text).validate()


def test_the_progress_bar_ends_a_chunk_at_its_total():
    """Fifteen epochs of a 3-run chunk: the bar counts 0.2 runs an epoch and ends at 3 exactly
    (summed, 0.2 fifteen times is 3.0000000000000004: tqdm clamps and warns)."""
    import io
    import warnings

    from tqdm import tqdm

    bar = tqdm(total=4, initial=1, file=io.StringIO())
    on_epoch = vsweep.epoch_progress(bar, 3, 15)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for e in range(1, 16):
            on_epoch(e)
    assert bar.n == 4 and sum([0.2] * 15) > 3
    bar.close()
