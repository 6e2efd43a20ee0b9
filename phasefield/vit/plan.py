"""A training sweep from its options (``phasefield train-sweep``): the training config and the
runs, everything checked before any work (:func:`plan`), then the data loaded and the runs
trained into a locked sweep folder (:func:`train`).

Bad input is a one-line ``ValueError`` naming the option (``--width``, ``--lr`` ...).
"""

from __future__ import annotations

import numpy as np

from .. import grid
from .design import MAX_DEPTH

LR_MAX = 100.0  # Adam learning rate
EPOCHS_MAX = 100_000
SEEDS_MAX = 10_000
WIDTH_MAX = 4096
IMAGE_MAX = 1024
CHUNK_MAX = 4096
BATCH_MAX = 1 << 16
# (image size, patch size) of the datasets bundled or generated offline; batch 64
SMALL = {"digits": (8, 2), "mnist1d": (40, 4)}
OUT_BYTES = 64 << 20  # free space a sweep folder needs to start


def sizes(dataset, image_size=None, patch_size=None, batch_size=None) -> tuple[int, int, int]:
    """(image size, patch size, batch size), the unset ones at the dataset's defaults (8, 2,
    64 for digits; 40, 4, 64 for mnist1d; 64, 8, 256 otherwise)."""
    small = SMALL.get(dataset)
    return (
        image_size if image_size is not None else (small[0] if small else 64),
        patch_size if patch_size is not None else (small[1] if small else 8),
        batch_size if batch_size is not None else (64 if small else 256),
    )


def check_lrs(text) -> np.ndarray:
    """Learning rates from a range text, each in (0, :data:`LR_MAX`]."""
    lrs = grid.parse_axis(text, "lr")
    grid.check_values(dict(lr=lrs))
    if not np.all(lrs <= LR_MAX):
        raise ValueError(f"--lr must be <= {LR_MAX:g} (got {lrs.max():g})")
    return lrs


def _check_numbers(seeds, epochs, batch_size, image_size, patch_size, chunk, width, design_seed, depth) -> list[int]:
    """The sweep's sizes checked; the depths (distinct, in order) from the ``depth`` text."""
    for name, v, hi in (
        ("seeds", seeds, SEEDS_MAX),
        ("epochs", epochs, EPOCHS_MAX),
        ("batch-size", batch_size, BATCH_MAX),
        ("image-size", image_size, IMAGE_MAX),
        ("patch-size", patch_size, IMAGE_MAX),
        ("chunk", chunk, CHUNK_MAX),
    ):
        grid.check_option(f"--{name}", v, 1, hi, integer=True)
    grid.check_option("--width", width, 2, WIDTH_MAX, integer=True)
    grid.check_option("--design-seed", design_seed, 0, 2**31 - 1, integer=True)
    if image_size % patch_size:
        raise ValueError(f"--patch-size {patch_size} does not divide --image-size {image_size}")
    depths = grid.parse_axis(depth, "depth")
    if not np.all((depths >= 1) & (depths <= MAX_DEPTH) & (depths == np.round(depths))):
        raise ValueError(f"--depth must be whole numbers in [1, {MAX_DEPTH}] (got {depth})")
    return [int(d) for d in dict.fromkeys(depths.tolist())]


def refuse_varying(name: str, configs) -> None:
    """ValueError (one line) when a points file's column for a number block ``name`` does not
    have holds several values (the file format asks for the column; its values would be
    silently dropped)."""
    from .train import RUN_NUMBERS, run_mapping

    for col in ("sigma_w", "sigma_a", "alpha_a", "alpha_m"):
        values = {float(c[col]) for c in configs if col in c}
        if col not in RUN_NUMBERS[name] and len(values) > 1:
            raise ValueError(
                f"block {name} has no number for the points file's {col} ({len(values)} "
                f"values); it takes {run_mapping(name)}"
            )


def plan(
    *,
    dataset="digits",
    design="grid",
    design_seed=0,
    points_file=None,
    sigma_w="0.3:3:6",
    alpha=None,
    alpha_a=None,
    alpha_m=None,
    sigma_a="1",
    lr="1e-3",
    seeds=1,
    epochs=15,
    batch_size=None,
    depth="16",
    width=64,
    image_size=None,
    patch_size=None,
    activation="tanh",
    block="paper",
    chunk=12,
    out=None,
):
    """``(TrainConfig, runs)`` of a sweep: the configurations of ``design`` over the axes
    (range texts, :func:`phasefield.vit.design.from_axes`) or of the CSV ``points_file``,
    times the depths (a list text), learning rates and ``seeds``; ``block`` the block spec
    (its numbers set from the runs' columns). Every size is checked, and with ``out`` that
    the sweep folder can be written and a ``chunk`` of runs fits in memory, before any work."""
    from . import design as vdesign
    from . import sweep as vsweep
    from .train import TrainConfig

    image_size, patch_size, batch_size = sizes(dataset, image_size, patch_size, batch_size)
    depths = _check_numbers(seeds, epochs, batch_size, image_size, patch_size, chunk, width, design_seed, depth)
    lrs = check_lrs(lr)
    if points_file is not None:
        if design != "grid":
            raise vdesign.DesignError("give either --points or --design, not both")
        configs = vdesign.read_points(points_file)
    else:
        configs = vdesign.from_axes(design, design_seed, sigma_w, alpha, alpha_a, alpha_m, sigma_a)
    vdesign.check_configs(configs)
    runs = vdesign.expand(configs, depths, lrs.tolist(), seeds)
    cfg = TrainConfig(
        dataset=dataset,
        image_size=image_size,
        patch_size=patch_size,
        width=width,
        depth=depths[0],
        epochs=epochs,
        batch_size=batch_size,
        activation=activation,
        block=block,
    )
    cfg.validate()
    if points_file is not None:
        refuse_varying(cfg.block_spec()[0], configs)
    if out is not None:  # a foreign or unwritable folder, a size that cannot fit: before anything is created
        from .. import io

        io.check_output(out, kind="dir", need_bytes=OUT_BYTES)
        vsweep.check_size(cfg, runs, chunk)
    return cfg, runs


def train(cfg, runs, out, chunk=12, data_dir=None, tfds_dir=None, download=False, progress=True, log=print) -> dict:
    """Train the ``runs`` of a :func:`plan` into the sweep folder ``out`` (locked while it
    runs; finished runs are kept and skipped on a rerun): loads the dataset, then
    :func:`phasefield.vit.sweep.run_sweep`. Its summary, with ``out`` and ``runs_in_table``."""
    from .. import io
    from . import data as vdata
    from . import sweep as vsweep

    ds = vdata.load(cfg.dataset, cfg.image_size, data_dir=data_dir, tfds_dir=tfds_dir, download=download)
    with io.dir_lock(out):
        summary = vsweep.run_sweep(cfg, runs, out, ds, chunk=chunk, progress=progress, log=log)
    summary.update(out=out, runs_in_table=len(vsweep.read_results(out)))
    return summary
