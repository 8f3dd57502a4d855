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

#: a few minutes on two busy cores: each feature once (a crash, a hang, a crash under
#: load, wrong answers; one, interacting and independent causes; flaky; decoys; keys of a
#: JSON flag; environment variables)
SEEDS = (1, 3, 4, 6, 8, 11, 12, 16, 20, 23)


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
