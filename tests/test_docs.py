"""The documentation: the README's and the docs' promises about the package's surface, the
MkDocs site (``mkdocs build --strict``) and the links (none points outside the repository).

The import checks run in a fresh interpreter: in-process tests import the subpackages first
and would hide a missing lazy attribute of ``phasefield``.
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fresh(code, cwd=ROOT):
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_lazy_subpackages_in_a_fresh_interpreter():
    code = (
        "import sys, phasefield\n"
        "assert 'phasefield.probing' not in sys.modules and 'phasefield.layers' not in sys.modules\n"
        "phasefield.probing; phasefield.layers; phasefield.diagram; phasefield.theory; phasefield.simulate\n"
        "assert phasefield.probe is phasefield.probing.probe and phasefield.sweep is phasefield.diagram.sweep\n"
        "assert hasattr(phasefield.layers, 'presets')\n"
        "print('ok')\n"
    )
    res = _fresh(code)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


# -- the MkDocs site ------------------------------------------------------------------------


def test_mkdocs_build_strict(tmp_path):
    """``mkdocs build --strict``: a dead link or anchor, a page missing from the nav, an API
    reference that does not resolve or a docstring griffe cannot parse fails the build."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-q",
            "-f",
            os.path.join(ROOT, "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    for page in (
        "index.html",
        "theory/index.html",
        "exact_agreement/index.html",
        "api/theory/index.html",
        "api/probing/index.html",
    ):
        assert (tmp_path / "site" / page).is_file(), page
    api = (tmp_path / "site" / "api" / "theory" / "index.html").read_text()
    assert "phasefield.theory.mlp" in api  # docstrings were rendered
    api = (tmp_path / "site" / "api" / "layers" / "index.html").read_text()
    assert "phasefield.layers.paper.lyapunov.exponents" in api
    changelog = (tmp_path / "site" / "changelog" / "index.html").read_text()
    assert "--8&lt;--" not in changelog and "2026-11-23" in changelog  # CHANGELOG.md included
    # a page's link into the API reference names an object the reference renders (mkdocs
    # checks the page, not the anchors mkdocstrings makes)
    n = 0
    for label, _, text in _markdown_sources():
        if label.startswith("docs"):
            for page, anchor in re.findall(r"\bapi/(\w+)\.md#([\w.]+)", " ".join(_links(text))):
                html = (tmp_path / "site" / "api" / page / "index.html").read_text()
                assert f'id="{anchor}"' in html, f"{label}: api/{page}.md#{anchor}"
                n += 1
    assert n >= 3, n


# -- links ----------------------------------------------------------------------------------

import glob  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402

_FENCE = re.compile(r"^ *(```|~~~).*?^ *\1 *$", re.S | re.M)
_INLINE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
_HTML = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")
_LOCAL = re.compile(r"\.\./shared|(?<![\w.~])/(?:work|home|root|Users|mnt|opt)/")


def _markdown_sources():
    """(label, directory the links are relative to, text) for every markdown the repo ships."""
    out = []
    files = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "CHANGELOG.md")]
    files += sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    for f in files:
        with open(f, encoding="utf-8") as fh:
            out.append((os.path.relpath(f, ROOT), os.path.dirname(f), fh.read()))
    for nb in sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb"))):
        with open(nb, encoding="utf-8") as fh:
            cells = json.load(fh)["cells"]
        for i, c in enumerate(cells):
            if c.get("cell_type") == "markdown":
                src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                out.append((f"{os.path.relpath(nb, ROOT)} cell {i}", os.path.dirname(nb), src))
    return out


def _anchors(path):
    """GitHub's heading anchors of a markdown file (lower case, punctuation dropped)."""
    with open(path, encoding="utf-8") as fh:
        text = _FENCE.sub("", fh.read())
    out = set()
    for h in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M):
        out.add(re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-"))
    return out


def _links(text):
    text = _INLINE.sub("", _FENCE.sub("", text))
    return _LINK.findall(text) + _REF.findall(text) + _HTML.findall(text)


# the one page whose links may leave the repository: the changelog's references to the
# formats it follows (Keep a Changelog, Semantic Versioning)
_EXTERNAL_OK = ("CHANGELOG.md",)
# a web link to source code: the project's own, or any repository file (a page of the
# documentation reaches the source through the API reference, docs/api/)
_SOURCE_URL = re.compile(r"phasefield|/(?:blob|tree|raw)/|\.py(?:[#?]|$)", re.I)


def _bad_links(sources):
    """(the bad links of ``sources`` with why, the number of relative links checked)."""
    bad, n = [], 0
    docs = os.path.join(ROOT, "docs")
    for label, base, text in sources:
        for target in _links(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http(s):, mailto: ...
                if not target.lower().startswith(("http://", "https://", "mailto:")):
                    bad.append(f"{label}: {target} (scheme)")
                elif _SOURCE_URL.search(target):
                    bad.append(f"{label}: {target} (source on the web: link the API reference, docs/api/)")
                elif label not in _EXTERNAL_OK:
                    bad.append(f"{label}: {target} (leaves the repository)")
                continue
            path = target.split("#", 1)[0].split("?", 1)[0]
            if not path:  # an anchor on the page
                continue
            n += 1
            if path.startswith("/") or path.startswith("~"):
                bad.append(f"{label}: {target} (absolute path)")
                continue
            full = os.path.realpath(os.path.join(base, path))
            if not (full == ROOT or full.startswith(ROOT + os.sep)):
                bad.append(f"{label}: {target} (outside the repository)")
            elif label.startswith("docs") and not full.startswith(docs + os.sep):
                bad.append(f"{label}: {target} (outside docs/: breaks on the built site; link docs/api/)")
            elif not os.path.exists(full):
                bad.append(f"{label}: {target} (no such file)")
            elif "#" in target and full.endswith(".md") and not label.startswith("docs"):
                # docs/ anchors are checked by mkdocs build --strict; the README's here
                if target.split("#", 1)[1] not in _anchors(full):
                    bad.append(f"{label}: {target} (no such heading)")
    return bad, n


def test_every_relative_link_resolves_inside_the_repository():
    """Every link resolves inside the repository; a page of docs/ links only inside docs/ (a
    link to ``../phasefield/...`` breaks on the built site: the source is reached through the
    API reference); no page but the changelog links out of the repository, and none to source
    on the web."""
    sources = _markdown_sources()
    assert len(sources) > 10
    bad, n = _bad_links(sources)
    assert n > 20, n
    assert not bad, "\n".join(bad)


def test_the_link_check_sees_bad_links():
    """The check above flags each kind of bad link (and passes the good ones)."""
    docs, readme = os.path.join(ROOT, "docs"), "README.md"
    good = [
        ("docs/probe.md", docs, "[api](api/probing.md#phasefield.probing.fix) [t](theory.md)"),
        (readme, ROOT, "[probe](docs/probe.md) [c](CHANGELOG.md)"),
        ("CHANGELOG.md", ROOT, "[Keep a Changelog](https://keepachangelog.com/en/1.1.0/)"),
    ]
    assert _bad_links(good) == ([], 4)
    for label, base, text in (
        ("docs/probe.md", docs, "[fix](../phasefield/probing/fix.py)"),  # a file, outside docs/
        ("docs/probe.md", docs, "[readme](../README.md)"),
        ("docs/probe.md", docs, "[x](https://github.com/someone/phasefield/blob/main/phasefield/probing/fix.py)"),
        ("docs/probe.md", docs, "[jax](https://jax.readthedocs.io/)"),  # leaves the repository
        (readme, ROOT, "[fix](https://example.org/src/fix.py)"),  # source on the web
        ("CHANGELOG.md", ROOT, "[x](https://github.com/someone/phasefield/tree/main)"),
        (readme, ROOT, "[x](docs/no_such_page.md)"),
        (readme, ROOT, "[x](../outside.md)"),
    ):
        bad, _ = _bad_links([(label, base, text)])
        assert len(bad) == 1, (label, text, bad)


def test_nothing_references_paths_outside_the_repository():
    bad = []
    for label, _, text in _markdown_sources():
        bad += [f"{label}: {m.group(0)!r}" for m in _LOCAL.finditer(text)]
    for pattern in ("phasefield/**/*.py", "tests/*.py", "scripts/*.py"):
        for f in glob.glob(os.path.join(ROOT, pattern), recursive=True):
            with open(f, encoding="utf-8") as fh:
                text = fh.read()
            if os.path.basename(f) == "test_docs.py":
                continue
            if "shared/THEORY" in text or re.search(r"(?<!docs/)THEORY\.md", text):
                bad.append(os.path.relpath(f, ROOT))
    assert not bad, "\n".join(bad)


def test_theory_sections_cited_exist():
    """Every "docs/theory.md §N" in the code and the docs names a section of docs/theory.md."""
    with open(os.path.join(ROOT, "docs", "theory.md"), encoding="utf-8") as fh:
        have = set(re.findall(r"^## (\d+)\. ", fh.read(), re.M))
    assert have == {str(i) for i in range(1, 10)}
    cited = set()
    files = glob.glob(os.path.join(ROOT, "phasefield", "**", "*.py"), recursive=True)
    files += glob.glob(os.path.join(ROOT, "tests", "*.py")) + glob.glob(os.path.join(ROOT, "scripts", "*.py"))
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for m in re.finditer(r"docs/theory\.md,? ((?:§\d+(?:[-–]\d+)?(?:,? (?:and )?)?)+)", fh.read()):
                for a, b in re.findall(r"§(\d+)(?:[-–](\d+))?", m.group(1)):
                    cited.update(str(i) for i in range(int(a), int(b or a) + 1))
    assert cited and cited <= have, sorted(cited - have)
