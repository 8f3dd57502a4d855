"""A host lost mid-campaign (fast tier): each run it fails says why as it happens, the
campaign stops naming the host that was lost, and the hint is the command that checks it.

The host is cut off after good's run. On a single host (the scripted stand-in executor,
its link dropped past the reconnect budget) three `infra` runs in a row stop the
bisection; in a deployment (the real `DeploymentExecutor` and member executors over the
scripted transport, the link of the second role's host down) the run is named by the
role's host that was lost, not by the host the campaign runs it on. The same through the
real CLI over the real sshd, a role's host lost behind a killed forwarder:
tests/test_deployment_campaign_sshd.py.
"""

from __future__ import annotations

import argparse
import io
import os
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from orchestrator.campaign.bisect import Bisection, BisectOptions
from orchestrator.campaign.core import CampaignCore, HostTrouble
from orchestrator.campaign.planning import make_plan
from orchestrator.cli import common
from orchestrator.cli.live import LiveView
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Inventory
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.events import Event, RunRecorded
from orchestrator.execution.deployment import DeploymentExecutor, sites
from orchestrator.execution.executor import Executor
from orchestrator.store.store import Store
from tests.support.scripted import Faults, Oracle, ScriptedExecutor, host, write_pair
from tests.support.scripted_transport import FakeClock, ScriptedTransport
from tests.support.scripted_transport import host as scripted_host


def test_a_lost_host_says_each_runs_reason_and_stops_naming_itself(tmp_path: Path) -> None:
    good, bad = write_pair(tmp_path / "exp", 3)
    faults = Faults()
    out = io.StringIO()
    view = LiveView(Console(file=out, width=200, force_terminal=False))
    recorded: list[RunRecorded] = []

    def listener(e: Event) -> None:
        view(e)
        if isinstance(e, RunRecorded):
            recorded.append(e)
            if e.label == "good":  # cut off after good's run: every later run is lost
                faults.ssh_drop = 1.0

    lab2 = host("lab2")
    store = Store(tmp_path / "results")
    try:
        bisection = Bisection(
            store,
            make_plan(good, bad),
            [lab2],
            command="test",
            options=BisectOptions(),
            listener=listener,
            executor_factory=lambda h, s, c, li: ScriptedExecutor(h, Oracle([]), faults, li),
        )
        args = argparse.Namespace(hosts=str(tmp_path / "hosts.yaml"), results="results")
        with pytest.raises(HostTrouble) as caught:
            common.run_campaign(bisection.run, lambda e: None, "bisection", args)
    finally:
        store.close()
    infra = [e for e in recorded if e.verdict is Verdict.INFRA]
    assert [e.label for e in recorded[:1]] == ["good"] and len(infra) == 3, recorded
    text = out.getvalue()
    # each infra run said its reason as it was recorded, right under its line
    for e in infra:
        assert e.detail and "lab2: connection lost" in e.detail, e
    assert text.count("host trouble on lab2: lab2: connection lost") == 3, text
    err = caught.value
    assert err.host == "lab2" and not err.deployment
    assert "3 runs in a row failed on host trouble; last on lab2: " in str(err)
    hosts = os.path.abspath(tmp_path / "hosts.yaml")
    assert err.hint is not None
    assert err.hint.startswith(f"check lab2 with: orchestrator hosts check lab2 --hosts {hosts}; ")
    assert "then resume with: orchestrator bisect --resume " in err.hint


def deployment(tmp_path: Path) -> Experiment:
    """Two node ranks: rank 0 (the health role) on the campaign's host, rank 1 on lab2."""
    doc = {
        "name": "lost-pair",
        "service": {
            "exec": "python3 -m sglang.launch_server",
            "flags": {
                "model-path": "/models/m",
                "tp-size": 16,
                "nnodes": 2,
                "dist-init-addr": "192.0.2.1:30100",
            },
        },
        "roles": {
            "node0": {"kind": "node", "rank": 0, "flags": {"node-rank": 0, "port": 30000}},
            "node1": {
                "kind": "node",
                "rank": 1,
                "host": "lab2",
                "flags": {"node-rank": 1, "port": 30001},
            },
        },
        "health": {"path": "/health", "timeout": 60},
    }
    path = tmp_path / "pair.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return Experiment.from_dict(doc, source=str(path))


def test_a_deployment_names_the_role_host_it_lost(tmp_path: Path) -> None:
    exp = deployment(tmp_path)
    clock = FakeClock()
    lab, lab2 = scripted_host("lab"), scripted_host("lab2")
    # lab2's link is down from the run's first command on (after the campaign opened it)
    links = {"lab": [], "lab2": [(clock.now + 1.0, clock.now + 10_000.0)]}

    def member(h: object, service: str) -> Executor:
        t = ScriptedTransport(h, clock, [], link_down=links[h.name])  # type: ignore[arg-type]
        return Executor(
            h,  # type: ignore[arg-type]
            service=service,
            campaign="c-lost",
            transport=t,
            sleep=clock.sleep,
            clock=clock.monotonic,
            wall_clock=clock.time,
        )

    ex = DeploymentExecutor(
        lab,
        sites(exp, lab, Inventory(hosts={"lab": lab, "lab2": lab2})),
        health_role="node0",
        service="sglang",
        make_member=member,
        campaign="c-lost",
        sleep=clock.sleep,
        clock=clock.monotonic,
        wall_clock=clock.time,
    ).open()
    clock.now += 2.0
    result = ex.run(exp, run_id="r1", label="good + 1")
    assert result.verdict is Verdict.INFRA, result.detail
    assert result.host == "lab2", (result.host, result.detail)
    assert "connection to lab2" in result.detail


def test_the_hint_checks_a_deployment_with_its_config(tmp_path: Path) -> None:
    exp = deployment(tmp_path)
    store = Store(tmp_path / "results")
    core = CampaignCore(store, kind="bisect", key="k-lost", spec=dict, secrets={})

    def lost() -> None:
        with core.guard(lambda: None):
            for _ in range(3):
                core.note_infra(
                    Verdict.INFRA, "lab2", "connection to lab2 lost", healthy=1, deployment=True
                )

    args = argparse.Namespace(
        hosts="hosts.yaml", results="results", deployment_exps=(exp, exp), json=False
    )
    try:
        with pytest.raises(HostTrouble) as caught:
            common.run_campaign(lost, lambda e: None, "bisection", args)
    finally:
        store.close()
    assert str(caught.value) == (
        "3 runs in a row failed on host trouble; last on lab2: connection to lab2 lost"
    )
    assert caught.value.hint is not None
    assert caught.value.hint.startswith(
        f"check lab2 with: orchestrator hosts check --experiment {tmp_path / 'pair.yaml'} "
        f"--hosts {os.path.abspath('hosts.yaml')}; then resume with: "
    )
