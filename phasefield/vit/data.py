"""Image-classification data, prepared once into arrays on disk.

``load(name, image_size, data_dir)`` returns a :class:`Data` with images already resized to
``image_size x image_size`` and stored compactly (uint8 for tfds data, float32 in [0, 1] for
the bundled ``digits``); the paper's preprocessing (x/scale - .5) * 2 and the split into
patches happen on the fly inside the compiled training step (:func:`phasefield.vit.model.
preprocess`), so a 75,750-image Food-101 train split at 64x64 is 0.9 GB on disk instead of
3.7 GB.

Sources
  ``digits``       scikit-learn's bundled 8x8 grey digits (1797 images, offline); a fixed
                   stratified 80/20 train/test split (seed 0).
  ``mnist1d``      MNIST-1D (Greydanus 2020), generated procedurally by the optional
                   ``mnist1d`` package (``pip install 'phasefield[mnist1d]'``; no download):
                   its default set, 4000 train / 1000 test signals of 40 samples, 10 classes,
                   scaled by the train set's range to [0, 1] and stored as [N, 40, 1, 1] (a
                   1-D signal: the ViT cuts it into patches of ``patch_size`` samples).
  any other name   a tensorflow-datasets image-classification dataset (``food101`` for the
                   paper), read with ``tfds.data_source`` (no TensorFlow needed); the test
                   split is ``test`` when the dataset has one, else ``validation``.
The prepared arrays are cached as ``<data_dir>/<name>_<size>px.npz`` (written atomically).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .. import io

ONE_D = {"mnist1d": 40}  # 1-D data sets and their signal length

DEFAULT_DATA_DIR = os.environ.get(
    "PHASEFIELD_DATA", os.path.join(os.path.expanduser("~"), ".cache", "phasefield", "data")
)


class DataError(ValueError):
    """The dataset cannot be loaded or prepared (one-line message)."""


@dataclass(frozen=True)
class Data:
    x_train: np.ndarray  # [N, H, W, C] uint8 or float32
    y_train: np.ndarray  # [N] int32
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    scale: float  # pixel value of white: 255 for uint8, 1 for float
    name: str = ""

    @property
    def image_size(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def channels(self) -> int:
        return int(self.x_train.shape[3])


def resize(images: np.ndarray, size: int) -> np.ndarray:
    """Bilinear (antialiased) resize of one [H, W, C] image to [size, size, C] with Pillow."""
    from PIL import Image

    img = np.asarray(images)
    if img.shape[0] == size and img.shape[1] == size:
        return img
    if img.dtype == np.uint8:
        chans = [
            np.asarray(Image.fromarray(img[..., c]).resize((size, size), Image.BILINEAR)) for c in range(img.shape[-1])
        ]
        return np.stack(chans, axis=-1).astype(np.uint8)
    chans = [
        np.asarray(Image.fromarray(img[..., c].astype(np.float32), mode="F").resize((size, size), Image.BILINEAR))
        for c in range(img.shape[-1])
    ]
    return np.stack(chans, axis=-1).astype(np.float32)


def _digits(size: int) -> Data:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0)[..., None]  # [1797, 8, 8, 1] in [0, 1]
    if size != 8:
        x = np.stack([np.clip(resize(im, size), 0.0, 1.0) for im in x])
    y = d.target.astype(np.int32)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    return Data(xtr, ytr, xte, yte, 10, 1.0, "digits")


def _mnist1d(size: int) -> Data:
    if size != ONE_D["mnist1d"]:
        raise DataError(
            f"mnist1d signals have {ONE_D['mnist1d']} samples: use image size {ONE_D['mnist1d']} (got {size})"
        )
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError:
        raise DataError("the mnist1d data set needs the optional package: pip install 'phasefield[mnist1d]'") from None
    d = make_dataset(get_dataset_args())  # the package's default set (its seed 42)
    lo, hi = float(np.min(d["x"])), float(np.max(d["x"]))
    scaled = lambda a: ((np.asarray(a, np.float64) - lo) / (hi - lo)).astype(np.float32)[:, :, None, None]
    return Data(
        scaled(d["x"]),
        np.asarray(d["y"], np.int32),
        scaled(d["x_test"]),
        np.asarray(d["y_test"], np.int32),
        10,
        1.0,
        "mnist1d",
    )


def _tfds_split(name: str, split: str, size: int, data_dir, download: bool):
    import tensorflow_datasets as tfds

    ds = tfds.data_source(name, split=split, data_dir=data_dir, download=download)
    n = len(ds)
    xs = np.empty((n, size, size, 0), np.uint8)
    ys = np.empty((n,), np.int32)
    for i in range(n):
        ex = ds[i]
        img = np.asarray(ex["image"])
        if img.ndim == 2:
            img = img[..., None]
        if i == 0:
            xs = np.empty((n, size, size, img.shape[-1]), np.uint8)
        if img.dtype != np.uint8:
            raise DataError(f"dataset {name!r}: expected uint8 images, got {img.dtype}")
        xs[i] = resize(img, size)
        ys[i] = int(ex["label"])
    return xs, ys


def _tfds(name: str, size: int, data_dir=None, download: bool = False) -> Data:
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise DataError(
            f"dataset {name!r} needs tensorflow-datasets (pip install 'phasefield[train]'); "
            "the bundled 'digits' works offline"
        ) from None
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as exc:  # unknown name
        raise DataError(f"unknown tensorflow-datasets dataset {name!r}: {str(exc).splitlines()[0]}") from None
    feats = builder.info.features
    if "image" not in feats or "label" not in feats or not hasattr(feats["label"], "num_classes"):
        raise DataError(
            f"dataset {name!r} is not an image-classification dataset (needs 'image' and a ClassLabel 'label')"
        )
    num_classes = int(feats["label"].num_classes)
    splits = set(builder.info.splits.keys()) if builder.info.splits else set()
    test = "test" if ("test" in splits or not splits) else "validation"
    try:
        xtr, ytr = _tfds_split(name, "train", size, data_dir, download)
        try:
            xte, yte = _tfds_split(name, test, size, data_dir, download)
        except Exception:
            if test == "validation" or splits:
                raise
            xte, yte = _tfds_split(name, "validation", size, data_dir, download)
    except DataError:
        raise
    except Exception as exc:
        raise DataError(
            f"cannot read dataset {name!r} (prepare it with tfds first, or pass --download): "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    return Data(xtr, ytr, xte, yte, num_classes, 255.0, name)


def cache_path(name: str, size: int, data_dir=None) -> str:
    return os.path.join(data_dir or DEFAULT_DATA_DIR, f"{name.replace('/', '_').replace(':', '_')}_{size}px.npz")


def load(
    name: str = "digits", image_size: int = 8, data_dir=None, tfds_dir=None, download: bool = False, cache: bool = True
) -> Data:
    """Load ``name`` resized to ``image_size``, from the .npz cache or by preparing it once."""
    if image_size < 1:
        raise DataError(f"image size must be >= 1 (got {image_size})")
    path = cache_path(name, image_size, data_dir)
    if cache and os.path.exists(path):
        with np.load(path) as z:
            return Data(
                z["x_train"], z["y_train"], z["x_test"], z["y_test"], int(z["num_classes"]), float(z["scale"]), name
            )
    if name == "digits":
        data = _digits(image_size)
    elif name == "mnist1d":
        data = _mnist1d(image_size)
    else:
        data = _tfds(name, image_size, tfds_dir, download)
    if cache:
        with io.atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.savez(
                    f,
                    x_train=data.x_train,
                    y_train=data.y_train,
                    x_test=data.x_test,
                    y_test=data.y_test,
                    num_classes=data.num_classes,
                    scale=data.scale,
                )
    return data
