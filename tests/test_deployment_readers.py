"""The readers of a deployment's runs: `show`, `runs`, both reports, `--issue`, `--json`, the
bisection's answer and the notification name every role's host and which role failed
first, and a delta of one role is named with its role everywhere.

The campaign is recorded through the real store the way a run over several roles is
(`tests/support/deployment_runs.py`): two node ranks on b300-01 and b300-02, node1's own
`--cuda-graph-max-bs 512` makes node1 crash while node0 times out in a collective.
"""

from __future__ import annotations

import argparse
import json
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from orchestrator.campaign.planning import make_plan
from orchestrator.campaign.records import Outcome
from orchestrator.cli import main, notifying
from orchestrator.cli.bisect import print_outcome
from orchestrator.cli.run import _print as print_run
from orchestrator.config import load_experiment
from orchestrator.reports import deployment_view
from orchestrator.reports.deployment_view import of_campaign
from orchestrator.store.store import Store
from tests.support.deployment_runs import CRASH, NODE0_LOG, NODE1_LOG, Recorded, record_campaign
from tests.support.run_results import run_result

#: FirstFailure.describe() of the failing runs
FIRST = f"node1 on b300-02: {CRASH}; node0 then timed out in a collective"


@pytest.fixture
def rec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Recorded:
    monkeypatch.setenv("COLUMNS", "300")  # lines unclipped
    return record_campaign(tmp_path / "pair")


def cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_show_names_every_role_its_host_unit_verdict_and_who_failed_first(
    rec: Recorded, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, "show", rec.runs["bad"], "--results", rec.results)
    assert code == 0, err
    assert "on node0 on b300-01, node1 on b300-02" in out.splitlines()[0]
    lines = [x.strip() for x in out.splitlines()]
    assert (
        "node0 [node rank 0] on b300-01 (sglang-n0.service): timeout: "
        "cuda_graph: nccl_timeout: Watchdog caught collective timeout"
    ) in lines
    assert (
        f"node1 [node rank 1] on b300-02 (sglang-n1.service): fail: {CRASH}  <- failed first"
    ) in lines
    assert f"failed first: {FIRST}" in lines
    # each role's own command line, node1's with its own flag
    [n1] = [x for x in lines if x.startswith("command:") and "--node-rank 1" in x]
    assert n1.endswith("--node-rank 1 --cuda-graph-max-bs 512")
    # the config against good names the role of a role's own flag
    assert "+node1: --cuda-graph-max-bs 512" in lines
    # the run's log tail is the failing role's; another role's only on request
    assert "log tail of node1, which failed first" in out
    assert NODE1_LOG.splitlines()[-1] in out and NODE0_LOG.strip() not in out

    code, out, err = cli(
        capsys, "show", rec.runs["bad"], "--role", "node0", "--results", rec.results
    )
    assert code == 0, err
    after = out.split("log tail of node0 [node rank 0] on b300-01 (sglang-n0.service):")[1]
    assert NODE0_LOG.strip() in after

    code, out, err = cli(capsys, "show", rec.runs["bad"], "--role", "all", "--results", rec.results)
    assert code == 0 and "log tail of node0 [node rank" in out and "log tail of node1 [node" in out


def test_show_refuses_a_role_the_run_does_not_have(
    rec: Recorded, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(
        capsys, "show", rec.runs["bad"], "--role", "decode", "--results", rec.results
    )
    assert code == 2 and out == ""
    assert "--role decode: run" in err and "has no such role" in err and "node0, node1" in err
    # a run of one unit has no roles to choose from
    exp = load_experiment(rec.results.parent / "good.yaml")
    single = replace(exp, roles=())
    store = Store(rec.results)
    try:
        cid = store.create_campaign(kind="run", key="k", command="test", spec={})
        run_id = store.add_run(cid, variant=(), purpose="run", result=run_result(single))
    finally:
        store.close()
    code, out, err = cli(capsys, "show", run_id, "--role", "node0", "--results", rec.results)
    assert code == 2 and f"--role: run {run_id} is no deployment's run" in err, err
    code, out, err = cli(capsys, "show", run_id, "--json", "--results", rec.results)
    assert code == 0 and json.loads(out)["deployment"] is None


def test_show_and_runs_json_carry_the_roles_and_the_first_failure(
    rec: Recorded, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(
        capsys, "show", rec.runs["bad"], "--json", "--role", "node0", "--results", rec.results
    )
    assert code == 0, err
    dep = json.loads(out)["deployment"]
    assert [(r["role"], r["host"], r["unit"], r["verdict"]) for r in dep["roles"]] == [
        ("node0", "b300-01", "sglang-n0.service", "timeout"),
        ("node1", "b300-02", "sglang-n1.service", "fail"),
    ]
    assert dep["roles"][0]["log_tail"] == NODE0_LOG and "log_tail" not in dep["roles"][1]
    assert dep["first_failure"] == {"role": "node1", "host": "b300-02", "describe": FIRST}

    code, out, err = cli(
        capsys, "runs", "--campaign", rec.campaign, "--json", "--results", rec.results
    )
    assert code == 0, err
    by_id = {r["id"]: r for r in json.loads(out)}
    good, bad = by_id[rec.runs["good"]], by_id[rec.runs["bad"]]
    assert [(r["role"], r["host"]) for r in good["deployment"]["roles"]] == [
        ("node0", "b300-01"),
        ("node1", "b300-02"),
    ]
    assert good["deployment"]["first_failure"] is None
    assert bad["deployment"]["first_failure"]["host"] == "b300-02"
    assert by_id[rec.runs["repro"]]["label"] == f"good + {rec.culprit}"


def test_both_reports_name_roles_hosts_the_first_failure_and_the_role_of_a_delta(
    rec: Recorded, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, "report", rec.campaign, "--results", rec.results)
    assert code == 0, err
    md = (rec.results / "reports" / f"{rec.campaign}.md").read_text()
    assert "- roles: node0 on b300-01, node1 on b300-02" in md
    assert (
        f"- the target failure happens first on node1 on b300-02 (run {rec.runs['bad']}): {FIRST}"
    ) in md
    assert "| node1 | node | 1 | b300-02 | sglang-n1.service |" in md
    assert f"**`{rec.culprit}`** (single flag)" in md
    assert f"| 2 | `{rec.describe}` |" in md
    [bad_row] = [x for x in md.splitlines() if x.startswith(f"| {rec.runs['bad']} |")]
    assert "| node1 on b300-02 |" in bad_row
    assert "failed first on node1 on b300-02 (its log below)" in md

    page = (rec.results / "reports" / f"{rec.campaign}.html").read_text()
    assert "<h2>Roles</h2>" in page
    assert "<td>node1</td><td>node</td><td>1</td><td>b300-02</td>" in page
    assert "<th>failed first</th>" in page and "<td>node1 on b300-02</td>" in page
    assert "the target failure happens first on node1 on b300-02" in page
    assert f"<code>{rec.culprit}</code>" in page


def test_the_issue_text_gives_each_role_its_command_and_the_first_failure(
    rec: Recorded, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, "report", rec.campaign, "--issue", "--results", rec.results)
    assert code == 0, err
    assert out.startswith(f"# [Bug] the server: cublas in cuda_graph with {rec.culprit}")
    assert "the failure happens first on node1 on b300-02." in out
    assert "node0 (node rank 0) on b300-01:" in out and "node1 (node rank 1) on b300-02:" in out
    n1 = out.split("node1 (node rank 1) on b300-02:")[1].split("```")[1]
    assert "--node-rank 1" in n1 and "--cuda-graph-max-bs 512" in n1
    n0 = out.split("node0 (node rank 0) on b300-01:")[1].split("```")[1]
    assert "--node-rank 0" in n0 and "--cuda-graph-max-bs" not in n0
    assert f"First failure across the roles: {FIRST}" in out
    assert f"| the failing launch without `{rec.culprit}` |" in out


def test_the_answer_and_the_notification_name_where_it_failed_first(
    rec: Recorded, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(rec.results)
    try:
        camp = store.campaign(rec.campaign)
        dep = of_campaign(store.runs(camp.id), store.host_record, camp.target)
        assert dep is not None
        root = rec.results.parent
        plan = make_plan(str(root / "good.yaml"), str(root / "bad.yaml"), "auto")
        capsys.readouterr()
        print_outcome(Outcome.from_dict(camp.answer or {}), plan, [], None, dep)
        out = capsys.readouterr().out
        lines = [x.strip() for x in out.splitlines()]
        assert "roles: node0 on b300-01, node1 on b300-02" in lines
        assert (
            f"the target failure happens first on node1 on b300-02 (run {rec.runs['bad']}): {FIRST}"
        ) in lines
        assert any(x.startswith(f"culprit (single flag): {rec.culprit}") for x in lines)

        with _Receiver() as got:
            notifying.concluded(store, got.url, "bisect", camp.id, "found", None)
        [message] = got.bodies
        assert message["first_failure"] == FIRST
        assert message["culprits"] == [rec.culprit]
        assert f"failed first: {FIRST}" in message["text"]
    finally:
        store.close()


class _Receiver:
    """A webhook on 127.0.0.1 that keeps the JSON bodies it was sent."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, object]] = []
        bodies = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                bodies.append(json.loads(self.rfile.read(n)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def __enter__(self) -> _Receiver:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_run_and_rerun_name_the_roles_and_the_first_failure(
    rec: Recorded, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(rec.results)
    try:
        row = store.run(rec.runs["bad"])
        capsys.readouterr()
        print_run(row, argparse.Namespace(json=True), store=store)
        data = json.loads(capsys.readouterr().out)
        assert data["deployment"]["first_failure"] == {
            "role": "node1",
            "host": "b300-02",
            "describe": FIRST,
        }
        print_run(row, argparse.Namespace(json=False), store=store)
        lines = [x.strip() for x in capsys.readouterr().out.splitlines()]
        assert f"detail: {FIRST}" in lines
        assert (
            f"node1 [node rank 1] on b300-02 (sglang-n1.service): fail: {CRASH}  <- failed first"
        ) in lines
    finally:
        store.close()


def test_a_role_signature_recorded_as_the_store_key_reads_as_printed() -> None:
    record = {
        "manager": "deployment",
        "roles": [
            {
                "role": "node1",
                "kind": "node",
                "rank": 1,
                "host": "b300-02",
                "unit": "u",
                "verdict": "fail",
                "signature": CRASH.key(),
                "log_tail": "",
            },
            {
                "role": "node0",
                "kind": "node",
                "rank": 0,
                "host": "b300-01",
                "unit": "u",
                "verdict": "other",
                "signature": "init: x: a | b | c",
                "log_tail": "",
            },
        ],
        "first_failure": {"role": "node1", "host": "b300-02", "describe": FIRST},
    }
    dep = deployment_view.of_record(record)
    assert dep is not None
    assert [r.signature for r in dep.roles] == [str(CRASH), "init: x: a | b | c"]
    assert deployment_view.of_record({"manager": "systemd"}) is None
