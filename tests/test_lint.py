"""The code base stays ruff-clean (pyproject.toml holds the rules)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_check_passes() -> None:
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(REPO)],
                       capture_output=True, text=True, timeout=120, cwd=REPO)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
