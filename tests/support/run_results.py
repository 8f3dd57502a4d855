"""Run results made without a host, for the store tests: the executor's own `RunResult`
with the fields a test does not care about filled in."""

from __future__ import annotations

import time
from typing import Any

from orchestrator.config.experiment import Experiment
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict
from orchestrator.execution.contract import RunResult


def run_result(
    experiment: Experiment,
    verdict: Verdict = Verdict.PASS,
    signature: Signature | None = None,
    **fields: Any,
) -> RunResult:
    defaults: dict[str, Any] = {
        "run_id": "t.1",
        "host": "h1",
        "host_class": "b300",
        "label": "good",
        "started_at": time.time(),
        "duration_s": 1.5,
        "phase_times": (("init", 0.1),),
        "last_phase": Phase.INIT,
    }
    return RunResult(
        experiment=experiment, verdict=verdict, signature=signature, **(defaults | fields)
    )
