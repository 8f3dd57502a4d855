"""No module of the package outgrows what a maintainer reads in one sitting: every file
under orchestrator/ is at most `MAX_LINES` lines. A module that grows past it is split
along what it owns (see docs/design.md), not trimmed of its comments."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "orchestrator"
MAX_LINES = 800


def too_long(root: Path, limit: int = MAX_LINES) -> dict[str, int]:
    """Each file under `root` longer than `limit` lines, by its path, with its length."""
    out = {}
    for f in sorted(root.rglob("*")):
        if not f.is_file() or "__pycache__" in f.parts:
            continue
        n = len(f.read_bytes().splitlines())
        if n > limit:
            out[f.relative_to(root.parent).as_posix()] = n
    return out


def test_no_file_of_the_package_exceeds_the_limit() -> None:
    assert too_long(ROOT) == {}, f"split these along what they own: {too_long(ROOT)}"


def test_the_count_sees_a_file_one_line_over(tmp_path: Path) -> None:
    pkg = tmp_path / "orchestrator" / "sub"
    pkg.mkdir(parents=True)
    (pkg / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (pkg / "fits.py").write_text("x = 1\n" * MAX_LINES)
    (pkg / "data.jsonl").write_text("{}\n" * (MAX_LINES + 5))
    assert too_long(tmp_path / "orchestrator") == {
        "orchestrator/sub/data.jsonl": MAX_LINES + 5,
        "orchestrator/sub/long.py": MAX_LINES + 1,
    }
