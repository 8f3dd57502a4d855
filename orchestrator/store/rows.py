"""What the results store holds, as read back: a campaign's row, a run's row and the
environments a campaign's hosts were seen in, and each row decoded from SQLite.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config.experiment import Experiment
from orchestrator.diagnosis.server_logs import printed_args
from orchestrator.diagnosis.verdicts import Signature, Verdict
from orchestrator.execution.environment import HostEnvironment
from orchestrator.execution.inputs import LaunchInputs


@dataclass(frozen=True)
class CampaignRow:
    id: str
    kind: str
    key: str
    created: float
    updated: float
    status: str
    command: str
    spec: dict[str, Any]
    target: Signature | None
    answer: dict[str, Any] | None
    #: who runs (or last ran) it: owner (user@machine), pid, and `log` when detached
    controller: dict[str, Any] | None = None


@dataclass(frozen=True)
class RunRow:
    id: str
    campaign: str
    seq: int
    variant: tuple[int, ...]
    label: str
    purpose: str
    host: str
    host_class: str
    fingerprint: str
    config: dict[str, Any]
    argv: list[str]
    env: dict[str, str]
    rendered: str | None
    verdict: Verdict
    signature: Signature | None
    started: float
    duration: float
    phase_times: dict[str, float]
    last_phase: str | None
    probe_metric: float | None
    detail: str
    log_path: str | None
    cached_from: str | None
    #: the host's environment when the run started (see `Store.environment`)
    env_digest: str | None = None
    #: what reached the server besides its config (for a reused run: the inputs of the
    #: campaign that reused it, equal to its source's), and the cache key of both
    inputs: LaunchInputs | None = None
    launch_key: str | None = None
    #: `real` (the checkpoint) or `dummy` (`--load-format dummy`: random weights)
    weights: str = "real"
    #: the repair move this start carried (`planner.repair.Applied.to_dict()`), or None
    repair: dict[str, Any] | None = None
    #: what the server answered to the answers check and its judgement (None: not asked)
    answers: dict[str, Any] | None = None

    def experiment(self, *, resolve_secrets: bool = False) -> Experiment:
        """The recorded config; `resolve_secrets` puts redacted secrets back from the
        environment (needed to run it again)."""
        return Experiment.from_dict(
            self.config, source=f"run {self.id}", resolve_secrets=resolve_secrets
        )

    def log_tail(self) -> str:
        if not self.log_path:
            return ""
        try:
            return Path(self.log_path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def printed_args(self) -> dict[str, str]:
        """The arguments the server printed at start (`server_logs.printed_args`), read
        once per log file (a run's log is written once)."""
        return dict(_printed_args(self.log_path)) if self.log_path else {}


@functools.lru_cache(maxsize=4096)
def _printed_args(log_path: str) -> tuple[tuple[str, str], ...]:
    try:
        text = Path(log_path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ()
    return tuple(printed_args(text).items())


@dataclass
class EnvironmentSeen:
    """One environment of one host in a campaign, and the runs that saw it."""

    host: str
    digest: str
    env: HostEnvironment
    runs: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "digest": self.digest,
            "first_run": self.runs[0],
            "runs": len(self.runs),
            **self.env.to_dict(),
        }


def campaign_row(r: sqlite3.Row) -> CampaignRow:
    return CampaignRow(
        id=r["id"],
        kind=r["kind"],
        key=r["key"],
        created=r["created"],
        updated=r["updated"],
        status=r["status"],
        command=r["command"],
        spec=json.loads(r["spec"]),
        target=Signature.from_key(r["target"]) if r["target"] else None,
        answer=json.loads(r["answer"]) if r["answer"] else None,
        # (a read-only store of an older version has no such column)
        controller=json.loads(r["controller"])
        if "controller" in r.keys() and r["controller"]
        else None,
    )


def run_row(r: sqlite3.Row) -> RunRow:
    return RunRow(
        id=r["id"],
        campaign=r["campaign"],
        seq=r["seq"],
        variant=tuple(json.loads(r["variant"])),
        label=r["label"],
        purpose=r["purpose"],
        host=r["host"],
        host_class=r["host_class"],
        fingerprint=r["fingerprint"],
        config=json.loads(r["config"]),
        argv=json.loads(r["argv"]),
        env=json.loads(r["env"]),
        rendered=r["rendered"],
        verdict=Verdict(r["verdict"]),
        signature=Signature.from_key(r["signature"]) if r["signature"] else None,
        started=r["started"],
        duration=r["duration"],
        phase_times=json.loads(r["phase_times"]),
        last_phase=r["last_phase"],
        probe_metric=r["probe_metric"],
        detail=r["detail"],
        log_path=r["log_path"],
        cached_from=r["cached_from"],
        env_digest=r["env_digest"] if "env_digest" in r.keys() else None,
        inputs=LaunchInputs.from_dict(json.loads(r["inputs"]))
        if "inputs" in r.keys() and r["inputs"]
        else None,
        launch_key=r["launch_key"] if "launch_key" in r.keys() else None,
        weights=(r["weights"] if "weights" in r.keys() else None) or "real",
        repair=json.loads(r["repair"]) if "repair" in r.keys() and r["repair"] else None,
        answers=json.loads(r["answers"]) if "answers" in r.keys() and r["answers"] else None,
    )


__all__ = ["CampaignRow", "EnvironmentSeen", "RunRow", "campaign_row", "run_row"]
