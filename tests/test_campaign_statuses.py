"""What `runs --campaigns` says of a campaign, and how the live view numbers runs.

A campaign refused by another's lock is `refused`; one stopped by an error of its configs
is `error`; a `running` one whose controller's process is gone from this machine shows
`dead`; a resumed campaign's recorded runs keep their stored numbers in the live view.
Fast tier: scripted hosts (the real refusal is tests/test_faults_signals.py).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.campaign.bisect import Bisection
from orchestrator.campaign.planning import make_plan
from orchestrator.cli import main
from orchestrator.cli.live import LiveView
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.errors import ConfigError, LockError
from orchestrator.events import RunRecorded
from orchestrator.execution.hostlock import me
from orchestrator.store.store import Store
from tests.support.scripted import Faults, Oracle, ScriptedExecutor, host, write_pair


class Refused(ScriptedExecutor):
    def open(self) -> Refused:
        err = LockError("scripted: u.service is locked by x@y (campaign other1, pid 1)")
        err.holder_campaign = "other1"
        raise err


class BadConfig(ScriptedExecutor):
    def run(self, *a: object, **kw: object) -> object:
        raise ConfigError("scripted.yaml: service.flags.port: not a port")


@pytest.mark.parametrize(
    ("executor", "error", "status"),
    [(Refused, LockError, "refused"), (BadConfig, ConfigError, "error")],
)
def test_a_refused_or_broken_campaign_says_so(
    tmp_path: Path, executor: type, error: type, status: str
) -> None:
    good, bad = write_pair(tmp_path / "exp", 3)
    store = Store(tmp_path / "results")
    b = Bisection(
        store,
        make_plan(good, bad),
        [host()],
        command="t",
        executor_factory=lambda h, *_: executor(h, Oracle([]), Faults()),
    )
    with pytest.raises(error):
        b.run()
    assert store.campaign(b.cid).status == status
    store.close()


def test_a_running_campaign_whose_controller_is_gone_shows_dead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    store = Store(tmp_path / "results")
    ids = {}
    for name, ctl in (
        ("dead", {"owner": me(), "pid": gone.pid}),
        ("live", {"owner": me(), "pid": 1}),  # init: alive
        ("elsewhere", {"owner": "ops@elsewhere", "pid": gone.pid}),
    ):
        ids[name] = store.create_campaign(kind="bisect", key=name, command="t", spec={})
        store.update_campaign(ids[name], controller=ctl)
    store.close()
    assert main(["runs", "--campaigns", "--json", "--results", str(tmp_path / "results")]) == 0
    got = {c["id"]: c["status"] for c in json.loads(capsys.readouterr().out)}
    # another machine's controller cannot be seen from here: it stays `running`
    assert got == {ids["dead"]: "dead", ids["live"]: "running", ids["elsewhere"]: "running"}


def test_the_live_view_numbers_runs_as_stored() -> None:
    out = io.StringIO()
    view = LiveView(Console(file=out, width=200))
    for seq in (1, 2, 3):  # a resumed campaign shows its recorded runs again
        view(
            RunRecorded(
                host="h",
                run_id=f"abc123.{seq}",
                label=f"v{seq}",
                verdict=Verdict.PASS,
                source="resume",
                done=5,
            )
        )
    numbers = [line.split(".")[0].strip() for line in out.getvalue().splitlines()]
    assert numbers == ["1", "2", "3"]


def test_follow_of_a_campaign_that_ended_shows_its_runs_and_exits_with_its_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.scripted import TARGET_ERROR, Rule

    good, bad = write_pair(tmp_path / "exp", 3)
    store = Store(tmp_path / "results")
    oracle = Oracle([Rule(frozenset({1}), "cuda_graph", TARGET_ERROR)])
    b = Bisection(
        store,
        make_plan(good, bad),
        [host()],
        command="t",
        executor_factory=lambda h, *_: ScriptedExecutor(h, oracle, Faults()),
    )
    outcome = b.run()
    refused = store.create_campaign(kind="bisect", key="r", command="t", spec={})
    store.update_campaign(refused, status="refused")
    n = len(store.runs(b.cid))
    store.close()
    results = str(tmp_path / "results")
    assert outcome.found
    assert main(["runs", "--follow", b.cid, "--results", results]) == 0
    out = capsys.readouterr().out
    assert f"campaign {b.cid} ended: done (exit 0)" in out
    assert all(f"{b.cid}.{seq}" in out for seq in range(1, n + 1))
    assert main(["runs", "--follow", refused, "--results", results]) == 3
    assert f"campaign {refused} ended: refused (exit 3)" in capsys.readouterr().out
