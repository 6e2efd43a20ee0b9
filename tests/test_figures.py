"""Figures: drawing from saved datasets, --from without recomputation, phase
classification, the zero-contour intersection finder, the demo summary and CLI errors.

Everything here runs on small synthetic datasets (numpy only, no theory or simulation),
so the whole file takes a few seconds of matplotlib."""

from __future__ import annotations

import os

import numpy as np
import pytest
import xarray as xr

from phasefield.cli import main
from phasefield.figures import agreement, compute, files, phase
from phasefield.figures import settings as presets

FIGS = ("fig2", "fig3", "fig4", "fig5", "fig6", "phase_diagram")


# ------------------------------------------------------------------ synthetic datasets
def _grid(x, y, xs, ys, fa, fg, scalars, sim=False, seed=0):
    X, Y = np.meshgrid(xs, ys, indexing="ij")  # dims (x, y) like the sweeps' (sigma_w, alpha)?
    la, lg = fa(X, Y), fg(X, Y)
    vars_ = {"lambda_a": ((x, y), la), "lambda_g_collapse": ((x, y), lg)}
    if sim:
        rng = np.random.default_rng(seed)
        vars_ = {
            "lambda_a": ((x, y), la + 0.01 * rng.standard_normal(la.shape)),
            "lambda_a_se": ((x, y), np.full(la.shape, 0.01)),
            "lambda_g_collapse": ((x, y), lg + 0.005 * rng.standard_normal(lg.shape)),
            "lambda_g_collapse_se": ((x, y), np.full(lg.shape, 0.005)),
        }
        ds = xr.Dataset(vars_, coords={x: xs, y: ys, **scalars})
        ds.attrs.update(width=64, seeds=4)
        return ds
    vars_["lambda_g_inf"] = ((x, y), lg + 0.1)
    vars_["q_star"] = ((x, y), np.ones_like(la))
    vars_["rho_star"] = ((x, y), np.ones_like(la))
    return xr.Dataset(vars_, coords={x: xs, y: ys, **scalars})


def _la(sw, al):
    return al**2 * (sw - 1.8 - 0.5 * al)


def _lg(sw, al):
    return al**2 * (sw - 1.8 + 0.8 * al) + 0.01 * al


def synthetic_theory():
    sc = dict(sigma_a=1.0, n_tokens=32.0, depth=16.0)
    a = _grid("sigma_w", "alpha", np.linspace(0.3, 4, 30), np.linspace(0.01, 0.99, 25), _la, _lg, sc)
    b = _grid(
        "sigma_a",
        "alpha",
        np.linspace(0.1, 5, 12),
        np.linspace(0.01, 0.99, 25),
        lambda s, a_: _la(2.0 + 0 * s, a_),
        lambda s, a_: _lg(2.0 + 0 * s, a_),
        dict(sigma_w=2.0, n_tokens=32.0, depth=16.0),
    )
    return {"alpha_sigma_w": a, "sigma_a_alpha": b}


def synthetic_sim():
    sc = dict(sigma_a=1.0, n_tokens=32.0, depth=16.0)
    a = _grid("sigma_w", "alpha", np.linspace(0.5, 3.5, 4), np.array([0.2, 0.5, 0.8]), _la, _lg, sc, sim=True)
    b = _grid(
        "sigma_a",
        "alpha",
        np.array([0.5, 2.0, 4.0]),
        np.array([0.2, 0.8]),
        lambda s, a_: _la(2.0 + 0 * s, a_),
        lambda s, a_: _lg(2.0 + 0 * s, a_),
        dict(sigma_w=2.0, n_tokens=32.0, depth=16.0),
        sim=True,
    )
    c = _grid("sigma_w", "alpha", np.linspace(0.5, 3.5, 4), np.array([0.2, 0.5, 0.8]), _la, _lg, sc, sim=True, seed=1)
    c.attrs["causal"] = 1
    rng = np.random.default_rng(0)
    L, n, S = 4, 6, 2
    layers = np.arange(L + 1)
    q = np.linspace(1, 2, L + 1)
    rho = np.linspace(0.7, 0.9, L + 1)
    fig2 = xr.Dataset(
        {
            "norms": (("sigma_w", "layer", "token"), q[None, :, None] + 0.1 * rng.standard_normal((2, L + 1, S * n))),
            "cosines": (
                ("sigma_w", "layer", "pair"),
                np.clip(rho[None, :, None] + 0.05 * rng.standard_normal((2, L + 1, S * n * (n - 1) // 2)), -1, 1),
            ),
            "q_theory": (("sigma_w", "layer"), np.stack([q, q])),
            "rho_theory": (("sigma_w", "layer"), np.stack([rho, rho[::-1]])),
            "map_q": (("sigma_w", "start", "layer"), np.ones((2, 3, L + 1))),
            "map_rho": (("sigma_w", "start", "layer"), np.tile(rho, (2, 3, 1))),
            "q_fixed": ("sigma_w", [1.0, 2.0]),
            "rho_fixed": ("sigma_w", [1.0, 0.5]),
            "lambda_a": ("sigma_w", [-0.3, 0.2]),
        },
        coords={"sigma_w": [1.0, 3.0], "layer": layers, "start": np.arange(3)},
        attrs=dict(width=64, seeds=S, rho0=0.7, q0=1.0, alpha=0.5, sigma_a=1.0, n_tokens=n, depth=L),
    )
    ratio = np.linspace(0.25, 1, L + 1)
    fig3 = xr.Dataset(
        {
            k: (("sigma_w", "layer"), np.stack([v, v]))
            for k, v in dict(
                intra=np.full(L + 1, 0.8),
                intra_se=np.full(L + 1, 0.01),
                inter=0.8 * ratio,
                inter_se=np.full(L + 1, 0.01),
                ratio=ratio,
                ratio_se=np.full(L + 1, 0.02),
                theory_intra=np.full(L + 1, np.nan),
                theory_inter=np.full(L + 1, np.nan),
                theory_ratio=np.full(L + 1, np.nan),
            ).items()
        },
        coords={"sigma_w": [1.0, 3.0], "layer": layers},
        attrs=dict(width=64, seeds=S, rho_intra=0.8, rho_inter=0.2, alpha=0.5, theory="unavailable"),
    )
    return {"alpha_sigma_w": a, "sigma_a_alpha": b, "causal": c, "fig2": fig2, "fig3": fig3}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("saved")
    th, si = synthetic_theory(), synthetic_sim()
    files.save_groups(th, str(d / "sweep.nc"))
    files.save_groups(si, str(d / "sim.nc"))
    return d


@pytest.fixture
def no_compute(monkeypatch):
    """Any theory sweep or simulation raises: --from must not recompute."""
    import phasefield.diagram as diagram
    import phasefield.simulate.measure as measure
    import phasefield.simulate.sweep as simsweep

    def boom(*a, **k):
        raise AssertionError("recomputed although --from was given")

    monkeypatch.setattr(diagram, "sweep", boom)
    monkeypatch.setattr(simsweep, "fixed_point_grid", boom)
    for name in ("token_geometry", "group_cosines", "rates", "transients"):
        monkeypatch.setattr(measure, name, boom)
    monkeypatch.setattr(compute, "compute", boom)


def _check_outputs(out, names):
    for name in names:
        for ext, magic in (("png", b"\x89PNG"), ("pdf", b"%PDF")):
            p = os.path.join(out, f"{name}.{ext}")
            assert os.path.getsize(p) > 2000, p
            with open(p, "rb") as f:
                assert f.read(4) == magic, p


# ------------------------------------------------------------------ drawing
def test_figures_from_saved_without_recomputation(saved, tmp_path, no_compute, capsys):
    out = tmp_path / "figs"
    rc = main(["figures", "--from", str(saved / "sweep.nc"), "--sim", str(saved / "sim.nc"), "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    _check_outputs(out, FIGS)
    # the data the figures used are saved beside them
    assert set(files.load_groups(str(out / "sweep.nc"))) == {"alpha_sigma_w", "sigma_a_alpha"}
    assert {"fig2", "fig3", "causal"} <= set(files.load_groups(str(out / "sim.nc")))
    # and the files written there load again, sim.nc found beside sweep.nc (the drawing from
    # loaded groups is the run above)
    from phasefield.figures import load_inputs

    said = []
    theory, sim = load_inputs(str(out / "sweep.nc"), None, echo=said.append)
    assert set(theory) == {"alpha_sigma_w", "sigma_a_alpha"}
    assert {"fig2", "fig3", "causal"} <= set(sim) and "sim.nc" in said[0]


def test_plain_theory_grid_draws_theory_figures(tmp_path, no_compute, capsys):
    """A single-group grid as written by ``phasefield sweep`` (no simulation)."""
    th = synthetic_theory()["alpha_sigma_w"]
    src = tmp_path / "plain.nc"
    th.to_netcdf(src, engine="h5netcdf")
    out = tmp_path / "figs"
    assert main(["figures", "--from", str(src), "--out", str(out)]) == 0
    _check_outputs(out, ("fig4", "fig5", "phase_diagram"))
    assert not (out / "fig2.png").exists()
    assert "fig2: skipped" in capsys.readouterr().out


def test_figure_functions_return_paths(tmp_path):
    from phasefield.figures import paper

    th = synthetic_theory()
    paths = paper.phase_diagram(th["alpha_sigma_w"], str(tmp_path))
    assert sorted(os.path.basename(p) for p in paths) == ["phase_diagram.pdf", "phase_diagram.png"]
    paths = paper.fig_exponent("lambda_g_collapse", th, {}, str(tmp_path), "only_theory")
    assert all(os.path.getsize(p) > 2000 for p in paths)


# ------------------------------------------------------------------ phases
def test_classify_synthetic():
    x = np.linspace(-1, 1, 5)
    y = np.linspace(-1, 1, 4)
    X, Y = np.meshgrid(x, y, indexing="ij")
    la, lg = X.copy(), Y.copy()
    la[0, 0] = np.nan
    ds = xr.Dataset({"lambda_a": (("x", "y"), la), "lambda_g_collapse": (("x", "y"), lg)}, coords={"x": x, "y": y})
    code = phase.classify(ds).values
    expect = 2 * (X >= 0) + (Y >= 0)
    expect[0, 0] = -1
    np.testing.assert_array_equal(code, expect)
    assert code.dtype == np.int8
    assert phase.PHASES[int(code[-1, -1])] == "chaotic, exploding"
    assert phase.PHASES[int(code[1, 0])] == "ordered, vanishing"
    assert phase.PHASES[int(code[-1, 0])] == "chaotic, vanishing"
    assert phase.PHASES[int(code[1, -1])] == "ordered, exploding"


_XS, _YS = np.linspace(0.0, 1.5, 61), np.linspace(0.0, 1.5, 41)


def _field_ds(fa, fg, xs=_XS, ys=_YS):
    X, Y = np.meshgrid(xs, ys, indexing="ij")
    return xr.Dataset(
        {"lambda_a": (("alpha", "sigma_w"), fa(X, Y)), "lambda_g_collapse": (("alpha", "sigma_w"), fg(X, Y))},
        coords={"alpha": xs, "sigma_w": ys},
    )


def test_critical_point_straight_lines_exact():
    ds = _field_ds(lambda a, s: a - 0.3, lambda a, s: s - 1.1)
    cp = phase.critical_point(ds)
    assert cp["kind"] == "crossing" and len(cp["points"]) == 1
    assert cp["alpha"] == pytest.approx(0.3, abs=1e-9)
    assert cp["sigma_w"] == pytest.approx(1.1, abs=1e-9)
    assert abs(cp["lambda_a"]) < 1e-9 and abs(cp["lambda_g_collapse"]) < 1e-9


def test_critical_point_curved_known_answer():
    # unit circle meets the diagonal at (1/sqrt 2, 1/sqrt 2); dims stored (sigma_w, alpha)
    ds = _field_ds(lambda a, s: a**2 + s**2 - 1.0, lambda a, s: s - a).transpose("sigma_w", "alpha")
    cp = phase.critical_point(ds, x="alpha", y="sigma_w")
    r = 1 / np.sqrt(2)
    assert cp["kind"] == "crossing"
    assert cp["alpha"] == pytest.approx(r, abs=2e-3)
    assert cp["sigma_w"] == pytest.approx(r, abs=2e-3)


def test_critical_point_two_crossings_and_closest():
    ds = _field_ds(lambda a, s: s - 0.75, lambda a, s: (a - 0.5) * (a - 1.0))
    cp = phase.critical_point(ds)
    assert [round(p[0], 6) for p in cp["points"]] == [0.5, 1.0]
    # contours that only meet at the alpha = 0 edge, like the real transformer's
    ds = _field_ds(
        lambda a, s: s - 1.8 - a**2,
        lambda a, s: s - 1.8 + a**2,
        xs=np.linspace(0.01, 0.99, 50),
        ys=np.linspace(1.0, 3.0, 81),
    )
    cp = phase.critical_point(ds)
    assert cp["kind"] == "closest" and cp["points"] == []
    assert cp["alpha"] == pytest.approx(0.01, abs=1e-9)
    assert cp["sigma_w"] == pytest.approx(1.8001, abs=1e-3)
    assert "do not cross" in phase.describe(cp)
    # no edge of chaos at all
    assert phase.critical_point(_field_ds(lambda a, s: 1 + a, lambda a, s: s - 1)) is None


def test_critical_point_needs_2d_slice():
    ds = _field_ds(lambda a, s: a - 0.3, lambda a, s: s - 1.1)
    ds3 = xr.concat([ds, ds], dim="depth").assign_coords(depth=[8, 16])
    with pytest.raises(ValueError, match="depth"):
        phase.critical_point(ds3)
    cp = phase.critical_point(ds3.isel(depth=[1]))  # size-1 dims are fine
    assert cp["alpha"] == pytest.approx(0.3)


# ------------------------------------------------------------------ agreement and summary
def test_agreement_and_demo_summary():
    from phasefield.figures import demo

    th, si = synthetic_theory(), synthetic_sim()
    a = agreement.agreement(th, si, "alpha_sigma_w")  # theory interpolated onto the sim grid
    assert a["theory"] == "interpolated" and a["points"] == 12
    assert 0 < a["lambda_a"]["median"] < 0.05 and a["lambda_a"]["median_se"] == pytest.approx(0.01)
    exact = agreement.theory_at(th["alpha_sigma_w"], th["alpha_sigma_w"].isel(sigma_w=[2, 5], alpha=[1, 3]))
    assert exact[1] == "exact"
    res = dict(theory=th, sim=si, settings=presets.QUICK, seconds=12.0)
    s = demo.summarize(res)
    assert s["critical_point"]["kind"] in ("crossing", "closest")
    text = demo.format_summary(s)
    assert "lambda_a" in text and "median" in text and "wall time" in text


# ------------------------------------------------------------------ CLI errors
def _bad_inputs(tmp_path):
    txt = tmp_path / "notnc.nc"
    txt.write_text("hello")
    one_d = tmp_path / "oned.nc"
    xr.Dataset(
        {"lambda_a": ("sigma_w", [0.1, 0.2]), "lambda_g_collapse": ("sigma_w", [0.1, 0.2])},
        coords={"sigma_w": [1.0, 2.0]},
    ).to_netcdf(one_d, engine="h5netcdf")
    nolam = tmp_path / "nolam.nc"
    xr.Dataset(
        {"foo": (("sigma_w", "alpha"), np.zeros((2, 2)))}, coords={"sigma_w": [1.0, 2.0], "alpha": [0.1, 0.2]}
    ).to_netcdf(nolam, engine="h5netcdf")
    afile = tmp_path / "afile"
    afile.write_text("x")
    return {
        "missing": ["--from", str(tmp_path / "nope.nc")],
        "not netcdf": ["--from", str(txt)],
        "1-D grid": ["--from", str(one_d)],
        "no lambdas": ["--from", str(nolam)],
        "missing sim": ["--sim", str(tmp_path / "nosim.nc")],
        "out is a file": ["--from", str(one_d), "--out-override", str(afile)],
    }


@pytest.mark.parametrize("case", ["missing", "not netcdf", "1-D grid", "no lambdas", "missing sim", "out is a file"])
def test_cli_bad_input(case, tmp_path, capsys, no_compute):
    args = _bad_inputs(tmp_path)[case]
    out = tmp_path / "out"
    if "--out-override" in args:
        i = args.index("--out-override")
        out_arg = args[i + 1]
        args = args[:i]
    else:
        out_arg = str(out)
    rc = main(["figures", *args, "--out", out_arg])
    err = capsys.readouterr().err
    assert rc == 2
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("phasefield: error:"), err
    assert not out.exists()


def test_cli_demo_bad_out(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["demo", "--out", str(f)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
