"""The trainability study's pieces: designs, loss models, the cross-validated analysis, the
shipped predictor and recommend."""

from __future__ import annotations

import math

import numpy as np
import pytest

from phasefield.vit import analysis, design
from phasefield.vit import models as M

BOX = dict(sigma_w=(0.3, 3.0), sigma_a=(0.3, 4.0), alpha_a=(0.05, 0.95), alpha_m=(0.05, 0.95))
L_SAT = math.log(10)


# ------------------------------------------------------------------------------ designs
def test_sobol_design_is_seeded_extendable_and_inside_the_box():
    a = design.sobol(8, BOX, seed=3)
    b = design.sobol(24, BOX, seed=3)
    assert a == b[:8]  # a longer design starts with the shorter one
    assert design.sobol(8, BOX, seed=4) != a
    X = np.array([[c[k] for k in design.HP_NAMES] for c in b])
    lo, hi = np.array([BOX[k][0] for k in design.HP_NAMES]), np.array([BOX[k][1] for k in design.HP_NAMES])
    assert np.all((X >= lo) & (X <= hi))
    # balanced: each half of every axis holds half of the first 8 points
    u = (X[:8] - lo) / (hi - lo)
    assert np.all((u < 0.5).sum(0) == 4)
    fixed = design.sobol(4, dict(BOX, sigma_a=(1.0, 1.0)), seed=0)
    assert all(c["sigma_a"] == 1.0 for c in fixed)
    with pytest.raises(design.DesignError):
        design.sobol(0, BOX)


def test_expand_names_runs_by_value_and_depth():
    runs = design.expand(design.sobol(3, BOX), depths=(8, 16), lrs=(1e-3,), seeds=2)
    assert len(runs) == 12 and len({r["run"] for r in runs}) == 12
    assert len({design.config_id(r) for r in runs}) == 6  # seeds share their configuration
    assert {r["depth"] for r in runs} == {8, 16}
    # a configuration that fixes its own depth is not multiplied by the depth list
    one = design.expand([dict(sigma_w=1, sigma_a=1, alpha_a=0.5, alpha_m=0.5, depth=4)], depths=(8, 16))
    assert [r["depth"] for r in one] == [4]


def test_read_points(tmp_path):
    p = tmp_path / "p.csv"
    p.write_text("sigma_w,sigma_a,alpha_a,alpha_m,lr\n1,2,.1,.2,0.01\n")
    assert design.read_points(str(p)) == [dict(sigma_w=1.0, sigma_a=2.0, alpha_a=0.1, alpha_m=0.2, lr=0.01)]
    p.write_text("sigma_w,alpha\n1,.5\n")
    with pytest.raises(design.DesignError, match="sigma_a"):
        design.read_points(str(p))
    p.write_text("sigma_w,sigma_a,alpha\n1,x,.5\n")
    with pytest.raises(design.DesignError, match="line 2"):
        design.read_points(str(p))
    with pytest.raises(design.DesignError, match="must lie in"):
        design.check_configs([dict(sigma_w=1, sigma_a=1, alpha_a=1.5, alpha_m=0.5)])


# ------------------------------------------------------------------------------ models
def test_max_form_recovers_its_parameters():
    rng = np.random.default_rng(0)
    X = np.stack([rng.uniform(-1.5, 0.5, 80), rng.uniform(-1, 1, 80)], 1)
    theta = [0.3, 1.2, -0.1, 0.8, 0.05]
    y = M.MaxForm.curve(theta, X, L_SAT) + 0.01 * rng.standard_normal(80)
    m = M.MaxForm(["a", "g"], L_SAT).fit(X, y)
    np.testing.assert_allclose(m.theta, theta, atol=0.05)
    m2 = M.from_json(m.to_json())
    np.testing.assert_array_equal(m2.predict(X), m.predict(X))


@pytest.mark.parametrize("form", ["max", "one"])
def test_v_shape_fits_take_scipys_own_steps(form, monkeypatch):
    """models.forward_differences (the n perturbed curves in one call) is bit for bit scipy's
    2-point Jacobian, at parameters with zeros, kinks and both signs; so a fit takes scipy's
    steps exactly: the same parameters as least_squares(jac="2-point") from every start."""
    from scipy.optimize import least_squares
    from scipy.optimize._numdiff import approx_derivative

    cls, k = (M.MaxForm, 5) if form == "max" else (M.OneForm, 3)
    rng = np.random.default_rng(3)
    for m in (7, 60):
        X = rng.normal(size=(m, 2))
        y = np.minimum(L_SAT, 0.5 + np.maximum(0.8 * abs(X[:, 0] - 0.1), 0.5 * abs(X[:, 1] + 0.2)))
        y = y + 0.05 * rng.standard_normal(m)
        curve = lambda t, X=X: cls.curve(t, X, L_SAT)  # noqa: E731
        res = lambda t, X=X, y=y: cls.curve(t, X, L_SAT) - y  # noqa: E731
        for scale in (1e-3, 1.0, 30.0):
            t = rng.normal(size=k) * scale
            t[rng.random(k) < 0.3] = 0.0
            want = approx_derivative(res, t, method="2-point", f0=res(t))
            got = M.forward_differences(curve, t, y)
            np.testing.assert_array_equal(got, want)
            assert got.shape == want.shape and got.strides == want.strides
        fitted = cls(["a", "g"], L_SAT).fit(X, y, seed=m).theta
        starts = []  # the starts the fit draws, each run below by scipy's own 2-point Jacobian
        with monkeypatch.context() as mp:
            mp.setattr(M, "_least_squares", lambda c, yy, s, real=M._least_squares: starts.extend(s) or real(c, yy, s))
            cls(["a", "g"], L_SAT).fit(X, y, seed=m)
        runs = [least_squares(res, x0, method="trf", max_nfev=2000) for x0 in starts]
        assert all(np.isfinite(r.cost) for r in runs) and np.isfinite(fitted).all()  # min() skips a NaN cost
        best = min(runs, key=lambda r: r.cost).x
        for i in (1, 3) if form == "max" else (1,):  # the fitted slopes' signs, as fit sets them
            best[i] = abs(best[i])
        np.testing.assert_array_equal(fitted, best)


def test_poly_is_exact_on_a_quadratic_and_trees_match_sklearn():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 3))
    y = 1 + X[:, 0] - 0.5 * X[:, 1] * X[:, 2] + 0.3 * X[:, 2] ** 2 + 2.0
    p = M.Poly(["a", "b", "c"], L_SAT, degree=2, ridge=0.0).fit(X, y)
    np.testing.assert_allclose(p.predict(X), y, atol=1e-9)
    np.testing.assert_allclose(M.from_json(p.to_json()).predict(X), y, atol=1e-9)
    from sklearn.ensemble import GradientBoostingRegressor

    t = M.Trees(["a", "b", "c"], L_SAT).fit(X, y, seed=0)
    ref = GradientBoostingRegressor(random_state=0, **M.TREE_PARAMS).fit(X, y)
    Xn = rng.normal(size=(40, 3))
    np.testing.assert_allclose(M.from_json(t.to_json()).predict(Xn), np.clip(ref.predict(Xn), 0, None), atol=1e-9)


def test_forest_matches_sklearn_and_ensemble_is_the_mean_of_its_members():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(50, 3))
    y = np.abs(X[:, 0]) + 0.5 * X[:, 1] + 2.0
    from sklearn.ensemble import RandomForestRegressor

    f = M.Forest(["a", "b", "c"], L_SAT).fit(X, y, seed=0)
    ref = RandomForestRegressor(random_state=0, **M.FOREST_PARAMS).fit(X, y)
    Xn = rng.normal(size=(30, 3))
    np.testing.assert_allclose(M.from_json(f.to_json()).predict(Xn), np.clip(ref.predict(Xn), 0, None), atol=1e-9)
    members = [("poly", ("a", "b"), dict(degree=1)), ("forest", ("c", "a"), {})]
    e = M.Ensemble(["a", "b", "c"], L_SAT, members=members).fit(X, y, seed=0)
    lin = M.Poly(["a", "b"], L_SAT, degree=1).fit(X[:, :2], y)
    fo = M.Forest(["c", "a"], L_SAT).fit(X[:, [2, 0]], y, seed=0)
    mean = (lin.predict(Xn[:, :2]) + fo.predict(Xn[:, [2, 0]])) / 2
    np.testing.assert_allclose(e.predict(Xn), mean, atol=1e-12)
    np.testing.assert_allclose(M.from_json(e.to_json()).predict(Xn), mean, atol=1e-12)


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
def test_gp_posterior_mean_matches_sklearn(nu):
    """The shipped GP's NumPy posterior mean (training points, weights, kernel numbers in
    JSON) equals scikit-learn's GaussianProcessRegressor with the fitted kernel held fixed,
    on the same log-scaled, standardized features; the JSON round trip changes nothing."""
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    rng = np.random.default_rng(7)
    X = np.column_stack([rng.uniform(0.3, 3, 60), rng.uniform(0.3, 4, 60), rng.uniform(0.05, 0.95, 60)])
    y = np.sin(np.log(X[:, 0]) * 2) + X[:, 2] ** 2 + 0.05 * rng.normal(size=60) + 1.0
    g = M.make("gp", ["sigma_w", "sigma_a", "alpha_a"], L_SAT, nu=nu).fit(X, y)
    s = g.state
    Zof = lambda A: (np.column_stack([np.log(A[:, 0]), np.log(A[:, 1]), A[:, 2]]) - s["mean"]) / s["std"]
    k = ConstantKernel(s["constant"], "fixed") * Matern(s["length_scale"], "fixed", nu=nu) + WhiteKernel(
        s["noise"], "fixed"
    )
    ref = GaussianProcessRegressor(k, normalize_y=True, optimizer=None).fit(Zof(X), y)
    Xn = np.column_stack([rng.uniform(0.3, 3, 40), rng.uniform(0.3, 4, 40), rng.uniform(0.05, 0.95, 40)])
    np.testing.assert_allclose(g.predict(Xn), np.clip(ref.predict(Zof(Xn)), 0, L_SAT), rtol=0, atol=1e-10)
    np.testing.assert_array_equal(M.from_json(g.to_json()).predict(Xn), g.predict(Xn))
    with pytest.raises(ValueError, match="nu"):
        M.matern(Xn, X, np.ones(3), nu=1.0)


def test_gp_learns_a_smooth_loss_its_noise_and_which_features_matter():
    """A loss that depends on log sigma_w and alpha only, with seed noise of sd 0.05: on fresh
    points the GP's error is that of the noise-free function (RMSE < 0.05, the noise's own
    size), its fitted white noise is the seeds' variance (150 points: the estimate's relative
    sd is ~0.12, so within [0.5, 1.7] x), and the feature that does nothing (sigma_a) gets a
    length scale far longer than those of the two that matter."""
    rng = np.random.default_rng(11)
    f = lambda A: 1.0 + 0.6 * np.tanh(2 * np.log(A[:, 0])) + 0.8 * A[:, 2] ** 2
    draw = lambda n: np.column_stack([rng.uniform(0.3, 3, n), rng.uniform(0.3, 4, n), rng.uniform(0.05, 0.95, n)])
    X, Xn = draw(150), draw(200)
    y = f(X) + 0.05 * rng.normal(size=150)
    g = M.make("gp", ["sigma_w", "sigma_a", "alpha_a"], L_SAT).fit(X, y)
    assert M.rmse(f(Xn), g.predict(Xn)) < 0.05
    noise_var = g.state["noise"] * g.state["y_std"] ** 2
    assert 0.5 < noise_var / 0.05**2 < 1.7
    ls = g.state["length_scale"]
    assert np.isfinite(ls).all(), ls  # max() would skip a NaN after the first
    assert ls[1] > 5 * max(ls[0], ls[2])


def test_conformal_interval_has_the_normal_quantiles_and_covers_new_runs():
    """Residuals N(0, s^2) around the predictions: the 80 % conformal interval tends to
    +-1.2816 s (the normal quantiles, an independent route), covers ~80 % of fresh runs, and
    a bin of noisier predictions gets a wider interval."""
    rng = np.random.default_rng(4)
    n = 3000
    pred = rng.uniform(0, 2, n)
    sd = np.where(pred > 4 / 3, 0.3, 0.1)  # the top tertile scatters 3x more
    runs = [[p + s * rng.standard_normal()] for p, s in zip(pred, sd)]
    iv = analysis.conformal(pred, runs, level=0.8)
    assert len(iv["bins"]) == 3 and iv["edges"][1] == pytest.approx(4 / 3, abs=0.05)
    assert iv["bins"][0]["hi"] == pytest.approx(1.2816 * 0.1, rel=0.08)
    assert iv["bins"][2]["lo"] == pytest.approx(-1.2816 * 0.3, rel=0.08)
    new = rng.uniform(0, 2, n)
    fresh = [[p + (0.3 if p > 4 / 3 else 0.1) * rng.standard_normal()] for p in new]
    assert analysis.coverage(iv, new, fresh)["runs"] == pytest.approx(0.8, abs=0.03)
    lo, hi = analysis.interval_bounds(iv, np.array([0.0, 1.9]))
    assert lo[0] == 0.0 and hi[1] - 1.9 > 2 * (hi[0] - 0.0)


def test_scaled_interval_covers_where_seeds_scatter_and_the_binned_one_does_not():
    """Runs whose seed noise is 10x larger at alpha_M > 0.7 (the failure boundary's pattern)
    than elsewhere, with a loss that does not depend on alpha_M, so the binned interval (bins of
    the predicted loss) cannot see where the noise is. Fitted on 200 configurations x 3 runs
    with the true loss as the prediction, scored on 400 fresh ones: the scaled interval covers
    ~80 % of the fresh runs overall and in the noisy region (1,200 runs: sd of a coverage
    ~0.012 overall, ~0.02 in the noisy third, so +-0.06 is ~3-5 sd), and is narrower outside
    it; the binned interval covers well under 80 % in the noisy region."""
    rng = np.random.default_rng(5)

    def table(n):
        t = dict(
            sigma_w=rng.uniform(0.3, 3, n),
            sigma_a=rng.uniform(0.3, 4, n),
            alpha_a=rng.uniform(0.05, 0.95, n),
            alpha_m=rng.uniform(0.05, 0.95, n),
            depth=np.full(n, 16.0),
        )
        f = 0.5 + 0.4 * t["alpha_a"] ** 2
        sd = np.where(t["alpha_m"] > 0.7, 0.4, 0.04)
        t["run_losses"] = [list(m + s * rng.normal(size=3)) for m, s in zip(f, sd)]
        return t, f

    tab, f = table(200)
    iv = analysis.conformal_scaled(tab, f, level=0.8)
    # with the cross-fitted scales the calibration runs are covered at the level, by construction
    assert iv["cv_coverage"]["runs"] == pytest.approx(0.8, abs=0.01) and iv["cv_coverage"]["n_runs"] == 600
    binned = analysis.conformal(f, tab["run_losses"], level=0.8)
    new, fn = table(400)
    noisy = new["alpha_m"] > 0.7
    sub = lambda m: [r for r, k in zip(new["run_losses"], m) if k]
    cols_of = lambda m: {k: new[k][m] for k in ("sigma_w", "sigma_a", "alpha_a", "alpha_m", "depth")}
    assert analysis.coverage(iv, fn, new["run_losses"], new)["runs"] == pytest.approx(0.8, abs=0.05)
    assert analysis.coverage(iv, fn[noisy], sub(noisy), cols_of(noisy))["runs"] == pytest.approx(0.8, abs=0.06)
    assert analysis.coverage(binned, fn[noisy], sub(noisy))["runs"] < 0.6
    lo, hi = analysis.interval_bounds(iv, fn, new)
    assert np.mean((hi - lo)[~noisy]) < 0.5 * np.mean((hi - lo)[noisy])
    with pytest.raises(ValueError, match="cols"):
        analysis.interval_bounds(iv, fn)
    with pytest.raises(ValueError, match="binned"):
        analysis.make_interval("wide", tab, f)


def test_two_part_model_separates_trained_from_stuck_runs():
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, 120)
    y = np.where(x > 0.3, L_SAT, 0.2 + 0.1 * x) + 0.01 * rng.standard_normal(120)
    m = M.TwoPart(["x"], L_SAT).fit(x[:, None], y)
    p = m.p_train(np.array([[-0.8], [0.9]]))
    assert p[0] > 0.9 and p[1] < 0.1
    far = np.abs(x - 0.3) > 0.25  # away from the edge the expected loss is one branch's
    assert M.rmse(y[far], m.predict(x[far, None])) < 0.15
    np.testing.assert_allclose(M.from_json(m.to_json()).predict(x[:, None]), m.predict(x[:, None]))


# ------------------------------------------------------------------------------ analysis
def _study(n_per_depth=12, seeds=3, noise=0.05, seed=0):
    """Synthetic study: the seed-mean loss is a max-form function of two 'exponents', which
    are a nonlinear function of the raw hyperparameters; seeds add N(0, noise^2)."""
    rng = np.random.default_rng(seed)
    configs = [dict(c, depth=L, lr=1e-3) for L in (8, 16, 32) for c in design.sobol(n_per_depth, BOX, seed=L)]
    order = [design.config_id(c) for c in configs]
    sw = np.array([c["sigma_w"] for c in configs])
    aa = np.array([c["alpha_a"] for c in configs])
    L = np.array([c["depth"] for c in configs])
    la = np.log(sw / 1.8) * (1 - aa) * 2
    lg = np.sin(3 * aa) * (L / 16) * la
    truth = M.MaxForm.curve([0.2, 1.5, 0.0, 1.0, 0.0], np.stack([la, lg], 1), L_SAT)
    feats = dict(lambda_a=la, lambda_g_collapse=lg, lambda_g_inf=lg, rho_star=np.ones_like(la))
    rows = [
        dict(c, seed=s, test_loss=float(truth[i] + noise * rng.standard_normal()), test_acc=0.9, diverged=False)
        for i, c in enumerate(configs)
        for s in range(seeds)
    ]
    return rows, feats, order, truth


def test_noise_floor_matches_the_seed_noise():
    rows, feats, order, _ = _study(n_per_depth=32, seeds=4, noise=0.1)
    tab = analysis.configurations(rows, 10)
    fl = analysis.noise_floor(tab)
    # RMSE_floor^2 = sigma^2 / n_seeds; the estimate from 96 configurations x 3 dof is within ~10 %
    assert fl["rmse"] == pytest.approx(0.1 / 2, rel=0.12)
    assert fl["seeds"] == 4 and 0 < fl["r2_max"] < 1


def test_a_diverged_run_counts_as_chance_and_mixed_lrs_are_refused():
    rows, feats, order, _ = _study(n_per_depth=4)
    rows[0] = dict(rows[0], diverged=True, test_loss=None)
    tab = analysis.configurations(rows, 10)
    i = tab["config"].index(design.config_id(rows[0]))
    assert tab["n_diverged"][i] == 1
    vals = [L_SAT] + [r["test_loss"] for r in rows[1:3]]
    assert tab["loss"][i] == pytest.approx(np.mean(vals))
    with pytest.raises(analysis.AnalysisError, match="learning rates"):
        analysis.analyze(rows + [dict(rows[1], lr=0.1)], 10, feats, order, repeats=1, nested_cv=False)


@pytest.mark.usefixtures("small_ensembles")
def test_analysis_finds_the_exponent_model_and_transfers():
    rows, feats, order, truth = _study()
    rep = analysis.analyze(rows, 10, feats, order, k=3, repeats=1, nested_cv=False)
    ms = rep["models"]
    assert rep["n_configs"] == 36 and rep["seeds"] == 3
    assert rep["best_exponent_model"] in ("paper_max", "trees_collapsed", "poly2_collapsed")
    # the true form is within ~2x the noise floor out of sample; the raw baselines are not
    assert ms["paper_max"]["cv_over_floor"] < 2.0
    assert ms["paper_max"]["cv_rmse"] < ms["linear_hp"]["cv_rmse"]
    assert set(rep["transfer"]) == {"depth_8_16_to_32", "depth_le8_to_ge16", "sigma_a_le2_to_gt2"}
    t = rep["transfer"]["depth_8_16_to_32"]
    assert t["paper_max"]["n_test"] == 12 and t["paper_max"]["rmse"] < t["linear_hp"]["rmse"]
    assert t["_best_vs_raw"]["linear_hp"]["mean"] < 0


@pytest.mark.usefixtures("small_ensembles")
def test_nested_cv_of_the_shipping_procedure_and_fit_without_cv():
    """The whole procedure (selection among the candidates, interval, refit) scored on
    configurations it never saw: the true exponent form is learnt (R2 high) and the interval
    covers ~80 % of their runs; fewer than 10 configurations are fitted without CV."""
    rows, feats, order, truth = _study(n_per_depth=8, seeds=3, noise=0.05)
    tab = analysis.add_features(analysis.configurations(rows, 10), {k: np.asarray(v) for k, v in feats.items()})
    specs = analysis.model_specs(tab)
    names = ["constant", "linear_hp", "depth_max", "paper_max"]
    nest = analysis.nested(tab, names, specs, k=4, inner_repeats=1)
    assert nest["r2"] > 0.8 and 0.65 <= nest["coverage_runs"] <= 0.95
    assert set(nest["chosen"]) <= set(names) and "constant" not in nest["chosen"]
    few = [r for r in rows if r["depth"] == 8][: 3 * 6]
    rep = analysis.analyze(few, 10, feats, order, k=5)
    assert rep["cross_validated"] is False and "cross-validate" in rep["message"]
    assert rep["best_model"] in ("linear_hp", "constant") and rep["interval"]["hi"] >= rep["interval"]["lo"]


@pytest.mark.usefixtures("small_ensembles")
def test_effective_depth_models_learn_a_loss_set_by_the_summed_branch_variance(tmp_path):
    """A synthetic study whose loss is a saturating function of L (alpha_A^2 + alpha_M^2)
    (plus a small sigma_A term): the effective-depth candidates find it, the raw-value and
    exponent models do not, the procedure chooses one of them, and it transfers from L <= 8
    to L >= 16 (the depth-transfer split) better than the raw values alone."""
    rng = np.random.default_rng(5)
    configs = [dict(c, depth=L, lr=1e-3) for L in (4, 8, 16, 32) for c in design.sobol(12, BOX, seed=L)]
    order = [design.config_id(c) for c in configs]
    col = lambda k: np.array([float(c[k]) for c in configs])
    eff = col("depth") * (col("alpha_a") ** 2 + col("alpha_m") ** 2)
    np.testing.assert_allclose(analysis.effective_depth(col("depth"), col("alpha_a"), col("alpha_m")), eff)
    truth = 0.1 + 0.08 * eff + 0.05 * col("sigma_a")
    feats = dict(
        lambda_a=np.log(col("sigma_w")),
        lambda_g_collapse=col("alpha_a") - 0.5,
        lambda_g_inf=col("alpha_a"),
        rho_star=np.ones(len(configs)),
    )
    rows = [
        dict(c, seed=s, test_loss=float(truth[i] + 0.03 * rng.standard_normal()), test_acc=0.9, diverged=False)
        for i, c in enumerate(configs)
        for s in range(2)
    ]
    rep = analysis.analyze(rows, 10, feats, order, k=3, repeats=1, nested_cv=False)
    ms = rep["models"]
    tab = rep["table"]
    np.testing.assert_allclose(
        tab["effective_depth"],
        np.asarray(tab["depth"]) * (np.asarray(tab["alpha_a"]) ** 2 + np.asarray(tab["alpha_m"]) ** 2),
    )
    np.testing.assert_allclose(
        np.asarray(tab["effective_depth_attention"]) + np.asarray(tab["effective_depth_mlp"]),
        tab["effective_depth"],
        rtol=1e-14,
    )
    rmse = {k: ms[k]["cv_rmse"] for k in ("linear_hp_eff", "linear_hp", "depth_max")}
    assert all(np.isfinite(v) for v in rmse.values()), rmse  # min() would skip a NaN after the first
    assert rmse["linear_hp_eff"] < 0.5 * min(rmse["linear_hp"], rmse["depth_max"])
    assert "effective_depth" in ms[rep["best_model"]]["features"]
    t = rep["transfer"]["depth_le8_to_ge16"]
    assert t["linear_hp_eff"]["n_test"] == 24 and t["linear_hp_eff"]["rmse"] < 0.5 * t["linear_hp"]["rmse"]
    assert set(t["_best_hybrid_vs_raw"]) >= {"linear_hp", "linear_hp_eff"}
    from phasefield.vit import figure

    figure.shipped(rep, str(tmp_path / "shipped.png"), held_out=tab["config"][:5])
    assert (tmp_path / "shipped.png").read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------------------ the product
def test_packaged_model_predicts_with_interval_and_warnings():
    from phasefield.vit import predict as P

    doc = P.load_model()
    for k in ("model", "features", "cv", "interval", "region", "train_config", "input_geometry", "noise_floor"):
        assert k in doc, k
    res = P.predict(1.2, 1.0, 0.4, 0.6, 16, doc)
    assert res["interval"][0] <= res["predicted_loss"] <= res["interval"][1]
    # the shipped model is the best by CV among every family, and says which it is
    assert res["family"] in ("exponents", "raw", "hybrid") and res["cv_r2"] == doc["cv"]["r2"]
    assert doc["name"] in doc.get("candidates", [doc["name"]])
    assert doc["cv"]["nested_coverage_runs"] >= 0.75
    assert res["warnings"] == [] and math.isfinite(res["lambda_a"]) and math.isfinite(res["lambda_g_collapse"])
    far = P.predict(1.2, 1.0, 0.4, 0.6, 48, doc)  # the fitted depths are 8-32
    assert any("depth" in w for w in far["warnings"])
    many = P.predict(np.array([1.2, 2.5]), 1.0, 0.4, 0.6, 16, doc)
    assert len(many) == 2 and many[0]["predicted_loss"] == pytest.approx(res["predicted_loss"], abs=1e-9)


def test_recommend_finds_the_point_nearest_to_criticality():
    """lambda_a = lambda_g = 0 is reached only as alpha_A -> 0 (the mean-token mode mu > 1 for
    alpha_A > 0), so inside the box recommend returns the nearest points: on the alpha_A
    boundary, closer to (0, 0) than every Sobol candidate, with the fixed values kept."""
    from phasefield.vit import recommend as R

    fixed = dict(sigma_a=1.0, alpha_m=0.5)
    res = R.recommend(n_tokens=17, depth=16, fixed=fixed, candidates=32, top=1, predict_loss=False)
    assert len(res["critical"]) == 1 and res["candidates"] == 32
    c = res["critical"][0]
    assert c["sigma_a"] == 1.0 and c["alpha_m"] == 0.5
    assert 0.3 <= c["sigma_w"] <= 3 and c["alpha_a"] == pytest.approx(0.05, abs=1e-6)
    from scipy.stats import qmc

    u = qmc.Sobol(2, scramble=True, seed=0).random_base2(5)
    pts = np.stack([0.3 + 2.7 * u[:, 0], np.ones(32), 0.05 + 0.9 * u[:, 1], np.full(32, 0.5)], 1)
    la, lg = R.exponents_of(pts, 17, 16, "tanh")
    assert math.hypot(c["lambda_a"], c["lambda_g_collapse"]) < np.hypot(la, lg).min()
    assert math.hypot(c["lambda_a"], c["lambda_g_collapse"]) < 0.01


def test_predict_computes_the_models_features_as_the_full_route_does():
    """predict computes only the features its model uses (the collapsed exponents alone, in
    closed form in L); they and the predictions equal those of the full feature route
    (paper.exponents with its fixed-point searches, inside features.features) to rounding."""
    from phasefield.vit import features as F
    from phasefield.vit import predict as P
    from phasefield.vit.train import TrainConfig

    doc = P.load_model()
    cfg = TrainConfig.from_dict(doc["train_config"])
    sw, sa, aa, am = np.array([0.4, 2.7]), np.array([3.5, 0.6]), np.array([0.9, 0.1]), np.array([0.2, 0.8])
    res = P.predict(sw, sa, aa, am, 16, doc)
    configs = [dict(sigma_w=a, sigma_a=b, alpha_a=c, alpha_m=d, depth=16) for a, b, c, d in zip(sw, sa, aa, am)]
    # the collapsed-point features only (no input-geometry maps: the model reads none of them)
    ref = F.features(cfg, configs, doc["input_geometry"]["q0"], doc["input_geometry"]["rho0"], maps=())
    ref.update(
        {k: np.array([c[k] for c in configs], float) for k in ("sigma_w", "sigma_a", "alpha_a", "alpha_m", "depth")}
    )
    ref.update(
        L_lambda_a=16 * ref["lambda_a"],
        L_lambda_g_collapse=16 * ref["lambda_g_collapse"],
        effective_depth=16 * (aa**2 + am**2),
        effective_depth_attention=16 * aa**2,
        effective_depth_mlp=16 * am**2,
    )
    for i, r in enumerate(res):
        assert r["lambda_a"] == pytest.approx(ref["lambda_a"][i], abs=1e-12)
        assert r["lambda_g_collapse"] == pytest.approx(ref["lambda_g_collapse"][i], abs=1e-12)
    y = M.from_json(doc["model"]).predict(np.stack([ref[f] for f in doc["features"]], 1))
    np.testing.assert_allclose([r["predicted_loss"] for r in res], y, rtol=0, atol=1e-12)
    # any depth the grid allows, one compiled program: finite exponents at depth 4096
    deep = P.predict(1.2, 1.0, 0.4, 0.6, 4096, doc)
    assert math.isfinite(deep["lambda_g_collapse"]) and any("depth" in w for w in deep["warnings"])


def _study_dir(out, rows, feats, order, cfg=None):
    """A sweep directory as the study script leaves it: sweep.json, results, geometry, features."""
    import csv
    import json

    from phasefield.vit.train import TrainConfig

    out.mkdir()
    (out / "sweep.json").write_text(json.dumps({"config": (cfg or TrainConfig()).to_dict(), "num_classes": 10}))
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "input_geometry.json").write_text(json.dumps(dict(q0=1.6, rho0=0.06)))
    with open(out / "features.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config"] + sorted(feats))
        for i, c in enumerate(order):
            w.writerow([c] + [feats[k][i] for k in sorted(feats)])
    return out


@pytest.mark.usefixtures("small_ensembles")
def test_fit_cli_pools_sweeps_of_one_training_config(capsys, tmp_path):
    """fit --runs A --runs B fits the configurations of both sweeps (their feature caches
    pooled; --figure draws Fig. 7 of the fit) and refuses, in one line with exit 2, sweeps trained with different configs."""
    import json

    from phasefield.cli import main
    from phasefield.vit.train import TrainConfig

    rows, feats, order, _ = _study(n_per_depth=4, seeds=2)
    half = {c for c in order[::2]}
    pick = lambda keep: (
        [r for r in rows if (design.config_id(r) in half) == keep],
        {k: np.asarray(v)[[(c in half) == keep for c in order]] for k, v in feats.items()},
        [c for c in order if (c in half) == keep],
    )
    a = _study_dir(tmp_path / "a", *pick(True))
    b = _study_dir(tmp_path / "b", *pick(False))
    fit = tmp_path / "fit.json"
    fig = tmp_path / "fig7.png"
    code = main(
        [
            "fit",
            "--runs",
            str(a),
            "--runs",
            str(b),
            "--out",
            str(fit),
            "--folds",
            "2",
            "--repeats",
            "1",
            "--no-nested",  # the nested CV of the procedure is test_nested_cv_of_the_shipping_procedure's claim
            "--figure",
            str(fig),
        ]
    )
    stdout, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(fit.read_text())
    assert doc["report"]["n_configs"] == 12 and doc["report"]["n_runs"] == 24
    # the fit file carries its failure model, calibrated on the CV predictions
    f = doc["model"]["failure"]
    assert f["n_runs"] == 24 and f["calibrated_on"] == "out-of-fold predictions" and f["model"]["kind"] == "logistic"
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    c = _study_dir(tmp_path / "c", *pick(False), cfg=TrainConfig(width=32))
    code = main(["fit", "--runs", str(a), "--runs", str(c), "--out", str(tmp_path / "no.json")])
    stdout, err = capsys.readouterr()
    assert code == 2 and "another config" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "no.json").exists()


@pytest.mark.usefixtures("small_ensembles")
def test_fit_sweep_computes_the_features_a_cache_lacks(monkeypatch):
    """A features cache written before more configurations were trained: fit_sweep computes
    the missing configurations' features (only those) and fits all of them."""
    from phasefield.vit import features as F
    from phasefield.vit import predict as P
    from phasefield.vit.train import TrainConfig

    rows, feats, order, _ = _study(n_per_depth=4, seeds=2)
    calls = []

    def fake(cfg, configs, q0, rho0, **kw):
        calls.append(len(configs))
        ids = [design.config_id(dict(c, lr=1e-3)) for c in configs]
        return {k: np.array([feats[k][order.index(i)] for i in ids]) for k in feats}

    monkeypatch.setattr(F, "features", fake)
    keep = order[:7]
    doc = P.fit_sweep(
        rows,
        10,
        TrainConfig(),
        dict(q0=1.6, rho0=0.06),
        {k: v[:7] for k, v in feats.items()},
        keep,
        k=2,  # the folds are not this test's claim: two fits per candidate, not four
        repeats=1,
        nested_cv=False,
    )
    assert calls == [5] and doc["report"]["n_configs"] == 12
    tab = doc["report"]["table"]
    i = tab["config"].index(order[9])
    assert tab["lambda_a"][i] == pytest.approx(feats["lambda_a"][9])


def test_fit_cli_on_few_configurations_fits_and_says_it_cannot_cross_validate(capsys, tmp_path):
    """phasefield fit on 6 configurations: a model is written (no CV score) and predict uses it;
    the report says it could not cross-validate."""
    import json

    from phasefield.cli import main

    rows, feats, order, _ = _study(n_per_depth=2, seeds=2)
    out = _study_dir(tmp_path / "study", rows, feats, order)
    fit = tmp_path / "fit.json"
    # fit --block checks the block the runs were trained with (one line, exit 2, no file)
    for block, msg in (
        ("pre-ln", "were trained with block paper, not pre-ln"),
        ("paper:sigma_w=1", "names the block, not its numbers"),
    ):
        assert main(["fit", "--runs", str(out), "--out", str(fit), "--block", block]) == 2
        _, err = capsys.readouterr()
        assert msg in err and len(err.strip().splitlines()) == 1 and not fit.exists(), err
    code = main(["fit", "--runs", str(out), "--out", str(fit), "--block", "paper"])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert "too few to cross-validate" in stdout and "not cross-validated" in stdout
    doc = json.loads(fit.read_text())
    assert doc["model"]["cv"]["cross_validated"] is False and doc["model"]["cv"]["r2"] is None
    code = main(["predict", "--fit", str(fit), "--sigma-w", "1", "--alpha", ".5", "--depth", "8"])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert "R2 not measured" in stdout


def test_train_config_optimizer_option():
    """The optimizer is part of a sweep's config; Adam (the default) is left out of to_dict so
    that sweep directories and fit files written before the option still match."""
    import optax

    from phasefield.vit import train as T

    assert "optimizer" not in T.TrainConfig().to_dict()
    cfg = T.TrainConfig(optimizer="sgd_momentum")
    assert cfg.to_dict()["optimizer"] == "sgd_momentum"
    assert T.TrainConfig.from_dict(cfg.to_dict()) == cfg.validate()
    with pytest.raises(ValueError, match="unknown optimizer"):
        T.TrainConfig(optimizer="lion").validate()
    # heavy-ball momentum 0.9: the second step moves by lr * (g + 0.9 g)
    tx = optax.inject_hyperparams(T.OPTIMIZERS["sgd_momentum"])(learning_rate=0.1)
    p = np.zeros(2)
    st = tx.init(p)
    g = np.array([1.0, -2.0])
    u1, st = tx.update(g, st, p)
    u2, st = tx.update(g, st, p)
    np.testing.assert_allclose(u1, -0.1 * g, rtol=1e-6)
    np.testing.assert_allclose(u2, -0.1 * 1.9 * g, rtol=1e-6)
