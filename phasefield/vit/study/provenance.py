"""Where a shipped model file comes from: the ``provenance`` object it carries.

Every model file the study ships (``phasefield/vit/trainability_model*.json``) records

data                the data set, the studies (and their result tables) it was fitted on,
                    and how many configurations and runs
procedure           how the loss model, its interval and its failure part were fitted
command             the commands that regenerate the file from the committed tables
phasefield_version  the version of phasefield that wrote it
fitted              the date it was fitted (ISO)
renamed             (where present) the names changed in the file since it was fitted, one
                    line per change (:func:`renamed`); its numbers are as fitted

:func:`phasefield.vit.predict.load_model` ignores it; :func:`of` reads it.
"""

from __future__ import annotations

import datetime
import os

from . import registry as R

SCRIPT = "python scripts/trainability_study.py"

LOSS_PROCEDURE = (
    "phasefield.vit.predict.fit_sweep: every candidate family (analysis.model_specs) scored by grouped "
    "{k}-fold cross-validation over configurations x {repeats} repeats (a configuration's seeds never split); "
    "the best by CV RMSE among the shippable candidates (analysis.shippable), refitted on every configuration; "
    "the whole procedure scored by nested cross-validation"
)
INTERVAL_PROCEDURE = {
    "scaled": "80 % interval for one run's loss: normalized split conformal on out-of-fold single-run residuals, "
    "scaled by a cross-fitted Gaussian process of the mean absolute residual (analysis.conformal_scaled)",
    "binned": "80 % interval for one run's loss: split conformal on out-of-fold single-run residuals, in bins of "
    "the predicted loss (analysis.conformal)",
}
PLATT_PROCEDURE = (
    "P(fail): Platt scaling (failure.fit_platt) of the loss model's out-of-fold predictions against the runs' "
    "0/1 outcomes (diverged, or final test loss >= 0.95 log C); scored by grouped {k}-fold CV x {repeats}"
)
RULE_OF_THREE = (
    "P(fail): no run failed, so a constant P(fail) = 3 / N (the rule of three's 95 % upper bound "
    "after N runs without a failure)"
)


def version() -> str:
    from ... import __version__

    return __version__


def today() -> str:
    return datetime.date.today().isoformat()


def data(studies, dataset: str = "digits", n_configs: int | None = None, n_runs: int | None = None) -> dict:
    """The ``data`` entry: the data set, the studies (names of :data:`registry.STUDIES`) and
    their result tables (relative to the source tree)."""
    return dict(
        dataset=dataset,
        studies=list(studies),
        tables=[os.path.relpath(R.STUDIES[n]["out"], R.ROOT).replace(os.sep, "/") for n in studies],
        n_configs=n_configs,
        n_runs=n_runs,
    )


def make(
    data: dict, procedure: dict, command: list[str], fitted: str | None = None, phasefield_version: str | None = None
) -> dict:
    """A ``provenance`` object (see the module doc); ``fitted`` defaults to today and
    ``phasefield_version`` to the running version."""
    return dict(
        data=data,
        procedure=procedure,
        command=list(command),
        phasefield_version=phasefield_version or version(),
        fitted=fitted or today(),
    )


def paper(doc: dict, studies, folds: int, repeats: int, interval: str) -> dict:
    """The provenance of the paper block's model ``doc`` (a model document of
    :func:`phasefield.vit.predict.fit_sweep`) fitted by ``analyze --ship`` on ``studies``."""
    return make(
        data(studies, doc["train_config"].get("dataset", "digits"), doc["n_configs"], doc["n_runs"]),
        dict(
            loss=LOSS_PROCEDURE.format(k=folds, repeats=repeats),
            model=doc["name"],
            family=doc["family"],
            kind=doc["kind"],
            interval=INTERVAL_PROCEDURE[interval],
            failure=PLATT_PROCEDURE.format(k=folds, repeats=repeats),
        ),
        [
            f"{SCRIPT} analyze --ship" + _cv_options(folds, repeats),
            f"{SCRIPT} failure --ship" + _cv_options(folds, repeats),
        ],
    )


def block(doc: dict, name: str, folds: int, repeats: int, interval: str = "binned", available: bool = False) -> dict:
    """The provenance of a standard block's model ``doc`` fitted by ``analyze --study NAME --ship``
    (``available``: on the configurations whose features were cached, ``--available``)."""
    fail = doc.get("failure") or {}
    return make(
        data([name], doc["train_config"].get("dataset", "digits"), doc["n_configs"], doc["n_runs"]),
        dict(
            loss=LOSS_PROCEDURE.format(k=folds, repeats=repeats),
            model=doc["name"],
            family=doc["family"],
            kind=doc["kind"],
            interval=INTERVAL_PROCEDURE[interval],
            features=f"the block's own theory (phasefield.vit.features.block_features, "
            f"attention={doc.get('attention')!r}) and the raw numbers",
            failure=RULE_OF_THREE
            if fail.get("name") == "rule_of_three"
            else PLATT_PROCEDURE.format(k=folds, repeats=repeats),
        ),
        [
            f"{SCRIPT} features --study {name}",
            f"{SCRIPT} analyze --study {name}"
            + (" --available" if available else "")
            + " --ship"
            + _cv_options(folds, repeats),
        ],
    )


def with_failure(doc: dict, studies, folds: int, repeats: int) -> dict:
    """The provenance of the paper block's model ``doc`` once ``failure --ship`` has put its
    failure part in: the loss model's provenance (a new one on ``studies`` where the file has
    none) with the failure procedure and command, this version and today's date."""
    prov = dict(
        of(doc)
        or make(
            data(
                studies, doc.get("train_config", {}).get("dataset", "digits"), doc.get("n_configs"), doc.get("n_runs")
            ),
            {},
            [],
        )
    )
    prov["procedure"] = dict(prov.get("procedure") or {}, failure=PLATT_PROCEDURE.format(k=folds, repeats=repeats))
    command = f"{SCRIPT} failure --ship" + _cv_options(folds, repeats)
    prov["command"] = [c for c in prov.get("command", []) if "failure" not in c.split()] + [command]
    prov.update(phasefield_version=version(), fitted=today())
    return prov


def _cv_options(folds: int, repeats: int) -> str:
    return (f" --folds {folds}" if folds != 5 else "") + (f" --repeats {repeats}" if repeats != 5 else "")


def of(doc: dict) -> dict | None:
    """A model document's provenance (None for a file without one, e.g. a user's fit)."""
    return doc.get("provenance")


def renamed(doc: dict) -> list[str]:
    """The one-line notes of the names changed in a model file since it was fitted (its
    provenance's ``renamed`` list; [] where nothing was renamed)."""
    return list((of(doc) or {}).get("renamed") or [])


def with_provenance(doc: dict, prov: dict) -> dict:
    """``doc`` with its ``provenance`` first (readers see it at the top of the file)."""
    return {"provenance": prov, **{k: v for k, v in doc.items() if k != "provenance"}}
