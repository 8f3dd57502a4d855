"""The answers check end to end on the lab: whole bisections whose target is a wrong answer.

Through OpenSSH's sshd on 127.0.0.1 the Kimi K2.6 pair (DP attention with EP8 answers
garbled while it serves) and the crash-wrong pair (a crash and a wrong answer in one change)
are bisected through `orchestrator bisect --json`; each claim is checked against the runs
recorded in the store, and `show` of the culprit's run prints good's answer beside its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.campaign.bisect import Bisection, BisectOptions
from orchestrator.campaign.planning import make_plan
from orchestrator.lab.sdhosts import SystemdHost
from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.store.store import Store
from tests.support.campaign_lab import (
    LAB,
    LAB_UNIT,
    check_answer_evidence,
    cli,
    cli_json,
    lab_pair,
    load_host,
    sshd_hosts_file,
)

WRONG = "serving: wrong_output: "
PAIR = LAB / "k26-dp-ep"
K26_UNIT = "lab-k26.service"


def _bisect(sshd: SshdEndpoint, tmp: Path, pair: str) -> tuple[int, dict, Path]:
    exp = lab_pair(tmp, pair)
    hosts = sshd_hosts_file(sshd, tmp)
    results = tmp / "results"
    code, out = cli_json(
        "bisect",
        "--good",
        exp.good,
        "--bad",
        exp.bad,
        "--host",
        "lab",
        "--hosts",
        hosts,
        "--results",
        results,
    )
    return code, out, results


def test_k26_dp_ep_wrong_answer_bisected_over_sshd(sshd: SshdEndpoint, tmp_path: Path) -> None:
    code, answer, results = _bisect(sshd, tmp_path, "k26-dp-ep")
    assert code == 0 and answer["status"] == "found", answer
    target = answer["target"]
    assert target == WRONG + "garbled answers", target
    [culprit] = answer["culprits"]
    assert sorted(culprit["flags"]) == ["--enable-dp-attention", "--ep-size 8"]
    assert culprit["interacting"] is True and culprit["confirmed"] is True
    check_answer_evidence(results, answer, target)
    # the decoys (dp-size, scheduling, logging, limits) are in no culprit and no finding
    named = {answer["deltas"][i] for c in answer["culprits"] for i in c["indices"]}
    assert named == {"+ --enable-dp-attention", "+ --ep-size 8"}
    assert answer["findings"] == [], answer["findings"]
    # show of the culprit's run: good's answer and the variant's, side by side
    res = cli("show", culprit["reproduced_by"], "--results", results)
    assert res.returncode == 0, res.stderr
    store = Store(results)
    try:
        run = store.run(culprit["reproduced_by"])
        good = store.run(store.runs(answer["campaign"])[0].id)
    finally:
        store.close()
    assert good.variant == ()
    goods = {a["prompt_id"]: a for a in good.answers["sets"]["sequential"]}
    differ = [
        (goods[a["prompt_id"]]["text"], a["text"])
        for a in run.answers["sets"]["sequential"]
        if a["text"] != goods[a["prompt_id"]]["text"]
    ]
    assert differ, run.answers
    good_text, bad_text = (t.strip().replace("\n", "\\n")[:20] for t in differ[0])
    assert good_text in res.stdout and bad_text in res.stdout, res.stdout


def test_crash_wrong_two_findings_over_sshd(sshd: SshdEndpoint, tmp_path: Path) -> None:
    code, answer, results = _bisect(sshd, tmp_path, "crash-wrong")
    assert code == 0 and answer["status"] == "found", answer
    deltas = answer["deltas"]
    target = answer["target"]
    assert "misaligned address" in target, target
    [culprit] = answer["culprits"]
    assert culprit["flags"] == ["--moe-runner-backend flashinfer_cutlass"]
    check_answer_evidence(results, answer, target)
    [finding] = answer["findings"]
    assert finding["signature"] == WRONG + "garbled answers"
    assert [deltas[i] for i in finding["deltas"]] == ["+ --kv-cache-dtype fp8_e5m2"]


# ---- on the systemd host -------------------------------------------------------------------


@pytest.mark.systemd
def test_k26_dp_ep_wrong_answer_on_the_systemd_host(
    systemd_host: SystemdHost, tmp_path: Path
) -> None:
    box = systemd_host
    box.install_unit(K26_UNIT, LAB_UNIT)
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(box.hosts_yaml("sd", env={"PYTHONPATH": "/opt/orchestrator"}))
    plan = make_plan(str(PAIR / "good.yaml"), str(PAIR / "bad.yaml"), "auto")
    results = tmp_path / "results"
    store = Store(results)
    try:
        outcome = Bisection(
            store, plan, [load_host(hosts, "sd")], options=BisectOptions(), command="test"
        ).run()
    finally:
        store.close()
    answer = outcome.to_dict()
    assert answer["status"] == "found", answer
    assert answer["target"] == WRONG + "garbled answers"
    [culprit] = answer["culprits"]
    assert sorted(culprit["flags"]) == ["--enable-dp-attention", "--ep-size 8"]
    assert culprit["interacting"] is True
    check_answer_evidence(results, answer, answer["target"])
    assert answer["findings"] == []
