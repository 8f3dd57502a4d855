"""One incident through the real CLI on a lab host: `orchestrator bisect --json` over the
project's private sshd (the process manager starts the lab server), the answer judged
against the oracle's, and the host checked for anything left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.lab.sshd import SshdEndpoint, SshdServer, free_port, prepare, session_env
from orchestrator.store.store import Store
from tests.support.fuzz import judge, oracle
from tests.support.fuzz.incident import Incident

REPO = Path(__file__).resolve().parents[3]
#: a whole bisection of one incident; far above what one takes (tens of seconds)
TIMEOUT = 900.0
#: the runs an incident may take (`--max-runs`): a search that would go on is `incomplete`
MAX_RUNS = 80


@dataclass
class Result:
    """What one incident came to: `kind` right, unsure, unconcluded, wrong or skipped."""

    incident: Incident
    kind: str
    problems: list[str] = field(default_factory=list)
    status: str = ""
    exit_code: int | None = None
    confidence: float | None = None
    runs: int = 0
    seconds: float = 0.0
    expected: dict[str, Any] | None = None
    answer: dict[str, Any] | None = None

    @property
    def wrong(self) -> bool:
        return self.kind == "wrong"

    def summary(self) -> str:
        head = f"seed {self.incident.seed} [{','.join(self.incident.features)}]: {self.kind}"
        head += f" ({self.status}, exit {self.exit_code}, {self.runs} runs, {self.seconds:.0f} s)"
        return "\n  ".join([head, *self.problems])


def run(incident: Incident, sshd: SshdEndpoint, work: Path, timeout: float = TIMEOUT) -> Result:
    """Bisect `incident` through the CLI on the sshd lab host, in `work` (made fresh)."""
    shutil.rmtree(work, ignore_errors=True)
    port = free_port()
    unit = f"fuzz-{incident.seed}.service"
    scenario, good, bad = incident.write(work, port, unit)
    try:
        truth = oracle.Oracle(scenario, good, bad)
        exp = truth.expected()
    except oracle.OracleError as exc:
        return Result(incident, "skipped", [f"oracle: {exc}"])
    hosts = work / "hosts.yaml"
    hosts.write_text(sshd.hosts_yaml("lab", run_dir=str(work / "run")))
    results = work / "results"
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "orchestrator", "bisect", "--good", str(good), "--bad"]
            + [str(bad), "--host", "lab", "--hosts", str(hosts), "--results", str(results)]
            + ["--fresh", "--max-runs", str(MAX_RUNS), "--json"],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
            env={**os.environ, "COLUMNS": "200"},
        )
        out, err, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out, err, code = _text(exc.stdout), _text(exc.stderr), None
    seconds = time.monotonic() - started
    try:
        answer = json.loads(out)
    except json.JSONDecodeError:
        answer = None
    runs = _runs(results, answer)
    verdict = judge.judge(
        truth,
        exp,
        answer,
        exit_code=code,
        output=out + err,
        runs=runs,
        left=judge.left_on_host(port, work / "run" / unit),
    )
    return Result(
        incident,
        verdict.kind,
        verdict.problems,
        status=str((answer or {}).get("status", "")),
        exit_code=code,
        confidence=(answer or {}).get("confidence"),
        runs=len([r for r in runs if not r.cached_from]),
        seconds=seconds,
        expected=exp.to_dict(),
        answer=answer,
    )


def _runs(results: Path, answer: dict[str, Any] | None) -> list[Any]:
    camp = (answer or {}).get("campaign")
    if not camp or not results.is_dir():
        return []
    store = Store(results)
    try:
        return list(store.runs(str(camp)))
    except Exception:  # noqa: BLE001 - no campaign recorded: no runs to check
        return []
    finally:
        store.close()


def _text(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


@contextmanager
def private_sshd() -> Iterator[SshdEndpoint]:
    """The project's private sshd on 127.0.0.1 for a fuzz session outside pytest."""
    state = Path(tempfile.mkdtemp(prefix="orch-fuzz-sshd-"))
    try:
        endpoint = prepare(state / "ssh", port=free_port(), env=session_env(REPO))
        with SshdServer(endpoint):
            yield endpoint
    finally:
        shutil.rmtree(state, ignore_errors=True)
