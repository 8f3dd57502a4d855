"""Regression cases: shrunk incidents that once gave a wrong answer, kept as YAML under
tests/data/fuzz/ and replayed by the suite (`tests/test_fuzz_sshd.py`).

A case that still fails today carries `xfail:` with the reason; its test is then marked
xfail(strict=True), so the suite stays green and says so the day it is fixed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.fuzz.incident import Incident
from tests.support.fuzz.runner import Result

CASES = Path(__file__).resolve().parents[2] / "data" / "fuzz"


@dataclass(frozen=True)
class Case:
    name: str
    incident: Incident
    found: list[str]
    xfail: str | None


def save(result: Result, where: Path = CASES, xfail: str | None = None) -> Path:
    """Keep a shrunk wrong answer as `seed-N.yaml`: the incident, what was expected and
    what the CLI gave."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"seed-{result.incident.seed}.yaml"
    data: dict[str, Any] = {
        "seed": result.incident.seed,
        "features": list(result.incident.features),
        "found": result.problems,
        "expected": result.expected,
        "xfail": xfail or "the wrong answer above, not yet fixed",
        "incident": result.incident.to_dict(),
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=100))
    return path


def load_all(where: Path = CASES) -> list[Case]:
    out = []
    for path in sorted(where.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        out.append(
            Case(
                path.stem,
                Incident.from_dict(data["incident"]),
                list(data.get("found") or []),
                data.get("xfail"),
            )
        )
    return out
