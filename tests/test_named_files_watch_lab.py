"""The files a launch names during a campaign, on the lab through OpenSSH's sshd on
127.0.0.1 (the process manager), as a user meets them: a bad config that alone names a
chat template is bisected to its flag (the template is part of bad's variants, not a
change of the host), and a scenario file good and bad both name, edited between two runs,
stops the campaign as `changed`, naming the file. The logic over the scripted host:
tests/test_named_files_watch.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.bisect import Bisection
from orchestrator.campaign.envwatch import EnvironmentChanged
from orchestrator.campaign.planning import make_plan
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.events import Event, RunFinished
from orchestrator.lab.scenario import resolve
from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.store.store import Store
from tests.support.campaign_lab import bisect_in, lab_pair, load_host, sshd_hosts_file

pytestmark = pytest.mark.sshd


def _edit(path: Path, changes: dict) -> None:
    data = yaml.safe_load(path.read_text())
    for key, value in changes.items():
        old = data["service"].get(key)
        data["service"][key] = {**old, **value} if isinstance(old, dict) else value
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_a_template_only_bad_names_is_bisected_to_its_flag(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    template = tmp_path / "raw.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}\n")
    pair = lab_pair(tmp_path, "b300")
    _edit(pair.bad, {"flags": {"chat-template": str(template)}})
    host = load_host(sshd_hosts_file(sshd, tmp_path), "lab")

    got = bisect_in(tmp_path / "results", make_plan(pair.good, pair.bad), [host])
    assert got.outcome.status == "found", [(r.label, r.verdict, r.detail) for r in got.runs]
    assert not [r for r in got.runs if r.verdict is Verdict.INFRA]
    assert [sorted(c.flags) for c in got.outcome.culprits] == [
        ["--enable-nccl-nvls", "--ep-size 8"]
    ], got.outcome.to_dict()
    # the template was read where it was named, and only there
    for r in got.runs:
        read = dict((r.inputs.named or ()) if r.inputs else ())
        assert (str(template) in read) == (str(template) in r.argv), (r.label, read)


def test_a_scenario_both_name_edited_between_runs_stops_the_campaign(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(resolve("b300").read_text())
    pair = lab_pair(tmp_path, "b300")
    exec_ = f"python3 -m orchestrator.lab.server --scenario {scenario}"
    _edit(pair.good, {"exec": exec_})
    _edit(pair.bad, {"exec": exec_})
    host = load_host(sshd_hosts_file(sshd, tmp_path), "lab")
    finished: list[str] = []

    def operator(event: Event) -> None:
        # an operator's edit after the campaign's first run (a comment: still valid)
        if isinstance(event, RunFinished):
            finished.append(event.run_id)
            if len(finished) == 1:
                scenario.write_text(scenario.read_text() + "# edited\n")

    store = Store(tmp_path / "results")
    try:
        with pytest.raises(EnvironmentChanged, match=f"files the launch names changed: {scenario}"):
            Bisection(
                store, make_plan(pair.good, pair.bad), [host], listener=operator, command="test"
            ).run()
        [camp] = store.campaigns()
        runs = store.runs(camp.id)
    finally:
        store.close()
    assert camp.status == "changed"
    assert [r.verdict for r in runs][-1] is Verdict.INFRA and len(runs) == 2, [
        (r.label, r.verdict, r.detail) for r in runs
    ]
    assert runs[0].verdict is Verdict.PASS and str(scenario) in runs[-1].detail
