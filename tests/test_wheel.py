"""The wheel works outside the repository.

Builds the wheel from a copy of the sources (``python -m build --wheel --no-isolation``: the
test environment's setuptools and wheel, no download), installs it with ``--no-deps
--no-index`` into a fresh ``python -m venv`` and makes the dependencies visible through a
``.pth`` file naming this environment's site-packages (a plain path line: the ``.pth`` files
inside that directory, among them the repository's editable install, are not processed). From
a working directory outside the repository it then runs ``phasefield exponents --json``,
imports ``phasefield.probing`` and ``phasefield.layers`` (``phasefield.probe`` a function),
and asks the packaged predictor (``phasefield predict``,
``phasefield/vit/trainability_model.json``) for a prediction.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.wheel


def _run(cmd, **kw):
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    assert res.returncode == 0, f"{cmd}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def test_wheel_installs_and_runs_outside_the_repository(tmp_path):
    # 1. the wheel, built from a copy (no build/ or egg-info left in the repository)
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    shutil.copytree(
        os.path.join(ROOT, "phasefield"), src / "phasefield", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, src])
    (wheel,) = dist.glob("phasefield-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "phasefield/vit/trainability_model.json" in names
    assert "phasefield/probing/__init__.py" in names and "phasefield/layers/__init__.py" in names
    assert not any(n.startswith(("tests/", "scripts/", "docs/")) for n in names)

    # 2. a clean venv with the wheel; dependencies from this environment, not the repo
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", "--no-index", wheel])
    site = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    with open(os.path.join(site, "_phasefield_test_deps.pth"), "w") as fh:
        fh.write(sysconfig.get_paths()["purelib"] + "\n")

    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PHASEFIELD_HOST_DEVICES"] = "1"

    # 3. the installed package, not the repository's
    out = _run(
        [
            py,
            "-c",
            "import inspect, phasefield; phasefield.probing; phasefield.layers; "
            "assert inspect.isfunction(phasefield.probe); print(phasefield.__file__)",
        ],
        cwd=cwd,
        env=env,
    ).stdout.strip()
    assert out.startswith(str(venv)), out
    assert not out.startswith(ROOT + os.sep), out

    exe = venv / "bin" / "phasefield"
    ex = json.loads(
        _run(
            [
                exe,
                "exponents",
                "--sigma-w",
                "2",
                "--sigma-a",
                "1",
                "--alpha-a",
                ".5",
                "--alpha-m",
                ".5",
                "--n-tokens",
                "32",
                "--depth",
                "16",
                "--json",
            ],
            cwd=cwd,
            env=env,
        ).stdout
    )
    assert abs(ex["lambda_a"] - 0.0246) < 1e-3
    pred = json.loads(
        _run(
            [
                exe,
                "predict",
                "--sigma-w",
                "1.2",
                "--sigma-a",
                "1",
                "--alpha-a",
                ".4",
                "--alpha-m",
                ".6",
                "--depth",
                "24",
                "--json",
            ],
            cwd=cwd,
            env=env,
        ).stdout
    )
    assert 0 < pred["predicted_loss"] < pred["chance_loss"]
    assert pred["interval"][0] <= pred["predicted_loss"] <= pred["interval"][1]
    assert os.listdir(cwd) == []  # nothing written to the working directory
