"""What README.md and docs/*.md name exists: relative links (and their anchors), paths in the
repository, console scripts and ``python -m`` modules. A renamed file or module fails here
instead of in a reader's shell."""
from __future__ import annotations

import importlib.util
import os
import re
from functools import cache

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = ["README.md"] + sorted(os.path.join("docs", f)
                               for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
#: top-level folders whose paths the pages name
TOP = ("pycoll", "rendezvous", "benchmarks", "tests", "tools", "docs", "examples", ".ci")
#: paths that are made by a command, not kept in the repository
MADE = ("benchmarks/out", "tools/rdma-lab/cache")
#: paths another change adds (remove once it is in)
PENDING = {"tools/test.sh"}
#: the packages whose ``python -m`` modules must be found
OURS = ("pycoll", "rendezvous", "benchmarks", "tests", "tools")

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
_TOPS = "|".join(re.escape(t) for t in TOP)
PATH = re.compile(r"(?<![\w./-])((?:" + _TOPS + r")/[\w./-]*)")
SCRIPT = re.compile(r"(?<![\w./-])(pycoll-[a-z]+)(?=[\s`'\"]|$)")
MODULE = re.compile(r"\bpython3?(?:\.\d+)? -m ([\w.]+)")
CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)


def _read(page: str) -> str:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return f.read()


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


@cache
def anchors(page: str) -> frozenset[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    text = re.sub(r"```.*?```", "", _read(page), flags=re.S)
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M):
        s = slug(m.group(1))
        k = seen.get(s, 0)
        out.add(s if k == 0 else f"{s}-{k}")
        seen[s] = k + 1
    return frozenset(out)


def links(page: str):
    text = _read(page)
    for m in LINK.finditer(text):
        target = m.group(1) or m.group(2)
        if re.match(r"[a-z]+:", target):   # http:, https:, mailto:
            continue
        yield target


def named_paths(page: str):
    text = _read(page)
    for m in PATH.finditer(text):
        p = m.group(1).rstrip(".,;:")
        if text[m.start() - 1:m.start()] == ":":   # git's COMMIT:path, a path in history
            continue
        if any(c in p for c in "<>*{}") or p.startswith(MADE) or p in PENDING:
            continue
        if p.count("/") == 1 and "." not in p:   # "pycoll/Gloo", a ratio, not a path
            continue
        yield p


def console_scripts() -> set[str]:
    """The names in pyproject.toml's [project.scripts] (read without tomllib: Python 3.10)."""
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    table = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([\w.-]+)\s*=", table, re.M))


def code(page: str) -> str:
    return "\n".join(m.group(0) for m in CODE.finditer(_read(page)))


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_and_anchors_exist(page):
    bad = []
    base = os.path.dirname(os.path.join(ROOT, page))
    for target in links(page):
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(base, path)) if path else os.path.join(ROOT, page)
        if not os.path.exists(full):
            bad.append(f"{target}: no {os.path.relpath(full, ROOT)}")
        elif anchor and full.endswith(".md") and \
                anchor not in anchors(os.path.relpath(full, ROOT)):
            bad.append(f"{target}: no heading #{anchor} in {os.path.relpath(full, ROOT)}")
    assert not bad, f"{page}: broken links:\n" + "\n".join(bad)


@pytest.mark.parametrize("page", PAGES)
def test_named_paths_exist(page):
    bad = sorted({p for p in named_paths(page) if not os.path.exists(os.path.join(ROOT, p))})
    assert not bad, f"{page} names paths that do not exist:\n" + "\n".join(bad)


@pytest.mark.parametrize("page", PAGES)
def test_console_scripts_exist(page):
    scripts = console_scripts()
    bad = sorted({s for s in SCRIPT.findall(code(page)) if s not in scripts})
    assert not bad, f"{page} names console scripts pyproject.toml lacks: {bad}"


@pytest.mark.parametrize("page", PAGES)
def test_python_m_modules_exist(page):
    bad = []
    for mod in sorted(set(MODULE.findall(_read(page)))):
        if mod.split(".")[0] not in OURS:
            continue
        try:
            found = importlib.util.find_spec(mod) is not None
        except ImportError:
            found = False
        if not found:
            bad.append(mod)
    assert not bad, f"{page} names `python -m` modules that cannot be found: {bad}"


def test_the_checks_see_what_they_check():
    """The patterns find what they are for (an empty match would pass every page)."""
    readme = _read("README.md")
    assert "docs/index.md" in list(links("README.md"))
    assert "pycoll.run" in MODULE.findall(readme)
    assert "pycoll-run" in SCRIPT.findall(code("README.md"))
    assert "pycoll/fastpath/" in list(named_paths("README.md"))
    assert "the-fast-path-one-host" in anchors("docs/algorithms.md")
    assert {"pycoll-run", "pycoll-bench", "pycoll-info", "pycoll-trace"} <= console_scripts()
    assert slug("What is installed: `python -m pycoll.info`") == \
        "what-is-installed-python--m-pycollinfo"
