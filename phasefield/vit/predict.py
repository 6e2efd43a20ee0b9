"""The loss predictor: fit a sweep, ship the best honest model, predict at any point.

``fit_sweep(rows, ...)`` runs the cross-validated analysis of :mod:`phasefield.vit.analysis`
on a training sweep and returns a *fit document*: the report (every model's CV scores, the
noise floor, the transfer tests, the nested CV of the shipping procedure) plus the best model
by cross-validated RMSE among every family (exponents, raw hyperparameters, hybrids,
two-part P(trains) x loss) whose features predict computes cheaply, refitted on all
configurations, with

* its family, form, features, parameters (:mod:`phasefield.vit.models`, JSON-serializable),
* the training config and the measured input geometry it was fitted for,
* a prediction interval for one run's loss: split-conformal quantiles of the out-of-fold
  residuals of single runs, per bin of the predicted loss (:func:`analysis.conformal`), or
  (``interval="scaled"``, the paper block's shipped model) normalized by a local scale that
  follows the configuration (:func:`analysis.conformal_scaled`), and its coverage under
  nested cross-validation over configurations,
* the region it was fitted on (ranges of the raw hyperparameters and of its features),
* its failure model (``failure``, :mod:`phasefield.vit.failure`): P(one run fails to train,
  i.e. diverges or ends within 5 % of chance), Platt scaling of the loss model's
  out-of-fold predictions. ``predict`` reports it beside the loss: the loss is the expected
  loss of one run (failures included at their loss), P(fail) the chance that the run is one
  of those failures.

With fewer than 10 configurations nothing can be cross-validated: a fixed model is fitted
and the document says so. The study's document ships inside the package
(``trainability_model.json``); :func:`predict` uses it unless given another, computes only
the features the model uses, and adds a ``warnings`` list when the point lies outside the
fitted region.
"""

from __future__ import annotations

import functools
import json
import os
from importlib import resources

import numpy as np

from .. import io
from . import analysis
from . import features as F
from . import models as M

RESOURCE = "trainability_model.json"
# the shipped model of each block: the paper block's, and one per standard block fitted on its
# digits study (docs/training.md, "Standard blocks"); each file's "provenance" object records
# its data, procedure, regenerating command, version and date (phasefield.vit.study.provenance)
BLOCK_RESOURCES = {
    "paper": RESOURCE,
    "pre-ln": "trainability_model_pre-ln.json",
    "post-ln": "trainability_model_post-ln.json",
}
RAW_RANGES = ("sigma_w", "sigma_a", "alpha_a", "alpha_m", "depth")


class FitError(ValueError):
    """Not enough or malformed data to fit, or a malformed fit file (one-line message)."""


# ---------------------------------------------------------------------------- main entry
def load_rows(path: str) -> list[dict]:
    """Rows of a results table: a sweep directory, results.json(l) or results.csv."""
    if os.path.isdir(path):
        for name in ("results.jsonl", "results.json", "results.csv"):
            if os.path.exists(os.path.join(path, name)):
                if name == "results.jsonl":
                    from .sweep import read_results

                    return read_results(path)
                path = os.path.join(path, name)
                break
        else:
            raise FitError(f"{path} holds no results table (results.jsonl/.json/.csv)")
    if not os.path.exists(path):
        raise FitError(f"no such file or directory: {path}")
    try:
        if path.endswith(".csv"):
            import csv

            with open(path) as f:
                rows = [{k: _num(v) for k, v in r.items()} for r in csv.DictReader(f)]
        elif path.endswith(".jsonl"):
            with open(path) as f:
                rows = [io.loads_json(l, f"line {i + 1}") for i, l in enumerate(f) if l.strip()]
        else:
            rows = io.read_json(path, "the file")
    except (OSError, ValueError) as exc:  # unreadable, malformed, too large or too deep (io.read_json)
        raise FitError(f"cannot read results table {path}: {exc}") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise FitError(f"{path} is not a results table (a list of runs)")
    return rows


def _num(v):
    if v in ("", None):
        return None
    if v in ("True", "False"):
        return v == "True"
    try:
        return float(v)
    except ValueError:
        return v


def configs_of(rows: list[dict]) -> tuple[list[str], list[dict]]:
    from .design import config_id

    seen = {}
    for r in rows:
        cid = config_id(r)
        if cid not in seen:
            seen[cid] = {k: float(r[k]) for k in ("sigma_w", "sigma_a", "alpha_a", "alpha_m", "lr")}
            seen[cid]["depth"] = int(r["depth"])
    return list(seen), list(seen.values())


def fit_sweep(
    rows: list[dict],
    num_classes: int,
    cfg,
    geometry: dict,
    feats: dict | None = None,
    order: list[str] | None = None,
    k: int = 5,
    repeats: int = 5,
    progress: bool = False,
    nested_cv: bool = True,
    interval: str = "binned",
) -> dict:
    """The fit document of a sweep (see the module doc). ``feats``/``order``: precomputed
    theory features aligned with config ids (else computed here, one compiled program per
    depth). ``geometry``: the input geometry (q0, rho0) the features start from.
    ``interval``: "binned" or "scaled" (:func:`phasefield.vit.analysis.make_interval`)."""
    for c in ("sigma_w", "sigma_a", "alpha_a", "alpha_m", "lr", "depth", "test_loss"):
        if rows and c not in rows[0]:
            raise FitError(f"results table has no column {c!r}")
    rows = [
        r
        for r in rows
        if all(r.get(c) is not None for c in ("sigma_w", "sigma_a", "alpha_a", "alpha_m", "lr", "depth"))
    ]
    lrs = sorted({float(r["lr"]) for r in rows})
    if len(lrs) > 1:
        raise FitError(
            f"the table mixes learning rates {', '.join(f'{v:g}' for v in lrs)}; "
            "fit each separately (--per-lr) or select one"
        )
    ids, configs = configs_of(rows)
    if feats is None:
        order, feats = ids, F.features(cfg, configs, geometry["q0"], geometry["rho0"])
    else:  # a cache (the study's features.csv) that lacks configurations trained since
        have = set(order)
        todo = [c for cid, c in zip(ids, configs) if cid not in have]
        if todo:
            new = F.features(cfg, todo, geometry["q0"], geometry["rho0"])
            if set(new) == set(feats):
                order = list(order) + [cid for cid in ids if cid not in have]
                feats = {k: np.concatenate([np.asarray(feats[k]), np.asarray(new[k])]) for k in feats}
            else:  # a cache of other columns: compute every configuration's features afresh
                order, feats = ids, F.features(cfg, configs, geometry["q0"], geometry["rho0"])
    try:
        report = analysis.analyze(
            rows, num_classes, feats, order, k=k, repeats=repeats, nested_cv=nested_cv, interval=interval
        )
    except analysis.AnalysisError as exc:
        raise FitError(str(exc)) from None
    return dict(report=report, model=best_model(report, cfg, geometry))


def best_model(report: dict, cfg, geometry: dict, name: str | None = None) -> dict:
    """The model document of ``name`` (default: the report's best model by CV RMSE among the
    models predict computes cheaply, whatever its family), refitted on every configuration of
    the report's table, with its conformal interval."""
    name = name or report.get("best_model") or report["best_exponent_model"]
    tab = {
        k: (np.asarray(v) if isinstance(v, list) and k not in analysis.LISTS else v) for k, v in report["table"].items()
    }
    spec = analysis.model_specs(tab)[name] if report.get("cross_validated", True) else analysis.model_specs(tab)[name]
    model = analysis.fit_model(spec, tab)
    m = report["models"][name]
    if name == report.get("best_model") and "interval" in report:
        interval = report["interval"]
    else:
        interval = analysis.conformal(np.asarray(m["oof"]), tab["run_losses"])
    X = np.stack([tab[f] for f in spec[1]], 1) if spec[1] else np.zeros((len(tab["loss"]), 0))
    region = {k: [float(np.min(tab[k])), float(np.max(tab[k]))] for k in RAW_RANGES}
    region.update({f: [float(np.min(X[:, i])), float(np.max(X[:, i]))] for i, f in enumerate(spec[1])})
    nest = report.get("nested") or {}
    fail = (
        failure_doc(
            np.asarray(m["oof"]),
            tab["run_failed"],
            report["L_sat"],
            name,
            cross_validated=report.get("cross_validated", True),
        )
        if "run_failed" in tab
        else None
    )
    return dict(
        block=cfg.block_spec()[0],
        name=name,
        family=m["group"],
        kind=m["kind"],
        model=model.to_json(),
        features=list(spec[1]),
        target="test_loss",
        L_sat=report["L_sat"],
        lr=report["lr"],
        train_config=cfg.to_dict(),
        n_tokens=cfg.n_tokens,
        input_geometry=geometry,
        region=region,
        interval=interval,
        cv=dict(
            rmse=m["cv_rmse"],
            rmse_sd=m["cv_rmse_sd"],
            r2=m["cv_r2"],
            k_folds=report["k_folds"],
            repeats=report["repeats"],
            cross_validated=report.get("cross_validated", True),
            nested_r2=nest.get("r2"),
            nested_coverage_runs=nest.get("coverage_runs"),
            nested_coverage_means=nest.get("coverage_means"),
        ),
        noise_floor=report["noise_floor"]["rmse"],
        n_configs=report["n_configs"],
        n_runs=report["n_runs"],
        message=report.get("message"),
        candidates=list(report.get("shippable") or [name]),
        candidate_cv_rmse={
            c: report["models"][c]["cv_rmse"] for c in report.get("shippable") or [] if c in report["models"]
        },
        failure=fail,
    )


def failure_doc(oof, run_failed, l_sat: float, loss_model: str, cross_validated: bool = True) -> dict:
    """The failure part of a model document: :func:`phasefield.vit.failure.fit_platt` on the
    loss model's out-of-fold predictions ``oof`` (one per configuration) and the runs'
    outcomes ``run_failed`` (the criterion of :func:`analysis.at_chance`)."""
    from . import failure

    platt = failure.fit_platt(oof, run_failed)
    n_runs = int(sum(len(r) for r in run_failed))
    return dict(
        name=failure.SHIPPED,
        model=platt.to_json(),
        loss_model=loss_model,
        criterion=f"diverged, or final test loss >= {analysis.CHANCE_FRACTION:g} log C "
        f"(= {analysis.CHANCE_FRACTION * l_sat:.4f})",
        chance_fraction=analysis.CHANCE_FRACTION,
        threshold_loss=analysis.CHANCE_FRACTION * l_sat,
        n_configs=len(run_failed),
        n_runs=n_runs,
        n_failed=int(sum(sum(r) for r in run_failed)),
        calibrated_on="out-of-fold predictions" if cross_validated else "in-sample predictions (optimistic)",
    )


def p_fail(doc: dict, predicted_loss) -> np.ndarray | None:
    """P(fails to train) at predicted losses (None when ``doc`` has no failure model: a fit
    file written before it existed)."""
    fail = doc.get("failure")
    if not fail:
        return None
    from . import failure

    m = failure.from_json(fail["model"])
    return m.predict_proba(np.asarray(predicted_loss, float).reshape(-1, 1))


def block_of(doc: dict) -> str:
    """The block a model document was fitted on (its training runs' ``block``; "paper")."""
    return doc.get("train_config", {}).get("block", "paper")


def _spec(text: str) -> tuple[str, dict]:
    from ..layers import registry, spec

    return (text, {}) if text in registry.names() else spec.parse(text)


def closed_form(block: str) -> bool:
    """Whether the block spelled ``block`` (a model's :func:`block_of`) is a preset's bare
    name whose preset has its own closed-form engine
    (:attr:`phasefield.layers.registry.Preset.fast_engine`)."""
    from ..layers import registry

    return block in registry.names() and registry.lookup(block).fast_engine


def shipped_blocks() -> list[str]:
    """The blocks with a model shipped inside the package (:data:`BLOCK_RESOURCES`)."""
    return [b for b, r in BLOCK_RESOURCES.items() if resources.files(__package__).joinpath(r).is_file()]


def check_block(doc: dict, block: str, where: str = "the model") -> None:
    """FitError (one line) unless ``block`` (``NAME[:k=v,...]``; keywords left out take the
    fitted ones) names the block ``doc`` was fitted on."""
    fitted = block_of(doc)
    name, kw = _spec(block)
    fname, fkw = _spec(fitted)
    if name != fname or any(fkw.get(k) != v for k, v in kw.items()):
        raise FitError(f"{where} was fitted on {fitted!r} runs, not {block!r}: it predicts only for its own block")


def load_model(path: str | None = None, block: str | None = None) -> dict:
    """A model document: ``path`` (a fit file written by ``phasefield fit``, or its ``model``
    part) or, by default, the one shipped with phasefield for ``block`` (default the paper
    block; :func:`shipped_blocks`). With ``block`` and ``path`` both given, a fit of another
    block is refused (FitError, one line). A shipped file's ``provenance`` (where it came from)
    is kept in the document and plays no part in a prediction."""
    try:
        if path is None:
            name = _spec(block or "paper")[0]
            if name not in shipped_blocks():
                raise FitError(
                    f"no shipped model for block {name} (shipped: {', '.join(shipped_blocks())}): train "
                    f"runs (phasefield train-sweep --block {name} --axis sigma=LO:HI:N --out DIR), fit them "
                    "(phasefield fit --runs DIR --out model.json) and pass --fit model.json"
                )
            resource = BLOCK_RESOURCES[name]
            text = resources.files(__package__).joinpath(resource).read_text()
            where = f"the packaged {resource}"
        else:
            with open(path) as f:
                text = f.read(io.JSON_MAX_BYTES + 1)
            where = path
        doc = io.loads_json(text, where)
    except OSError as exc:
        raise FitError(f"cannot read fit file {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise FitError(f"{where} is not a fit file (not JSON)") from None
    except ValueError as exc:  # too large or nested too deep (io.loads_json)
        raise FitError(str(exc)) from None
    if isinstance(doc, dict) and "model" in doc and isinstance(doc["model"], dict) and "report" in doc:
        doc = doc["model"]
    need = {"model", "features", "L_sat", "train_config", "input_geometry", "interval", "region"}
    if not isinstance(doc, dict) or not need <= set(doc):
        raise FitError(f"{where} is not a fit file written by 'phasefield fit'")
    try:
        M.from_json(doc["model"])
        if isinstance(doc["interval"], dict) and "scale" in doc["interval"]:
            M.from_json(doc["interval"]["scale"])
        if doc.get("failure"):
            from . import failure

            failure.from_json(doc["failure"]["model"])
    except (KeyError, TypeError, ValueError):
        raise FitError(f"{where}: malformed model parameters") from None
    if block is not None:
        check_block(doc, block, where)
    return doc


# ---------------------------------------------------------------------------- features
COLLAPSED = ("lambda_a", "lambda_g_collapse", "L_lambda_a", "L_lambda_g_collapse")


@functools.cache
def compiled_collapsed():
    """jit(vmap) of the two collapsed-point exponents alone: lambda_a and the closed form
    lambda_g(L) (depth is a traced leaf: one program serves every depth)."""
    import jax

    from ..layers import registry

    paper = registry.lookup("paper").engine.namespace

    def one(hp):
        la = paper.angle_exponent(hp)
        return la, paper.gradient_exponent_collapsed(hp, lambda_a=la)

    return jax.jit(jax.vmap(one))


def collapsed_exponents(cfg, sigma_w, sigma_a, alpha_a, alpha_m, depth) -> tuple[np.ndarray, np.ndarray]:
    """(lambda_a, lambda_g(L)) at the collapsed point, as :func:`phasefield.layers.paper.exponents`
    gives them, without its fixed-point and multistability searches (1-d arrays; points are
    padded to a power of two so that few batch sizes are ever compiled)."""
    import jax
    import jax.numpy as jnp

    vals = np.broadcast_arrays(
        *(np.atleast_1d(np.asarray(v, float)) for v in (sigma_w, sigma_a, alpha_a, alpha_m, depth))
    )
    n = len(vals[0])
    m = 1 << max(0, (n - 1).bit_length())
    vals = [np.pad(v, (0, m - n), mode="edge") for v in vals]
    with jax.enable_x64(True):
        hp = cfg.hparams(*vals[:4], depth=vals[4], dtype=jnp.float64)
        la, lg = jax.device_get(compiled_collapsed()(hp))
    return np.asarray(la, float)[:n], np.asarray(lg, float)[:n]


def model_features(doc: dict, configs: list[dict], cfg=None, reference: bool = False) -> dict:
    """The columns a model needs at ``configs`` ({name: array}), plus lambda_a and lambda_g_collapse:
    raw hyperparameters as given, the effective depths (L alpha^2 per branch and their sum),
    collapsed exponents (and L * lambda) from :func:`collapsed_exponents` (for a model fitted on
    the runs of a block without a closed-form engine, that block's lambda_a (NaN where it has no
    fixed point), angle_rate (the finite-depth angle rate from collapsed tokens) and
    lambda_g_collapse, and L times each, with the model's
    ``attention``: by the uniform-attention route of :func:`phasefield.vit.block_rates.rates`,
    or, where it does not serve or with ``reference``, by
    :func:`phasefield.vit.features.block_theory`, which integrates the exact map at every
    layer; the same numbers to ~1e-14), and only when the model asks for them the
    input-geometry features of :func:`phasefield.vit.features.features` (a trajectory of L
    blocks per point)."""
    from .train import TrainConfig

    cfg = TrainConfig.from_dict(doc["train_config"]) if cfg is None else cfg
    col = lambda k: np.array([float(c[k]) for c in configs])
    out = {k: col(k) for k in RAW_RANGES}
    L = out["depth"]
    if cfg.preset().fast_engine:
        la, lg = collapsed_exponents(cfg, out["sigma_w"], out["sigma_a"], out["alpha_a"], out["alpha_m"], L)
    else:  # a model fitted on runs of another block: that block's theory point (one program per depth)
        from .block_rates import rates

        th = None if reference else rates(cfg, configs, doc.get("attention"))
        if th is None:
            th = F.block_theory(cfg, configs, doc.get("attention"))
        la, lg = th["lambda_a"], th["lambda_g_collapse"]
        out.update(angle_rate=th["angle_rate"], L_angle_rate=L * th["angle_rate"])
    out.update(
        lambda_a=la,
        lambda_g_collapse=lg,
        L_lambda_a=L * la,
        L_lambda_g_collapse=L * lg,
        **analysis.effective_depths(L, out["alpha_a"], out["alpha_m"]),
    )
    rest = [f for f in doc["features"] if f not in out]
    if rest:
        base = {f[2:] if f.startswith("L_") else f for f in rest}
        maps = tuple(m for m in F.MAPS if any(f.endswith(m) or f"_{m}_" in f for f in base)) or ("paper",)
        feats = F.features(cfg, configs, doc["input_geometry"]["q0"], doc["input_geometry"]["rho0"], maps=maps)
        for f in rest:
            out[f] = L * feats[f[2:]] if f.startswith("L_") and f not in feats else feats[f]
    return out


def predict(
    sigma_w,
    sigma_a,
    alpha_a,
    alpha_m,
    depth,
    doc: dict | None = None,
    block: str | None = None,
    reference: bool = False,
) -> dict:
    """Predicted final test loss (with the model's interval), P(fails to train) (``p_fail``;
    None for a fit file without a failure model), both exponents (``lambda_a``: NaN where a
    standard block has no fixed point; such a block's ``angle_rate`` too) and any warning,
    at arrays (or numbers) of initialization hyperparameters (a standard block's run numbers:
    ``sigma_w`` its sigma, ``alpha_a``/``alpha_m`` its alpha_attn/alpha_mlp, ``sigma_a`` 1);
    ``doc`` defaults to the model packaged for ``block`` (default the paper block's); a ``doc``
    fitted on another block than ``block`` is refused (FitError, one line). Only the features
    the model uses are computed; ``reference``: a standard block's theory point by the
    reference route (:func:`model_features`)."""
    if doc is None:
        doc = load_model(block=block)
    elif block is not None:
        check_block(doc, block)
    vals = np.broadcast_arrays(
        *(np.atleast_1d(np.asarray(v, float)) for v in (sigma_w, sigma_a, alpha_a, alpha_m, depth))
    )
    configs = [dict(sigma_w=a, sigma_a=b, alpha_a=c, alpha_m=d, depth=int(e)) for a, b, c, d, e in zip(*vals)]
    feats = model_features(doc, configs, reference=reference)
    model = M.from_json(doc["model"])
    X = np.stack([feats[f] for f in doc["features"]], 1) if doc["features"] else np.zeros((len(configs), 0))
    y = model.predict(X)
    pf = p_fail(doc, y)
    lo, hi = analysis.interval_bounds(doc["interval"], y, dict(zip(RAW_RANGES, vals)))
    out = []
    for i, c in enumerate(configs):
        warn = []
        for k, (a, b) in doc["region"].items():
            v = c[k] if k in c else float(feats[k][i])
            if not a - 1e-12 <= v <= b + 1e-12:
                warn.append(f"{k} = {v:.4g} lies outside the fitted range [{a:.4g}, {b:.4g}]")
        out.append(
            dict(
                c,
                predicted_loss=float(y[i]),
                interval=[float(lo[i]), float(hi[i])],
                interval_level=doc["interval"]["level"],
                chance_loss=doc["L_sat"],
                p_fail=None if pf is None else float(pf[i]),
                fail_criterion=(doc.get("failure") or {}).get("criterion"),
                fail_note=(doc.get("failure") or {}).get("note"),
                lambda_a=float(feats["lambda_a"][i]),
                **({"angle_rate": float(feats["angle_rate"][i])} if "angle_rate" in feats else {}),
                lambda_g_collapse=float(feats["lambda_g_collapse"][i]),
                features={f: float(feats[f][i]) for f in doc["features"]},
                model=doc.get("name"),
                family=doc.get("family"),
                cv_r2=doc.get("cv", {}).get("r2"),
                block=block_of(doc),
                n_tokens=doc["n_tokens"],
                warnings=warn,
            )
        )
    return out[0] if np.ndim(sigma_w) == 0 and len(out) == 1 else out
