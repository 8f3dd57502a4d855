"""Whole bisections on the lab, end to end, on the real test hosts.

Through OpenSSH's sshd on 127.0.0.1 (the process manager) the three lab incidents are
bisected: b300 through `orchestrator bisect --json` in a subprocess, rtx6000 and glm5
through `Bisection` directly. On the real systemd host (a booted nspawn container) the
b300 bisection runs through drop-ins, `systemctl` and the journal. Each answer is checked
against `experiments/lab/README.md`, and each claim of the answer against the runs
recorded in the store.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from orchestrator.campaign.bisect import Bisection, BisectOptions, Outcome
from orchestrator.campaign.planning import Plan, make_plan
from orchestrator.config.hosts import load_inventory
from orchestrator.diagnosis.verdicts import Phase, Verdict
from orchestrator.events import Event, RunStarted
from orchestrator.lab.sdhosts import SystemdHost
from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.store.store import Store
from tests.support.campaign_lab import (
    LAB,
    LAB_UNIT,
    UNIT_DIR,
    check_answer_evidence,
    check_b300_answer,
    lab_pair,
    lab_servers,
    load_host,
    recorded_b300,
    sshd_hosts_file,
)

B300_UNIT = "lab-b300.service"


def bisect_directly(
    plan: Plan,
    results: Path,
    hosts_file: Path,
    host: str,
) -> tuple[Outcome, list[Event]]:
    """A `Bisection` run in-process with a listener that keeps the events."""
    events: list[Event] = []
    store = Store(results)
    try:
        outcome = Bisection(
            store,
            plan,
            [load_host(hosts_file, host)],
            options=BisectOptions(),
            listener=events.append,
            command="test",
        ).run()
    finally:
        store.close()
    return outcome, events


# ---- through the sshd host (process manager) ----------------------------------------------


def test_b300_through_the_cli_over_sshd(
    sshd: SshdEndpoint, tmp_path_factory: pytest.TempPathFactory
) -> None:
    rec = recorded_b300(sshd, tmp_path_factory.getbasetemp())
    assert rec.exit_code == 0, rec.outcome
    check_b300_answer(rec.outcome, rec.root / "results")
    reports = [Path(p) for p in rec.outcome["reports"]]
    assert sorted(p.suffix for p in reports) == [".html", ".md"]
    assert all(p.is_file() for p in reports)
    # The host is left as found: no server, no pid file, no launch script.
    assert lab_servers(rec.pair.port) == []
    svc = rec.root / "run" / B300_UNIT
    assert not (svc / "pid").exists() and not (svc / "launch.sh").exists()


def test_rtx6000_triple_with_the_memory_finding_over_sshd(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    pair = lab_pair(tmp_path, "rtx6000")
    hosts = sshd_hosts_file(sshd, tmp_path)
    plan = make_plan(str(pair.good), str(pair.bad), "auto")
    outcome, events = bisect_directly(plan, tmp_path / "results", hosts, "lab")
    answer = outcome.to_dict()
    assert outcome.status == "found", answer
    assert answer["target"].startswith("cuda_graph: AssertionError")
    [culprit] = answer["culprits"]
    assert sorted(culprit["flags"]) == [
        "--ep-size 8",
        "--mem-fraction-static 0.92",
        "--moe-a2a-backend flashinfer",
    ]
    assert culprit["interacting"] is True
    cleared = {d for i, d in enumerate(answer["deltas"]) if i not in culprit["indices"]}
    assert cleared == {"~ --cuda-graph-max-bs 128 -> 512", "~ --max-running-requests 128 -> 256"}
    check_answer_evidence(tmp_path / "results", answer, answer["target"])
    [finding] = answer["findings"]
    assert finding["signature"].startswith("kv_cache: not_enough_memory: Not enough memory")
    # smallest variant that showed it: EP + flashinfer without the memory bump
    assert sorted(answer["deltas"][i] for i in finding["deltas"]) == [
        "+ --ep-size 8",
        "+ --moe-a2a-backend flashinfer",
    ]
    # the memory bump is a delta under test: no repair turns it, and the answer says why
    assert answer["repairs"] and all(
        n["state"] == "unrepaired" and n["why"] == "--mem-fraction-static is a delta under test"
        for n in answer["repairs"]
    )
    # cuda-graph-max-bs 512 costs throughput but stays above the probe's bar: the probe
    # ran on every healthy variant and its metric is recorded
    store = Store(tmp_path / "results")
    try:
        runs = store.runs(outcome.campaign_id)
        healthy = [r for r in runs if r.verdict is Verdict.PASS]
        assert healthy and all(r.probe_metric and r.probe_metric >= 2000 for r in healthy)
    finally:
        store.close()
    assert sum(isinstance(e, RunStarted) for e in events) == outcome.runs_executed == len(runs)
    assert lab_servers(pair.port) == []


def test_glm5_crash_under_load_needs_the_probe_over_sshd(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    pair = lab_pair(tmp_path, "glm5")
    hosts = sshd_hosts_file(sshd, tmp_path)
    plan = make_plan(str(pair.good), str(pair.bad), "auto")
    outcome, _ = bisect_directly(plan, tmp_path / "results", hosts, "lab")
    answer = outcome.to_dict()
    assert outcome.status == "found", answer
    [culprit] = answer["culprits"]
    assert culprit["flags"] == ["--max-running-requests 512"]
    assert culprit["interacting"] is False
    assert answer["findings"] == []
    check_answer_evidence(tmp_path / "results", answer, answer["target"])
    store = Store(tmp_path / "results")
    try:
        bad = next(r for r in store.runs(outcome.campaign_id) if r.label == "bad")
    finally:
        store.close()
    assert bad.signature is not None
    assert (bad.signature.phase, bad.signature.error_class) == (Phase.SERVING, "illegal_address")
    assert str(bad.signature) == answer["target"]
    # Healthy at startup: /health said ready before the load crashed it. Without the
    # probe's requests this server would have passed.
    assert "serving" in bad.phase_times
    log = bad.log_tail()
    assert "The server is fired up and ready to roll!" in log
    assert "an illegal memory access was encountered" in log
    assert lab_servers(pair.port) == []


def test_compile_pair_names_two_keys_of_one_json_option_over_sshd(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    """The culprit is two keys of --compilation-config together: the answer names them by
    key path, in --json, the issue report and the notification's culprits; a variant whose
    rebuilt value the server's parser refuses is `invalid`, never a finding."""
    import json as jsonlib

    import yaml

    from orchestrator.reports.notify import culprits_of
    from tests.support.campaign_lab import cli, cli_json

    pair = lab_pair(tmp_path, "compile")
    hosts = sshd_hosts_file(sshd, tmp_path)
    results = tmp_path / "results"
    code, answer = cli_json(
        "bisect",
        "--good",
        pair.good,
        "--bad",
        pair.bad,
        "--host",
        "lab",
        "--hosts",
        hosts,
        "--results",
        results,
        "--no-report",
    )
    assert code == 0, answer
    assert answer["target"].startswith("cuda_graph: "), answer["target"]
    [culprit] = answer["culprits"]
    assert sorted(culprit["flags"]) == [
        "--compilation-config.cudagraph_mode FULL",
        "--compilation-config.pass_config.enable_fusion true",
    ]
    assert culprit["interacting"] is True
    cleared = {d for i, d in enumerate(answer["deltas"]) if i not in culprit["indices"]}
    assert "~ --max-running-requests 128 -> 256" in cleared
    assert "+ --compilation-config.max_capture_size 32" in cleared
    assert answer["findings"] == []
    check_answer_evidence(results, answer, answer["target"])
    store = Store(results)
    try:
        camp = store.campaign(answer["campaign"])
        assert culprits_of(camp.answer) == (
            "--compilation-config.cudagraph_mode FULL + "
            "--compilation-config.pass_config.enable_fusion true",
        )
    finally:
        store.close()
    issue = cli("report", answer["campaign"], "--issue", "--results", results)
    assert "`--compilation-config.cudagraph_mode FULL`" in issue.stdout, issue.stdout
    # good + max_capture_size alone: the value rebuilt from good lacks bad's longer sizes,
    # and the server's parser refuses it: invalid, with the parser's words
    plan = make_plan(str(pair.good), str(pair.bad), "auto")
    [i] = [k for k, d in enumerate(plan.deltas) if d.name.endswith(".max_capture_size")]
    variant = plan.variant(frozenset({i})).to_dict()
    variant["health"] = {**variant["health"], "settle": "0.1s"}
    path = tmp_path / "refused.yaml"
    path.write_text(yaml.safe_dump(variant, sort_keys=False))
    assert (
        jsonlib.loads(variant["service"]["flags"]["compilation-config"])["max_capture_size"] == 32
    )
    code, run = cli_json("run", path, "--host", "lab", "--hosts", hosts, "--results", results)
    assert run["verdict"] == "invalid", run
    assert "max_capture_size must be the largest" in jsonlib.dumps(run)
    assert lab_servers(pair.port) == []


# ---- on the systemd host -------------------------------------------------------------------


def _sh(box: SystemdHost, command: str) -> str:
    return box.ssh_run(command, check=True, timeout=120).stdout


def test_b300_on_the_systemd_host(systemd_host: SystemdHost, tmp_path: Path) -> None:
    box = systemd_host
    box.install_unit(B300_UNIT, LAB_UNIT)
    unit_sha = hashlib.sha256(_sh(box, f"cat {UNIT_DIR}/{B300_UNIT}").encode()).hexdigest()
    hosts = tmp_path / "hosts.yaml"
    # The host's env reaches every command, so `EXEC --help` (preflight) finds the lab.
    hosts.write_text(box.hosts_yaml("sd", env={"PYTHONPATH": "/opt/orchestrator"}))
    assert load_inventory(hosts).host("sd").service_manager == "systemd"
    plan = make_plan(str(LAB / "b300" / "good.yaml"), str(LAB / "b300" / "bad.yaml"), "auto")
    outcome, events = bisect_directly(plan, tmp_path / "results", hosts, "sd")
    answer = outcome.to_dict()
    check_b300_answer(answer, tmp_path / "results")
    store = Store(tmp_path / "results")
    try:
        runs = store.runs(outcome.campaign_id)
    finally:
        store.close()
    # Each run went through a drop-in: the stored rendering is the drop-in we wrote, and
    # the log is that invocation's journal.
    for r in runs:
        assert r.rendered and "ExecStart=" in r.rendered and "Restart=no" in r.rendered, r
        assert "orchestrator.lab.server" in r.rendered
    bad = next(r for r in runs if r.label == "bad")
    assert "CUBLAS_STATUS_EXECUTION_FAILED" in bad.log_tail()
    assert "The server is fired up" not in bad.log_tail()  # only its own invocation's lines
    # Left as found: the unit byte-identical, no drop-in, stopped.
    assert hashlib.sha256(_sh(box, f"cat {UNIT_DIR}/{B300_UNIT}").encode()).hexdigest() == unit_sha
    assert box.ssh_run(f"test -e {UNIT_DIR}/{B300_UNIT}.d").returncode != 0
    show = _sh(box, f"systemctl show {B300_UNIT} -p ActiveState -p DropInPaths -p ExecStart")
    props = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
    assert props["ActiveState"] == "inactive"
    assert "99-orchestrator" not in props["DropInPaths"]
    assert "/bin/sleep" in props["ExecStart"]
