"""The command line starts light: ``import phasefield.cli``, ``phasefield --help``,
``phasefield --version`` and every ``phasefield COMMAND --help`` import no JAX (the topic
modules load on demand, :class:`phasefield.cli.LazyGroup`); the settings the command owns
(every CPU core a device, scoped x64) apply when a command runs. One version everywhere:
``phasefield.__version__``, ``phasefield --version``, setup.cfg and the CHANGELOG's latest
release. The help lists the presets from a table written out for it, which must be the
registry's. (Start-up times are measured by scripts/bench_cli.py, not asserted here.)
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys

import click
import pytest

import phasefield
from phasefield import cli as cli_module
from phasefield.cli import COMMANDS, cli, main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("jax", "jaxlib", "flax", "optax", "numpy", "scipy", "matplotlib", "xarray", "sklearn")
JAX = ("jax", "jaxlib", "flax", "optax")


def _python(code, **env):
    """Run ``code`` in a fresh interpreter (repository root, the given environment variables
    added); its stdout's last line as JSON."""
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, **env}
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _loaded(expr="None"):
    return f"import json, sys; print(json.dumps([{expr}, sorted(m for m in {HEAVY!r} if m in sys.modules)]))"


def test_import_cli_imports_no_jax():
    _, heavy = _python("import phasefield.cli; " + _loaded())
    assert heavy == []


def test_help_and_version_import_no_jax():
    code = (
        "import contextlib, io; from phasefield.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    rcs = [main(['--help']), main(['--version'])]\n" + _loaded("rcs")
    )
    rcs, heavy = _python(code)
    assert rcs == [0, 0] and heavy == []


def _leaf_commands(group=cli, prefix=()):
    for name, cmd in sorted(group.commands.items()):
        if isinstance(cmd, click.Group):
            yield from _leaf_commands(cmd, prefix + (name,))
        yield prefix + (name,)


def test_every_command_help_imports_no_jax():
    """``phasefield COMMAND --help`` loads the command's topic module (and NumPy), no JAX."""
    commands = [list(c) for c in _leaf_commands()]
    code = (
        "import contextlib, io; from phasefield.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rcs = [main(c + ['--help']) for c in {commands!r}]\n" + _loaded("rcs")
    )
    rcs, heavy = _python(code)
    assert rcs == [0] * len(commands) and not set(heavy) & set(JAX), heavy


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = re.findall(r"^  (\S+)  ", out.split("Commands:")[1], re.M)
    assert listed == sorted(cli.commands) == sorted(COMMANDS)


def test_help_summaries_are_the_commands_own():
    """The one-line summaries the group keeps (to list the commands without importing them)
    are the first sentences of the commands' own help, and each command's topic (alone) gives it."""
    for name, (topic, summary) in COMMANDS.items():
        assert cli.commands[name].get_short_help_str(10**6) == summary, name
        alone = cli_module.LazyGroup(name="phasefield", lazy=COMMANDS)
        assert alone.get_command(None, name) is not None and alone._loaded == {topic}, name


def test_lazy_listing_matches_the_loaded_one(capsys):
    """The help of a group that has loaded nothing lists the same lines as after loading."""
    fresh = cli_module.LazyGroup(name="phasefield", lazy=COMMANDS, help=cli.help)
    ctx = click.Context(fresh, info_name="phasefield", max_content_width=100)
    lazy_text = fresh.get_help(ctx)
    assert not fresh._commands
    loaded = fresh.commands  # loads every topic
    assert sorted(loaded) == sorted(COMMANDS)
    assert fresh.get_help(ctx) == lazy_text


def test_version_is_one():
    """``phasefield --version`` = ``phasefield.__version__`` = the CHANGELOG's latest release,
    and setup.cfg reads it from the package (statically: a literal setuptools needs no import for)."""
    res = subprocess.run(
        [sys.executable, "-m", "phasefield", "--version"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert res.returncode == 0, res.stderr
    printed = res.stdout.split()[-1]
    with open(os.path.join(ROOT, "CHANGELOG.md"), encoding="utf-8") as f:
        released = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", f.read(), re.M)
    assert released, "CHANGELOG.md has no '## [x.y.z]' section"
    assert printed == phasefield.__version__ == released[0]

    with open(os.path.join(ROOT, "setup.cfg"), encoding="utf-8") as f:
        assert re.search(r"^version = attr: phasefield\.__version__$", f.read(), re.M)
    with open(os.path.join(ROOT, "phasefield", "__init__.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    literal = [
        n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        and any(getattr(t, "id", None) == "__version__" for t in n.targets)
        and isinstance(n.value, ast.Constant)
    ]
    assert literal == [phasefield.__version__]


SETUP_PROBE = r"""
import json, os, sys
import click
from phasefield import cli

@click.command("setup-probe")
def setup_probe():
    import jax
    print(json.dumps(dict(x64=bool(jax.config.jax_enable_x64), flags=os.environ.get("XLA_FLAGS", ""),
                          devices=jax.device_count())))

cli.cli.add_command(setup_probe)
before = "jax" in sys.modules
if sys.argv[1] == "entry":
    sys.argv = ["phasefield", "setup-probe"]
    rc = cli.main()
else:
    rc = cli.main(["setup-probe"])
print(json.dumps(dict(rc=rc, jax_before=before)))
"""


@pytest.mark.parametrize("how", ["entry", "argv"])
def test_command_setup_applies_when_a_command_runs(how):
    """As the process entry point the command makes every core a device (here
    PHASEFIELD_HOST_DEVICES=2) and runs with x64; called with an explicit argv, x64 only."""
    env = {
        **os.environ,
        "PHASEFIELD_HOST_DEVICES": "2",
        "PHASEFIELD_CACHE": "off",
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "",
    }
    res = subprocess.run(
        [sys.executable, "-c", SETUP_PROBE, how], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env
    )
    assert res.returncode == 0, res.stderr[-3000:]
    inside, outcome = (json.loads(line) for line in res.stdout.strip().splitlines()[-2:])
    assert outcome == dict(rc=0, jax_before=False)
    assert inside["x64"] is True
    if how == "entry":
        assert "xla_force_host_platform_device_count=2" in inside["flags"] and inside["devices"] == 2
    else:
        assert inside["flags"] == "" and inside["devices"] == 1


# -- the presets in the help ----------------------------------------------------------------

BLOCK_OPTIONS = ("--block", "--preset", "--as")  # the options that take a phasefield block


def _block_options():
    """(command path, option, help) for every option of every command that takes a block."""
    out = []
    for path in _leaf_commands():
        cmd = cli
        for name in path:
            cmd = cmd.commands[name]
        if isinstance(cmd, click.Group):
            continue
        out += [(" ".join(path), p.opts[0], p.help or "") for p in cmd.params if set(p.opts) & set(BLOCK_OPTIONS)]
    return out


def test_the_help_lists_the_registry_presets():
    """--help names presets from a table (the registry fills only as JAX loads); the table is
    the registry's, and `recommend`'s standard blocks are phasefield.layers.recommend's."""
    from phasefield.cli import blockopt
    from phasefield.layers import presets, registry
    from phasefield.layers import recommend as rb

    assert blockopt.PRESETS == presets.NAMES == registry.names()
    assert blockopt.RECOMMEND_BLOCKS == rb.BLOCKS


def test_every_block_option_help_names_every_preset(capsys):
    """Every option that takes a block lists every registered preset in its help, except
    `recommend --block`: the presets with a closed-form engine (their critical set) and the
    standard blocks it searches, and no other. The rendered help of `exponents` lists them too."""
    from phasefield.layers import presets, registry
    from phasefield.layers import recommend as rb

    options = _block_options()
    commands = {c for c, _, _ in options}
    assert {"exponents", "sweep", "simulate sweep", "probe", "recommend", "train-sweep"} <= commands, commands
    recommendable = {n for n in presets.NAMES if registry.lookup(n).fast_engine} | set(rb.BLOCKS)
    assert recommendable < set(presets.NAMES)
    for command, opt, text in options:
        listed = {n for n in presets.NAMES if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text)}
        want = recommendable if command == "recommend" else set(presets.NAMES)
        assert listed >= want, (command, opt, sorted(want - listed))
        if command == "recommend":
            assert listed == want, (command, opt, sorted(listed - want))
    assert main(["exponents", "--help"]) == 0
    out = re.sub(r"-\s+", "-", capsys.readouterr().out)  # click may wrap a line after a hyphen
    assert all(n in out for n in presets.NAMES), out


def test_the_paper_flags_are_the_paper_numbers_class():
    """The paper block's flags are written once in the CLI (phasefield.cli.common: --help
    imports no JAX); they are the fields of the paper preset's numbers class, with its
    defaults, plus ``alpha`` (ties alpha_A = alpha_M), and the preset's NUMBERS and OPTIONS.
    Every command taking them has the whole set, and blockopt's map follows them."""
    import dataclasses

    from phasefield.cli import blockopt, common
    from phasefield.layers import registry

    preset = registry.lookup("paper")
    fields = {f.name: f.default for f in dataclasses.fields(preset.numbers_class)}
    flags = {**common.PAPER_NUMBERS, **common.PAPER_CONTEXT, **common.PAPER_OPTIONS}
    assert set(flags) == set(fields) | {"alpha"}
    assert {k: v for k, v in flags.items() if k != "alpha"} == fields
    assert set(common.PAPER_NUMBERS) == set(preset.numbers) | {"alpha"}
    assert set(common.PAPER_OPTIONS) == set(preset.options)
    assert set(common.PAPER_CONTEXT) == set(fields) - set(preset.numbers) - set(preset.options)
    assert set(blockopt.PAPER_FLAGS) == set(common.PAPER_NUMBERS) | set(common.PAPER_OPTIONS)
    assert all(set(v) <= set(preset.numbers) | set(preset.options) for v in blockopt.PAPER_FLAGS.values())
    names = set(common.PAPER_NUMBERS) | set(common.PAPER_CONTEXT)
    for path in (["exponents"], ["trajectory"], ["sweep"], ["simulate", "exponents"], ["simulate", "sweep"]):
        cmd = cli
        for name in path:
            cmd = cmd.commands[name]
        params = {p.name for p in cmd.params}
        assert names <= params, (path, names - params)
        want = set(common.PAPER_OPTIONS) if path[0] != "simulate" else {"activation", "mlp_layers", "residual"}
        assert want <= params, (path, want - params)
