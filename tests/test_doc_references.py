"""Every reference in the code and the docs resolves: a path of the repository that a
docstring, a comment, a user-facing message, the README or docs/ names exists; a module
named by its dotted path (`orchestrator.lab.server`) imports; a Markdown link reaches its
file and heading; and no text sends readers to a design file the repository lacks."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

#: one worker reads and parses the tracked files once for every test here (all_texts)
pytestmark = pytest.mark.xdist_group("test_doc_references")

REPO = Path(__file__).resolve().parents[1]
DOCS = ("docs/design.md", "docs/formats.md", "docs/verdicts.md", "docs/usage.md", "docs/search.md")
#: a path from the repository's root, as text names it (not `.lab/...` nor `<dir>/...`:
#: those are made at run time)
PATH_RE = re.compile(
    r"(?<![\w./~$<{@-])((?:orchestrator|tests|bench|scripts|docs|experiments)"
    r"/[\w./-]*[\w/])"
)
MODULE_RE = re.compile(r"(?<![\w./-])(orchestrator(?:\.[a-z_][a-z0-9_]*)+)")
FILE_SUFFIXES = ("db", "log", "json", "yaml", "py", "service", "conf", "lock", "pid")
LINK_RE = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
#: the name of the product brief that docstrings once pointed to (assembled, so that this
#: file does not mention it either)
GONE = "DESIGN" + ".md"


def tracked(*suffixes: str) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return [
        REPO / f
        for f in out
        if f.endswith(suffixes) and not f.startswith("tests/data/") and (REPO / f).is_file()
    ]


def python_texts(path: Path) -> list[str]:
    """The prose of a Python file: docstrings and comments; in the product's code (and the
    benchmarks) every string, since messages and hints name paths too."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    texts: list[str] = []
    product = path.relative_to(REPO).parts[0] in ("orchestrator", "bench")
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                texts.append(doc)
        elif product and isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts.append(node.value)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            texts.append(tok.string)
    return texts


@functools.cache
def all_texts() -> list[tuple[Path, str]]:
    out: list[tuple[Path, str]] = []
    for path in tracked(".py"):
        out += [(path, t) for t in python_texts(path)]
    for path in tracked(".md", ".yaml", ".yml", ".toml") + [
        REPO / "scripts" / n for n in ("bootstrap", "demo", "test")
    ]:
        out.append((path, path.read_text(encoding="utf-8")))
    return out


def test_the_docs_folder_has_the_design_the_formats_and_the_verdicts() -> None:
    for doc in DOCS:
        text = (REPO / doc).read_text(encoding="utf-8")
        assert text.startswith("# ") and len(text) > 2000, doc
    verdicts = (REPO / "docs/verdicts.md").read_text(encoding="utf-8")
    for word in (
        "`pass`",
        "`fail`",
        "`other`",
        "`timeout`",
        "`invalid`",
        "`infra`",
        "`refused`",
        "`error`",
        "`dead`",
        "`interrupted`",
        "`incomplete`",
    ):
        assert word in verdicts, word
    for code in ("| 0 |", "| 1 |", "| 2 |", "| 3 |", "| 4 |", "| 5 |", "| 130 |"):
        assert code in verdicts, code
    formats = (REPO / "docs/formats.md").read_text(encoding="utf-8")
    for section in ("## Experiment config", "## Hosts file", "## Sweep", "## Lab scenario"):
        assert section in formats, section


def test_nothing_mentions_the_design_file_the_repository_lacks() -> None:
    found = [str(p.relative_to(REPO)) for p, t in all_texts() if GONE in t]
    assert sorted(set(found)) == [], f"{GONE} is mentioned in {sorted(set(found))}"


def test_every_repository_path_mentioned_exists() -> None:
    missing = sorted(
        {
            (str(p.relative_to(REPO)), m)
            for p, t in all_texts()
            for m in PATH_RE.findall(t)
            if not (REPO / m).exists()
        }
    )
    assert missing == [], missing


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            if importlib.util.find_spec(name) is None:
                continue
        except ModuleNotFoundError:
            continue
        obj: object = importlib.import_module(name)
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_module_mentioned_imports() -> None:
    names = {
        m.rstrip(".")
        for _, t in all_texts()
        for m in MODULE_RE.findall(t)
        if m.rsplit(".", 1)[1] not in FILE_SUFFIXES
    }  # `orchestrator.db` is a file
    assert names, "no module is mentioned anywhere?"
    assert sorted(n for n in names if not _resolves(n)) == []


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


@pytest.mark.parametrize("doc", ["README.md", "tests/README.md", *DOCS])
def test_markdown_links_reach_their_file_and_heading(doc: str) -> None:
    path = REPO / doc
    broken = []
    for target in LINK_RE.findall(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(target)
            continue
        if anchor and dest.suffix == ".md":
            slugs = {
                _slug(m)
                for m in re.findall(r"^#+ (.+)$", dest.read_text(encoding="utf-8"), re.MULTILINE)
            }
            if anchor not in slugs:
                broken.append(target)
    assert broken == [], broken
