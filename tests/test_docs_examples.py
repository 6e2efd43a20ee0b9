"""Every fenced example of the README and the docs runs.

* ```python blocks run with mktestdocs (``check_md_file(memory=True)``: a page's blocks in
  order, in one namespace, as a reader would paste them), in a temporary working directory.
* ```bash / ```console blocks run their ``phasefield ...`` commands in-process through
  :func:`phasefield.cli.main` (exit code 0 required), in order, in one temporary directory
  per page (``docs/`` linked into it, so commands that read the repository's data work).
  ``console`` blocks run their ``$ `` lines and show output after them. A block that cannot
  run in the suite (training, the full-size figures, ``make``) is preceded by
  ``<!-- docs-test: skip: REASON -->``; it is reported as skipped with that reason.

Examples are written small (tiny grids, few blocks and draws) and share sizes across pages so
that one compilation serves several of them (the shell blocks run in-process, first, so JAX's
in-memory caches serve the Python blocks too; the run's persistent cache, ``tests/conftest.py``,
serves the other worker).
"""

import glob
import os
import re
import shlex

import mktestdocs
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))

_SHELL = re.compile(
    r"(?:^<!--\s*docs-test:\s*skip:\s*(?P<reason>.*?)\s*-->[ \t]*\n)?"
    r"^```(?P<lang>bash|console|sh|shell)[ \t]*\n(?P<body>.*?)^```[ \t]*$",
    re.M | re.S,
)


def _read(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as fh:
        return fh.read()


def python_pages():
    return [p for p in PAGES if mktestdocs.grab_code_blocks(_read(p), lang="python")]


def shell_blocks():
    """(page, index on the page, skip reason or None, [argv, ...]) for every shell block."""
    out = []
    for page in PAGES:
        for i, m in enumerate(_SHELL.finditer(_read(page))):
            body = m.group("body").replace("\\\n", " ")
            lines = body.splitlines()
            if m.group("lang") == "console":
                lines = [ln[2:] for ln in lines if ln.startswith("$ ")]
            cmds = []
            for ln in lines:
                words = shlex.split(ln, comments=True)
                while words:
                    cut = words.index("&&") if "&&" in words else len(words)
                    cmds.append(words[:cut])
                    words = words[cut + 1 :]
            out.append((page, i, m.group("reason"), cmds))
    return out


_BLOCKS = shell_blocks()


def _parse(group, argv):
    """Parse a ``phasefield ...`` command line down to its command without running it: the
    command exists and its options and required arguments are right."""
    import click

    cmd, args, name = group, list(argv[1:]), argv[0]
    while isinstance(cmd, click.Group):
        ctx = cmd.make_context(name, args, resilient_parsing=True)
        name, cmd, args = cmd.resolve_command(ctx, ctx.protected_args + ctx.args)
        assert cmd is not None, f"no command {name!r}: {shlex.join(argv)}"
    cmd.make_context(name, args)


@pytest.mark.parametrize("page,index,reason,cmds", _BLOCKS, ids=[f"{p}#{i}" for p, i, _, _ in _BLOCKS])
def test_shell_examples(page, index, reason, cmds, tmp_path_factory, capsys):
    from phasefield.cli import cli, main

    if reason:
        for argv in cmds:  # not run, but their options must parse
            if argv[0] == "phasefield":
                _parse(cli, argv)
        pytest.skip(reason)

    # one working directory per page: a later block may read what an earlier one wrote
    work = tmp_path_factory.getbasetemp() / ("shell-" + page.replace("/", "_"))
    if not work.exists():
        work.mkdir()
        os.symlink(os.path.join(ROOT, "docs"), work / "docs")
    assert cmds, f"{page} shell block {index} has no command"
    cwd = os.getcwd()
    os.chdir(work)
    try:
        for argv in cmds:
            assert argv[0] == "phasefield", (
                f"{page}: only phasefield commands run in the suite; mark the block "
                f"'<!-- docs-test: skip: REASON -->' ({shlex.join(argv)})"
            )
            rc = main(argv[1:])
            out = capsys.readouterr()
            assert rc == 0, f"{shlex.join(argv)} -> exit {rc}\n{out.out[-2000:]}\n{out.err[-2000:]}"
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("page", python_pages())
def test_python_examples(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    mktestdocs.check_md_file(os.path.join(ROOT, page), memory=True)
