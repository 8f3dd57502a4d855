"""The code base stays ruff-clean and ruff-formatted (pyproject.toml holds the rules)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_check_passes() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_leaves_the_tree_as_it_is() -> None:
    """The whole tree is in `ruff format`'s layout: no file it would change, and no
    marker that skips it to keep a hand layout."""
    r = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    marked = [
        str(p.relative_to(REPO))
        for top in ("orchestrator", "tests", "bench")
        for p in (REPO / top).rglob("*.py")
        if "# fmt: " + "skip" in p.read_text(encoding="utf-8")
    ]
    assert marked == [], marked
