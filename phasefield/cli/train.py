"""``phasefield train-sweep``, ``phasefield fit`` and ``phasefield predict`` (ViT trainability).

Heavy imports (jax, flax, optax, tensorflow-datasets, scipy, matplotlib) happen inside the
commands so that ``phasefield --help`` stays fast.
"""
from __future__ import annotations

import math
import os

import click
import numpy as np

from .common import UsageError, atomic_path, check_hparams_values, echo_json, parse_range


def _positive(name, v, minimum=1):
    if v is not None and v < minimum:
        raise UsageError(f"--{name} must be >= {minimum} (got {v})")


def register(cli):
    @cli.command("train-sweep")
    @click.option("--dataset", default="digits", show_default=True,
                  help="'digits' (bundled, offline) or a tensorflow-datasets name, e.g. food101")
    @click.option("--sigma-w", default="0.3:3:6", show_default=True, help="start:stop:count, a,b,c or x")
    @click.option("--alpha", default=None, help="alpha_A = alpha_M (default 0.1:0.95:6)")
    @click.option("--alpha-a", default=None, help="alpha_A axis (then --alpha-m is its own axis)")
    @click.option("--alpha-m", default=None, help="alpha_M axis")
    @click.option("--sigma-a", default="1", show_default=True)
    @click.option("--lr", default="1e-3", show_default=True, help="Adam learning rate(s)")
    @click.option("--seeds", type=int, default=1, show_default=True, help="seeds per grid point")
    @click.option("--epochs", type=int, default=15, show_default=True)
    @click.option("--batch-size", type=int, default=None, help="(default 64 for digits, 256 otherwise)")
    @click.option("--depth", type=int, default=16, show_default=True)
    @click.option("--width", type=int, default=64, show_default=True, help="embedding width d")
    @click.option("--image-size", type=int, default=None, help="(default 8 for digits, 64 otherwise)")
    @click.option("--patch-size", type=int, default=None, help="(default 2 for digits, 8 otherwise)")
    @click.option("--activation", default="tanh", show_default=True)
    @click.option("--chunk", type=int, default=12, show_default=True, help="configs trained at once (one compiled program)")
    @click.option("--data-dir", default=None, help="where prepared .npz arrays are cached")
    @click.option("--tfds-dir", default=None, help="tensorflow-datasets data_dir")
    @click.option("--download", is_flag=True, help="let tensorflow-datasets download and prepare the dataset")
    @click.option("--out", "-o", required=True, help="sweep directory (resumed when it exists)")
    @click.option("--quiet", is_flag=True, help="no progress bar")
    @click.option("--json", "as_json", is_flag=True, help="print a JSON summary")
    def train_sweep(dataset, sigma_w, alpha, alpha_a, alpha_m, sigma_a, lr, seeds, epochs, batch_size, depth,
                    width, image_size, patch_size, activation, chunk, data_dir, tfds_dir, download, out, quiet,
                    as_json):
        """Train ViTs over an initialization grid (the paper's Appendix D model, shared block).

        Every chunk of grid points is trained by one vmapped, compiled program; results go to
        OUT/results.{jsonl,csv,json}, per-run metrics to OUT/metrics/, final params to
        OUT/checkpoints/. Rerunning resumes without redoing finished runs."""
        digits = dataset == "digits"
        image_size = image_size if image_size is not None else (8 if digits else 64)
        patch_size = patch_size if patch_size is not None else (2 if digits else 8)
        batch_size = batch_size if batch_size is not None else (64 if digits else 256)
        for name, v in (("seeds", seeds), ("epochs", epochs), ("batch-size", batch_size), ("depth", depth),
                        ("image-size", image_size), ("patch-size", patch_size), ("chunk", chunk)):
            _positive(name, v)
        _positive("width", width, 2)
        if image_size % patch_size:
            raise UsageError(f"--patch-size {patch_size} does not divide --image-size {image_size}")
        if alpha is None and alpha_a is None and alpha_m is None:
            alpha = "0.1:0.95:6"
        if alpha is not None and (alpha_a is not None or alpha_m is not None):
            raise UsageError("give either --alpha or --alpha-a/--alpha-m, not both")
        vals = dict(sigma_w=parse_range(sigma_w, "sigma_w"), sigma_a=parse_range(sigma_a, "sigma_a"))
        if alpha is not None:
            vals["alpha"] = parse_range(alpha, "alpha")
        else:
            vals["alpha_a"] = parse_range(alpha_a if alpha_a is not None else "0.5", "alpha_a")
            vals["alpha_m"] = parse_range(alpha_m if alpha_m is not None else "0.5", "alpha_m")
        check_hparams_values(vals)
        lrs = parse_range(lr, "lr")
        if not np.all(lrs > 0):
            raise UsageError(f"--lr must be > 0 (got {lrs.min():g})")
        from ..vit.train import TrainConfig

        cfg = TrainConfig(dataset=dataset, image_size=image_size, patch_size=patch_size, width=width, depth=depth,
                          epochs=epochs, batch_size=batch_size, activation=activation)
        cfg.validate()
        from ..vit import data as vdata
        from ..vit import sweep as vsweep

        runs = vsweep.grid(vals["sigma_w"], vals.get("alpha", vals.get("alpha_a")),
                           None if "alpha" in vals else vals["alpha_m"], vals["sigma_a"], lrs, seeds)
        # refuse a foreign sweep directory before loading data or training anything
        if os.path.exists(out) and not os.path.isdir(out):
            raise UsageError(f"--out {out} exists and is not a directory")
        ds = vdata.load(dataset, image_size, data_dir=data_dir, tfds_dir=tfds_dir, download=download)
        summary = vsweep.run_sweep(cfg, runs, out, ds, chunk=chunk, progress=not quiet,
                                   log=lambda m: click.echo(m, err=True))
        summary.update(out=out, runs_in_table=len(vsweep.read_results(out)))
        if as_json:
            echo_json(summary)
        else:
            click.echo(f"trained {summary['trained']} runs ({summary['already_done']} already done, "
                       f"{summary['diverged']} diverged) in {summary['seconds']:.1f} s; "
                       f"table: {os.path.join(out, 'results.csv')}")

    @cli.command("fit")
    @click.option("--runs", required=True, help="sweep directory or results table (.jsonl/.json/.csv)")
    @click.option("--out", "-o", default=None, help="fit JSON to write")
    @click.option("--target", type=click.Choice(["test_loss", "train_loss"]), default="test_loss", show_default=True)
    @click.option("--folds", type=int, default=5, show_default=True, help="k of the k-fold cross-validation")
    @click.option("--num-classes", type=int, default=None, help="(default from the sweep's sweep.json)")
    @click.option("--figure", default=None, help="write Fig. 7 (png/pdf/svg) here")
    @click.option("--json", "as_json", is_flag=True, help="print the fit as JSON")
    def fit_cmd(runs, out, target, folds, num_classes, figure, as_json):
        """Fit loss = min(log C, b + max(w_a|lambda_a - c_a|, w_g|lambda_g - c_g|)) to a sweep,
        with R^2 and k-fold CV error against lambda_a-only, lambda_g-only and raw-hp baselines."""
        if out is None and figure is None and not as_json:
            raise UsageError("nothing to do: give --out, --figure and/or --json")
        _positive("folds", folds, 2)
        if num_classes is not None:
            _positive("num-classes", num_classes, 2)
        if figure is not None and os.path.splitext(figure)[1].lower() not in (".png", ".pdf", ".svg"):
            raise UsageError(f"--figure must end in .png, .pdf or .svg (got {figure!r})")
        from ..vit import predict as vpredict
        from ..vit import sweep as vsweep
        from ..vit.train import TrainConfig

        rows = vpredict.load_rows(runs)
        sweep_dir = runs if os.path.isdir(runs) else os.path.dirname(os.path.abspath(runs))
        meta = vsweep.read_sweep(sweep_dir)
        cfg = TrainConfig.from_dict(meta["config"]) if meta.get("config") else None
        num_classes = num_classes or meta.get("num_classes")
        if not num_classes:
            raise UsageError("cannot tell the number of classes: pass --num-classes")
        missing = [r for r in rows if r.get("lambda_a") is None or r.get("lambda_g") is None]
        if missing and cfg is not None:  # the theory was not available when the sweep ran
            lam, note = vsweep.theory_exponents(cfg, missing)
            if note:
                raise UsageError(note)
            for i, r in enumerate(missing):
                r.update({k: float(v[i]) for k, v in lam.items()})
        context = dict(cfg.to_dict(), n_tokens=cfg.n_tokens) if cfg is not None else {}
        doc = vpredict.fit_rows(rows, int(num_classes), target=target, k=folds, context=context)
        if out is not None:
            import json

            with atomic_path(out) as tmp:
                with open(tmp, "w") as f:
                    json.dump(doc, f, indent=1)
        if figure is not None:
            from ..vit.figure import fig7

            with atomic_path(figure) as tmp:
                fig7(rows, doc, tmp, fmt=os.path.splitext(figure)[1][1:].lower())
        if as_json:
            echo_json(doc)
        else:
            click.echo(f"fit on {doc['n_runs']} runs ({doc['n_diverged']} diverged excluded), target {target}")
            click.echo(f"  {'model':10s} {'params':>6s} {'R2':>7s} {'RMSE':>7s} {'CV RMSE':>8s} {'CV R2':>7s}")
            for name, m in doc["models"].items():
                click.echo(f"  {name:10s} {m['n_params']:6d} {m['r2']:7.3f} {m['rmse']:7.3f} {m['cv_rmse']:8.3f} {m['cv_r2']:7.3f}")
            p = doc["params"]
            click.echo(f"  loss = min({doc['L_sat']:.3f}, {p['b']:.3f} + max({p['w_a']:.3f}|lambda_a - {p['c_a']:+.3f}|, "
                       f"{p['w_g']:.3f}|lambda_g - {p['c_g']:+.3f}|))")

    @cli.command("predict")
    @click.option("--fit", "fit_path", required=True, help="fit JSON written by 'phasefield fit'")
    @click.option("--sigma-w", type=float, required=True)
    @click.option("--alpha", type=float, default=None, help="alpha_A = alpha_M")
    @click.option("--alpha-a", type=float, default=None)
    @click.option("--alpha-m", type=float, default=None)
    @click.option("--sigma-a", type=float, default=1.0, show_default=True)
    @click.option("--json", "as_json", is_flag=True, help="print one JSON object")
    def predict_cmd(fit_path, sigma_w, alpha, alpha_a, alpha_m, sigma_a, as_json):
        """Predicted final loss at one initialization, from its exponents and a fit."""
        if alpha is not None and (alpha_a is not None or alpha_m is not None):
            raise UsageError("give either --alpha or --alpha-a/--alpha-m, not both")
        if alpha is None and alpha_a is None:
            raise UsageError("give --alpha (or --alpha-a and --alpha-m)")
        aa = alpha if alpha is not None else alpha_a
        am = alpha if alpha is not None else (alpha_m if alpha_m is not None else alpha_a)
        for name, v in (("sigma_w", sigma_w), ("sigma_a", sigma_a), ("alpha_a", aa), ("alpha_m", am)):
            if not math.isfinite(v):
                raise UsageError(f"--{name.replace('_', '-')} must be finite (got {v})")
        check_hparams_values(dict(sigma_w=[sigma_w], sigma_a=[sigma_a], alpha_a=[aa], alpha_m=[am]))
        from ..vit import predict as vpredict

        doc = vpredict.load_fit(fit_path)
        ctx = doc.get("context") or {}
        try:
            from .. import theory
        except ImportError as exc:
            raise UsageError(f"the theory engine is not available ({exc})") from None
        import jax.numpy as jnp

        from ..vit.train import TrainConfig

        cfg = TrainConfig.from_dict(ctx)
        hp = cfg.hparams(sigma_w, sigma_a, aa, am, dtype=jnp.float64)
        ex = {k: float(v) for k, v in theory.exponents(hp).items()}
        loss = float(vpredict.predict_loss(doc, ex["lambda_a"], ex["lambda_g"]))
        res = dict(predicted_loss=loss, target=doc.get("target", "test_loss"), L_sat=doc["L_sat"],
                   lambda_a=ex.get("lambda_a"), lambda_g=ex.get("lambda_g"), lambda_g_inf=ex.get("lambda_g_inf"),
                   sigma_w=sigma_w, sigma_a=sigma_a, alpha_a=aa, alpha_m=am, n_tokens=cfg.n_tokens, depth=cfg.depth)
        if as_json:
            echo_json(res)
        else:
            click.echo(f"predicted {res['target'].replace('_', ' ')} = {loss:.4f}  (chance {doc['L_sat']:.4f})")
            click.echo(f"lambda_a = {res['lambda_a']:+.4f}   lambda_g(L={cfg.depth}) = {res['lambda_g']:+.4f}")
