"""The truth fuzzer's CI seed set and its kept regression cases, through the real CLI on
the sshd lab host (docs/fuzz.md).

Each generated incident is bisected by `orchestrator bisect --json` with the process
manager over OpenSSH; its answer must not be wrong against the oracle's (a culprit set, a
target, a finding, a run's verdict, a traceback, a host left changed). `unsure` and an
answer not concluded are allowed here and counted by `bench/fuzz.py`. Each case kept under
tests/data/fuzz/ is replayed the same way; one that is still wrong today is xfail(strict)
with its reason, so the day it is fixed the suite says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.lab.sshd import SshdEndpoint
from tests.support.fuzz import cases, generate, runner

#: one of each: a crash (1, 11, 16, 45), a crash under load (4, 46), a hang (25), wrong
#: answers (47); one delta (1, 4, 16), interacting (11, 25, 45), independent (46, 47);
#: flaky (27); decoys (1, 11, 16, 45, 47); keys of a JSON flag (1, 11, 25, 47); an
#: environment variable as the cause (27). About 45-110 s each on two busy cores.
SEEDS = (1, 4, 11, 16, 25, 27, 45, 46, 47)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_generated_incident_gets_no_wrong_answer(
    seed: int, sshd: SshdEndpoint, tmp_path: Path
) -> None:
    res = runner.run(generate.incident(seed), sshd, tmp_path / "incident")
    assert res.kind in ("right", "unsure", "unconcluded"), res.summary()


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            c,
            id=c.name,
            marks=[pytest.mark.xfail(strict=True, reason=c.xfail)] if c.xfail else [],
        )
        for c in cases.load_all()
    ],
)
def test_a_kept_case_gets_no_wrong_answer(
    case: cases.Case, sshd: SshdEndpoint, tmp_path: Path
) -> None:
    res = runner.run(case.incident, sshd, tmp_path / "incident")
    assert res.kind in ("right", "unsure", "unconcluded"), res.summary()
