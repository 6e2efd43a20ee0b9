"""MNIST-1D: the loader, 1-D patches, the token count and the trainer. The
loader's pipeline runs against a stand-in ``mnist1d`` package everywhere; the real package
(the optional extra ``phasefield[mnist1d]``) is tested when present."""

from __future__ import annotations

import dataclasses
import math
import sys
import types

import numpy as np
import pytest

from phasefield.vit import data as vdata
from phasefield.vit.model import n_tokens, patchify, preprocess
from phasefield.vit.train import TrainConfig, Trainer, make_points

CFG = TrainConfig(
    dataset="mnist1d", image_size=40, patch_size=4, width=16, depth=2, epochs=4, batch_size=32, eval_batch_size=256
)


def _stand_in(monkeypatch, n=120, m=40):
    rng = np.random.default_rng(0)
    fake = dict(
        x=rng.normal(size=(n, 40)) * 2.0,
        y=rng.integers(0, 10, n),
        x_test=rng.normal(size=(m, 40)) * 2.0,
        y_test=rng.integers(0, 10, m),
        t=np.linspace(0, 1, 40),
    )
    pkg, mod = types.ModuleType("mnist1d"), types.ModuleType("mnist1d.data")
    mod.get_dataset_args = lambda: None
    mod.make_dataset = lambda args: fake
    pkg.data = mod
    monkeypatch.setitem(sys.modules, "mnist1d", pkg)
    monkeypatch.setitem(sys.modules, "mnist1d.data", mod)
    return fake


def test_loader_scales_stores_and_caches_a_1d_signal(monkeypatch, tmp_path):
    fake = _stand_in(monkeypatch)
    d = vdata.load("mnist1d", 40, data_dir=str(tmp_path))
    assert d.x_train.shape == (120, 40, 1, 1) and d.x_test.shape == (40, 40, 1, 1) and d.image_size == 40
    assert d.x_train.min() == 0.0 and d.x_train.max() == 1.0 and d.num_classes == 10 and d.scale == 1.0
    lo, hi = fake["x"].min(), fake["x"].max()  # the test set uses the train set's range
    np.testing.assert_allclose(d.x_test[:, :, 0, 0], (fake["x_test"] - lo) / (hi - lo), rtol=1e-6)
    again = vdata.load("mnist1d", 40, data_dir=str(tmp_path))  # from the .npz cache
    np.testing.assert_array_equal(again.x_train, d.x_train)
    with pytest.raises(vdata.DataError, match="40 samples"):
        vdata.load("mnist1d", 32, data_dir=str(tmp_path), cache=False)


def test_missing_package_is_a_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "mnist1d", None)
    monkeypatch.setitem(sys.modules, "mnist1d.data", None)
    with pytest.raises(vdata.DataError, match=r"pip install 'phasefield\[mnist1d\]'"):
        vdata.load("mnist1d", 40, data_dir=str(tmp_path), cache=False)


def test_1d_patches_and_tokens():
    x = np.arange(2 * 40, dtype=np.float32).reshape(2, 40, 1, 1)
    p = np.asarray(patchify(x, 4))
    np.testing.assert_array_equal(p, x.reshape(2, 10, 4))  # consecutive samples per patch
    assert CFG.n_tokens == n_tokens(40, 4, dims=1) == 11 and TrainConfig().n_tokens == 17
    img = np.arange(8 * 8, dtype=np.float32).reshape(1, 8, 8, 1)  # 2-D images unchanged
    assert np.asarray(patchify(img, 2)).shape == (1, 16, 4)
    assert np.asarray(preprocess(x, 1.0, 4)).shape == (2, 10, 4)


def test_the_vit_trains_on_mnist1d():
    """The real data set (optional extra): a width-16, 2-block ViT learns it (4 epochs, Adam
    1e-2 on 1024 signals: the train loss falls below chance - 0.3)."""
    pytest.importorskip("mnist1d")
    d = vdata.load("mnist1d", 40, cache=False)
    assert d.x_train.shape == (4000, 40, 1, 1) and d.x_test.shape == (1000, 40, 1, 1)
    small = dataclasses.replace(
        d, x_train=d.x_train[:1024], y_train=d.y_train[:1024], x_test=d.x_test[:256], y_test=d.y_test[:256]
    )
    tr = Trainer(CFG, small)
    _, m = tr.train_many(make_points(CFG, [1.0], [1.0], [0.5], [0.5], [1e-2], [0]))
    assert np.isfinite(float(m["test_loss"][0, -1])) and float(m["train_loss"][0]) < math.log(10) - 0.3, m["train_loss"]
