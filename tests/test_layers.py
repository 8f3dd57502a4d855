"""The package's layers hold: every import runs down the layer order, no module imports
itself back through others, and the benchmarks import only the package, the tests'
scripted hosts and each other.

The imports are read from the source (ast), inside functions and `TYPE_CHECKING` blocks
too: an import deferred to a function is still a dependency, it only hides a cycle from
the interpreter. The layer order is written here once; docs/design.md states the same
(checked below).
"""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "orchestrator"
BENCH = REPO / "bench"
DESIGN = REPO / "docs" / "design.md"

#: top first; a package (or a module directly under orchestrator/) may import only from the
#: layers below its own. "__init__" is the package itself (its version).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__main__",),
    ("cli",),
    ("reports",),
    ("campaign",),
    ("store", "lab"),
    ("execution",),
    ("planner", "events"),
    ("config",),
    ("diagnosis",),
    ("errors", "shield", "verdicts", "__init__"),
)


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    out = {}
    for f in sorted(root.rglob("*.py")):
        parts = [root.name, *f.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """The package's modules that `name` imports, with the line of each import."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package upward
                up = name.split(".")[: len(name.split(".")) - node.level + is_package]
                base = ".".join([*up, *([base] if base else [])])
            # `from pkg import mod` imports the module; `from mod import name` the module
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for t in targets:
            while t and t not in known and "." in t:  # `import a.b.c` of a name in a.b
                t = t.rsplit(".", 1)[0]
            if t in known and t != name and (t, node.lineno) not in found:
                found.append((t, node.lineno))
    return found


def unit(module: str) -> str:
    """The layer's unit a module belongs to: its package under orchestrator/, or the
    module itself when it sits directly there."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def graph(root: Path = ROOT) -> dict[str, list[tuple[str, int]]]:
    known = modules(root)
    return {name: imports(name, path, known) for name, path in known.items()}


def uphill(g: dict[str, list[tuple[str, int]]]) -> list[str]:
    """Each import that does not run down the layer order, as `file:line: a -> b`."""
    layer = {u: i for i, names in enumerate(LAYERS) for u in names}
    bad = []
    for src, targets in sorted(g.items()):
        for dst, line in targets:
            a, b = unit(src), unit(dst)
            if a == b:
                continue
            if a not in layer or b not in layer:
                missing = a if a not in layer else b
                bad.append(
                    f"{src}:{line}: {missing} has no layer (add it to LAYERS and docs/design.md)"
                )
            elif layer[b] <= layer[a]:
                bad.append(
                    f"{src}:{line}: {a} -> {b} runs "
                    + ("sideways" if layer[b] == layer[a] else "back up")
                )
    return bad


def cycles(g: dict[str, list[tuple[str, int]]]) -> list[str]:
    """The modules of an import cycle (empty when there is none)."""
    ts = graphlib.TopologicalSorter({m: {d for d, _ in ts} for m, ts in g.items()})
    try:
        ts.prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return []


def test_imports_run_down_the_layers() -> None:
    bad = uphill(graph())
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_no_import_cycles() -> None:
    cycle = cycles(graph())
    assert not cycle, "an import cycle: " + " -> ".join(cycle)


def top_imports(path: Path) -> list[tuple[str, int]]:
    """Every module a file imports (absolute names as written), with the line of each."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.module, node.lineno))
    return found


def bench_outside(bench: Path = BENCH) -> list[str]:
    """Each import of a benchmark that is not of the package, the tests' scripted hosts
    (`tests.support`), another benchmark or a library, as `file:line: name`."""
    bad = []
    for f in sorted(bench.glob("*.py")):
        for name, line in top_imports(f):
            top = name.split(".")[0]
            if top == "tests" and not (
                name == "tests.support" or name.startswith("tests.support.")
            ):
                bad.append(f"{f.name}:{line}: {name}")
            elif top == "bench":
                bad.append(f"{f.name}:{line}: {name}")
    return bad


def test_benchmarks_import_the_package_and_the_scripted_hosts_only() -> None:
    bad = bench_outside()
    assert not bad, "a benchmark imports what it may not:\n" + "\n".join(bad)


def test_nothing_imports_a_benchmark_or_a_test() -> None:
    """The package and the tests' support code never import a benchmark; the package never
    imports the tests."""
    bad = []
    support = REPO / "tests" / "support"
    for f in sorted([*ROOT.rglob("*.py"), *support.glob("*.py")]):
        for name, line in top_imports(f):
            top = name.split(".")[0]
            if top == "bench" or (top == "tests" and f.is_relative_to(ROOT)):
                bad.append(f"{f.relative_to(REPO)}:{line}: {name}")
    assert not bad, "imports of a benchmark or a test:\n" + "\n".join(bad)


def documented_layers(text: str) -> tuple[str, list[str]]:
    """docs/design.md's layer line and its layer table's first column (top first)."""
    line = next(s.strip() for s in text.splitlines() if s.strip().startswith("cli -> "))
    rows = re.findall(r"^\| ([a-z_, ]+) \| `orchestrator/", text, flags=re.M)
    return line, rows


def test_the_design_doc_states_the_layers_the_test_enforces() -> None:
    layers = [[u for u in names if u not in ("__main__", "__init__")] for names in LAYERS]
    layers = [names for names in layers if names]
    want_line = " -> ".join(
        names[0] if len(names) == 1 else f"({', '.join(names)})" for names in layers
    )
    line, rows = documented_layers(DESIGN.read_text(encoding="utf-8"))
    assert line == want_line
    assert rows == [", ".join(names) for names in layers]


def test_reader_sees_deferred_and_relative_imports(tmp_path: Path) -> None:
    """The reader itself: an import inside a function counts, `from pkg import mod` names
    the module, and a relative import resolves; a back-up arrow and a cycle are found."""
    pkg = tmp_path / "orchestrator"
    for d in ("cli", "config"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "config" / "a.py").write_text("def f():\n    from orchestrator.cli import b\n")
    (pkg / "cli" / "b.py").write_text("from ..config import a\n")
    g = graph(pkg)
    assert g["orchestrator.config.a"] == [("orchestrator.cli.b", 2)]
    assert g["orchestrator.cli.b"] == [("orchestrator.config.a", 1)]
    assert uphill(g) == ["orchestrator.config.a:2: config -> cli runs back up"]
    assert set(cycles(g)) == {"orchestrator.config.a", "orchestrator.cli.b"}


def test_bench_reader_finds_an_import_of_a_test(tmp_path: Path) -> None:
    """The benchmarks' reader itself: a test module or a bench package import is found; the
    package, the scripted hosts, a sibling benchmark and a library are not."""
    (tmp_path / "a.py").write_text(
        "import json\nimport b\nfrom orchestrator.planner import Planner\n"
        "from tests.support.scripted import host\nfrom tests.test_store import x\n"
        "def f():\n    from bench import b\n"
    )
    (tmp_path / "b.py").write_text("")
    assert bench_outside(tmp_path) == ["a.py:5: tests.test_store", "a.py:7: bench"]
