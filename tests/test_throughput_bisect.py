"""Throughput bisection: which delta costs throughput, not which one crashes.

The rtx6000 perf pair (`experiments/lab/rtx6000/perf_good.yaml` -> `perf_bad.yaml`):
nothing crashes, but `--cuda-graph-max-bs 512` costs about 10% of the output throughput,
and the probe's bar is relative to the good config (`pass_if: ">= 0.95 * good"`). A
bisection through `orchestrator bisect --json` must name that flag alone, with every
verdict backed by recorded metrics: through the real sshd with repeats of the deciding
variants (noise), and on a pool of two systemd hosts, where the good endpoint's metric
must be known before the bad endpoint can be judged against it.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.lab.sdhosts import SystemdHost
from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.store.store import RunRow, Store
from tests.support.campaign_lab import (
    LAB,
    UNIT_DIR,
    check_answer_evidence,
    cli_json,
    lab_pair,
    lab_servers,
    sshd_hosts_file,
)

UNIT = "lab-rtx6000.service"
TARGET = "probe: probe_threshold: metric missed >= 0.95 * good"
CULPRIT = "~ --cuda-graph-max-bs 128 -> 512"
HARMLESS = "~ --max-running-requests 128 -> 256"


def check_throughput_answer(out: dict, results: Path) -> list[RunRow]:
    """--cuda-graph-max-bs alone; each verdict agrees with its recorded metric."""
    assert out["status"] == "found", out
    assert out["target"] == TARGET
    assert sorted(out["deltas"]) == sorted([CULPRIT, HARMLESS])
    [culprit] = out["culprits"]
    assert culprit["flags"] == ["--cuda-graph-max-bs 512"] and not culprit["interacting"]
    assert culprit["confirmed"] is True
    assert out["findings"] == [] and out["invalid"] == []
    check_answer_evidence(results, out, TARGET)
    store = Store(results)
    try:
        runs = store.runs(out["campaign"])
    finally:
        store.close()
    [good] = [r for r in runs if r.variant == () and r.purpose == "endpoint"]
    assert good.verdict is Verdict.PASS and good.probe_metric
    bar = 0.95 * good.probe_metric
    cgmb = out["deltas"].index(CULPRIT)
    for r in runs:
        assert r.probe_metric is not None, r  # every variant became healthy and was measured
        if r.variant == ():
            continue  # the good config's own repeats are judged against the first good run
        slow = cgmb in r.variant
        assert (r.probe_metric < bar) == slow, (r.label, r.probe_metric, bar)
        assert r.verdict is (Verdict.FAIL if slow else Verdict.PASS), r
        if slow:
            assert str(r.signature) == TARGET
    return runs


def test_throughput_bisection_over_sshd(sshd: SshdEndpoint, tmp_path: Path) -> None:
    pair = lab_pair(tmp_path, "rtx6000-perf")
    hosts = sshd_hosts_file(sshd, tmp_path)
    results = tmp_path / "results"
    code, out = cli_json(
        "bisect",
        "--good",
        pair.good,
        "--bad",
        pair.bad,
        "--host",
        "lab",
        "--repeat",
        "2",
        "--hosts",
        hosts,
        "--results",
        results,
        timeout=600,
    )
    assert code == 0, out
    runs = check_throughput_answer(out, results)
    # noise: the deciding variants ran again and agreed
    assert out["flaky"] == []
    assert any(r.purpose == "repeat" for r in runs)
    assert lab_servers(pair.port) == []
    # rerun of the bad endpoint: judged by its recorded bar against the recorded good metric
    [good] = [r for r in runs if r.variant == () and r.purpose == "endpoint"]
    [bad] = [r for r in runs if r.variant != () and r.purpose == "endpoint"]
    code, again = cli_json("rerun", bad.id, "--hosts", hosts, "--results", results, timeout=120)
    assert code == 0, again
    assert (again["bar"], again["good_metric"], again["good_run"]) == (
        ">= 0.95 * good",
        good.probe_metric,
        good.id,
    )
    assert again["judged_by"] == (
        f"judged by the recorded bar >= 0.95 * good, good = "
        f"{good.probe_metric:g} (run {good.id}), "
        f"bar = {0.95 * good.probe_metric:g}"
    )
    assert again["probe_metric"] < 0.95 * good.probe_metric
    assert again["verdict"] == "fail" and again["signature"] == TARGET and again["same"], again


def test_throughput_bisection_on_a_pool_of_two_systemd_hosts(
    duo: list[SystemdHost], tmp_path: Path
) -> None:
    hosts = {
        f"gpu{i + 1}": box.hosts_entry(env={"PYTHONPATH": "/opt/orchestrator"})
        for i, box in enumerate(duo)
    }
    hosts_file = tmp_path / "hosts.yaml"
    hosts_file.write_text(yaml.safe_dump({"hosts": hosts, "pools": {"duo": list(hosts)}}))
    results = tmp_path / "results"
    good, bad = LAB / "rtx6000" / "perf_good.yaml", LAB / "rtx6000" / "perf_bad.yaml"
    code, out = cli_json(
        "bisect",
        "--good",
        good,
        "--bad",
        bad,
        "--host",
        "duo",
        "--hosts",
        hosts_file,
        "--results",
        results,
        timeout=600,
    )
    assert code == 0, out
    runs = check_throughput_answer(out, results)
    assert {r.host for r in runs} <= {"gpu1", "gpu2"}
    # with hosts to spare, the endpoints still ran one after the other: bad needs good's metric
    good = next(r for r in runs if r.variant == () and r.purpose == "endpoint")
    bad = next(r for r in runs if len(r.variant) == 2 and r.purpose == "endpoint")
    assert good.started + good.duration <= bad.started + 0.5, (good, bad)
    for box in duo:
        assert box.ssh_run(f"test -e {UNIT_DIR}/{UNIT}.d/99-orchestrator.conf").returncode != 0
        state = box.ssh_run(f"systemctl is-active {UNIT}").stdout.strip()
        assert state == "inactive"
