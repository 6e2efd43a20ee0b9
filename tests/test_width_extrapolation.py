"""scripts/width_extrapolation.py: its 1/d fit recovers a known intercept with the
standard error of the weighted least-squares formula, and ``run`` resumes (skips the rows
present, survives a torn last line). The measurement itself is the script's run, not a test."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location(
        "width_extrapolation_script", os.path.join(ROOT, "scripts", "width_extrapolation.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fit_recovers_a_known_intercept_and_its_standard_error(script):
    """Exact data: the line itself. Noisy data (4 widths, se falling as d^-1/2): over 4000
    synthetic sets the intercepts average to the truth and scatter by the stated se (the
    mean of the stated se, uninflated where chi^2/dof <= 1, within 5% of the spread)."""
    d = np.array([512.0, 1024.0, 2048.0, 4096.0])
    a, b = 0.0664, -1.3
    se = 3e-4 * np.sqrt(1024.0 / d)
    f = script.fit_inverse_width(d, a + b / d, se)
    assert f["a"] == pytest.approx(a, abs=1e-12) and f["b"] == pytest.approx(b, abs=1e-9)
    # the se of the intercept: sqrt of [(X^T W X)^-1]_00, written out for two parameters
    w = 1.0 / se**2
    s0, s1, s2 = w.sum(), (w / d).sum(), (w / d**2).sum()
    assert f["a_se"] == pytest.approx(np.sqrt(s2 / (s0 * s2 - s1 * s1)), rel=1e-10)
    assert f["chi2_dof"] == pytest.approx(0.0, abs=1e-12) and f["inflation"] == 1.0

    rng = np.random.default_rng(0)
    fs = [script.fit_inverse_width(d, a + b / d + se * rng.standard_normal(4), se) for _ in range(4000)]
    est = np.array([f["a"] for f in fs])
    raw = np.array([f["a_se"] / f["inflation"] for f in fs])
    assert np.allclose(raw, raw[0])  # the formula's se does not depend on the data
    assert abs(est.mean() - a) < 4 * raw[0] / np.sqrt(len(fs))
    assert est.std(ddof=1) == pytest.approx(raw[0], rel=0.05)
    chi2 = np.array([f["chi2_dof"] for f in fs])
    assert chi2.mean() == pytest.approx(1.0, abs=0.1)  # chi^2 with 2 dof, over 2
    # inflated where the scatter exceeds the stated se
    big = script.fit_inverse_width(d, a + b / d + 5 * se * np.array([1, -1, 1, -1]), se)
    assert big["inflation"] > 1 and big["a_se"] == pytest.approx(big["inflation"] * raw[0], rel=1e-10)


def test_fit_refuses_what_it_cannot_fit(script):
    with pytest.raises(ValueError, match="two or more distinct widths"):
        script.fit_inverse_width([1024, 1024], [0.1, 0.2], [0.01, 0.01])
    with pytest.raises(ValueError, match="finite values"):
        script.fit_inverse_width([512, 1024], [np.nan, 0.2], [0.01, 0.01])
    # two widths: the line through both points, no chi^2
    f = script.fit_inverse_width([512, 1024], [1.0, 0.5], [0.1, 0.1])
    assert f["a"] == pytest.approx(0.0, abs=1e-12) and np.isnan(f["chi2_dof"]) and f["inflation"] == 1.0


def test_run_resumes_and_skips_done_rows(script, tmp_path):
    """A stand-in measurement: the first run measures every (preset, point, width) once, a
    rerun none; a torn last line (a kill in mid-write) is skipped and its row measured again
    without losing the next one; a new width measures only its own rows."""
    calls = []

    def fake(preset, text, sigma, width, args):
        calls.append((text, width))
        sim = {}
        for q in script.QUANTITIES:
            sim[q], sim[q + "_se"] = 1.0 + 1.0 / width, 0.01
        return dict(
            preset=preset,
            spec=text,
            sigma=sigma,
            alpha=args.alpha,
            heads=script.HEADS,
            width=width,
            draws=args.draws,
            weights=args.weights,
            seed=args.seed * 100003 + width,
            n_tokens=script.N_TOKENS,
            depth=script.DEPTH,
            sim=sim,
        )

    argv = ["run", "--out", str(tmp_path), "--presets", "dyt,pre-ln", "--sigmas", "0.5,1.5", "--widths", "512,1024"]
    args = script.parser().parse_args(argv)
    assert script.run(args, measure=fake) == 8 and len(calls) == 8
    assert script.run(args, measure=fake) == 0 and len(calls) == 8
    path = tmp_path / script.ROWS
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])  # torn
    assert len(script.read_rows(path)) == 7
    assert script.run(args, measure=fake) == 1 and calls[-1] == calls[7]
    assert len(script.read_rows(path)) == 8
    args = script.parser().parse_args(argv[:-1] + ["512,1024,2048"])
    assert script.run(args, measure=fake) == 4 and {w for _, w in calls[-4:]} == {2048}
    rows = script.read_rows(path)
    assert len(rows) == 12 and len({script.row_key(r) for r in rows}) == 12
    # other draws are other rows
    args = script.parser().parse_args(argv + ["--draws", "64"])
    assert script.run(args, measure=fake) == 8
    bad = []
    for line in path.read_text().splitlines():
        try:
            json.loads(line)
        except json.JSONDecodeError:
            bad.append(line)
    assert len(bad) == 1 and len(script.read_rows(path)) == 20  # only the torn line is lost


def test_tables_align_points_measured_at_different_widths(script):
    """The markdown printer: one column per width of the preset, a blank cell where a
    point lacks that width, the softmax-path columns only where the theory has them."""

    def fit(text, widths, soft):
        f = script.fit_inverse_width(widths, [0.1 + 1 / d for d in widths], [0.01] * len(widths))
        return dict(
            preset=text.split(":")[0],
            spec=text,
            quantity="lambda_g_input",
            widths=widths,
            draws=[32] * len(widths),
            values=[0.1 + 1 / d for d in widths],
            ses=[0.01] * len(widths),
            theory=0.1,
            theory_softmax=0.1 if soft else None,
            weights="lazy",
            z=(f["a"] - 0.1) / f["a_se"],
            **f,
        )

    fs = [fit("dyt:sigma=1,alpha=0.3,heads=4", [512, 1024], True)]
    fs += [fit("dyt:sigma=1,alpha=0.3,heads=4,a=2", [512, 1024, 2048], True)]
    fs += [fit("pre-ln:sigma=1,alpha=0.3,heads=4", [512, 1024], False)]
    fs += [dict(f, quantity=q) for f in fs for q in script.QUANTITIES if q != "lambda_g_input"]
    lines = script.tables(fs)
    rows = [ln for ln in lines if ln.startswith("|")]
    for block in ("### dyt", "### pre-ln"):
        i = lines.index(block)
        head = lines[i + 4]
        body = [ln for ln in lines[i + 6 :] if ln.startswith("|")][: 2 if block == "### dyt" else 1]
        assert all(ln.count("|") == head.count("|") for ln in body), (head, body)
        assert ("softmax path" in head) == (block == "### dyt")
    assert "d = 2048" in lines[lines.index("### dyt") + 4] and "d = 2048" not in lines[lines.index("### pre-ln") + 4]
    assert "| sigma=1,alpha=0.3,a=2 |" in "\n".join(rows)
