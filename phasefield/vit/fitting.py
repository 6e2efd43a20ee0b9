"""Fitting the loss model to trained sweeps (``phasefield fit``): the runs of one or more
sweeps of one training config pooled, one fit (:func:`phasefield.vit.predict.fit_sweep`)
per learning rate, written as JSON and the paper's Fig. 7.

Bad input is a one-line ``ValueError`` naming the option (``--folds``, ``--lr`` ...).
"""

from __future__ import annotations

import math
import os

from .. import grid, io
from .plan import LR_MAX


def pool(sources) -> tuple[list, dict, list]:
    """(rows, the first sweep's sweep.json, the sweep folders) of the sweep folders or result
    tables ``sources``; they must share one training config."""
    from . import predict as vpredict
    from . import sweep as vsweep
    from .train import TrainConfig

    rows, metas, dirs = [], [], []
    for src in sources:
        rows += vpredict.load_rows(src)
        sweep_dir = src if os.path.isdir(src) else os.path.dirname(os.path.abspath(src))
        try:
            meta = vsweep.read_sweep(sweep_dir)
        except (OSError, ValueError):
            meta = {}
        if not meta.get("config"):
            raise ValueError(f"{sweep_dir} has no sweep.json: fit needs the sweep's training config")
        if metas and TrainConfig.from_dict(meta["config"]) != TrainConfig.from_dict(metas[0]["config"]):
            raise ValueError(
                f"{sweep_dir} was trained with another config than {dirs[0]}: "
                "only sweeps of one training config can be pooled"
            )
        metas.append(meta)
        dirs.append(sweep_dir)
    return rows, metas[0], dirs


def _check_block(block: str, cfg, where: str) -> None:
    """The runs' block is ``block`` (a spec naming the block, not its numbers)."""
    from ..layers import spec

    name, fixed = spec.parse(block)
    if fixed and set(fixed) & set(spec.NUMBERS[name]):
        raise ValueError("fit --block names the block, not its numbers (those come from the runs)")
    if spec.parse(cfg.block) != (name, fixed):
        raise ValueError(f"the runs in {where} were trained with block {cfg.block}, not {block}")


def _same_lr(r, lr) -> bool:
    return r.get("lr") is not None and math.isclose(float(r["lr"]), lr, rel_tol=1e-9)


def _learning_rates(rows, only_lr, per_lr) -> tuple[list, list]:
    """(rows, learning rates to fit): one, unless ``per_lr``."""
    lrs = sorted({float(r["lr"]) for r in rows if r.get("lr") is not None})
    if only_lr is not None:
        rows = [r for r in rows if _same_lr(r, only_lr)]
        lrs = [only_lr]
    if len(lrs) > 1 and not per_lr:
        raise ValueError(
            f"the table mixes learning rates ({', '.join(f'{v:g}' for v in lrs)}): "
            "pass --per-lr to fit each separately, or --lr to pick one"
        )
    return rows, lrs


def fit_runs(
    sources,
    folds=5,
    repeats=5,
    num_classes=None,
    only_lr=None,
    per_lr=False,
    block=None,
    nested=True,
    out=None,
    figure=None,
    echo=print,
) -> dict:
    """``{learning rate: fit document}`` of the runs in ``sources`` (sweep folders or result
    tables of one training config): k = ``folds`` fold CV over configurations, ``repeats``
    times; ``only_lr`` fits the runs of one learning rate, ``per_lr`` each of a mixed table;
    ``block`` (a spec) must be the runs' block. Each document is written to ``out`` and its
    Fig. 7 to ``figure`` (``_lr<value>`` added to the names for several learning rates);
    ``echo(line)`` gets a note for a figure not drawn. The outputs are checked first."""
    from . import features as vfeatures
    from . import predict as vpredict
    from .train import TrainConfig

    if figure is not None:
        io.check_output(figure, "--figure")
    grid.check_option("--folds", folds, 2, 100, integer=True)
    grid.check_option("--repeats", repeats, 1, 1000, integer=True)
    if num_classes is not None:
        grid.check_option("--num-classes", num_classes, 2, 1_000_000, integer=True)
    if only_lr is not None:
        grid.check_option("--lr", only_lr, 0.0, LR_MAX, lo_open=True)
    if out is not None:
        io.check_output(out)
    rows, meta, dirs = pool(sources)
    cfg = TrainConfig.from_dict(meta["config"])
    if block is not None:
        _check_block(block, cfg, dirs[0])
    num_classes = num_classes or meta.get("num_classes")
    if not num_classes:
        raise ValueError("cannot tell the number of classes: pass --num-classes")
    rows, lrs = _learning_rates(rows, only_lr, per_lr)
    geometry, feats, order = vfeatures.read_caches(dirs, cfg)
    docs = {}
    for lr in lrs:
        part = [r for r in rows if math.isclose(float(r["lr"]), lr, rel_tol=1e-9)]
        docs[lr] = vpredict.fit_sweep(
            part, int(num_classes), cfg, geometry, feats, order, k=folds, repeats=repeats, nested_cv=nested
        )
    for lr, doc in docs.items():
        _write(doc, lr, len(docs) > 1, out, figure, cfg.dataset, echo)
    return docs


def _write(doc, lr, several, out, figure, dataset, echo) -> None:
    """The fit document to ``out`` and its figure to ``figure`` (either may be None)."""
    if out is not None:
        base, ext = os.path.splitext(out)
        path = f"{base}_lr{lr:g}{ext}" if several else out
        text = io.dumps(doc, indent=1)  # RFC 8259: NaN -> null
        with io.atomic_path(path) as tmp:
            with open(tmp, "w") as f:
                f.write(text)
    if figure is not None:
        path = f"{os.path.splitext(figure)[0]}_lr{lr:g}.png" if several else figure
        if doc["report"].get("cross_validated", True):
            from . import figure as vfigure

            with io.atomic_path(path) as tmp:
                vfigure.fig7(doc["report"], tmp, dataset=dataset)
        else:
            echo(f"no figure {path}: the fit was not cross-validated")
