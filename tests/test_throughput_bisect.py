"""Throughput bisection: which delta costs throughput, not which one crashes.

The rtx6000 perf pair (`experiments/lab/rtx6000/perf_good.yaml` -> `perf_bad.yaml`):
nothing crashes, but `--cuda-graph-max-bs 512` costs about 10% of the output throughput,
and the probe's bar is relative to the good config (`pass_if: ">= 0.95 * good"`). A
bisection through `orchestrator bisect --json` measures it (the bar is relative to good):
it must name that flag alone with its effect, every start keeping each benchmark run:
through the real sshd, and on a pool of two systemd hosts, where the good endpoint's
metric must be known before the bad endpoint can be judged against it.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.lab.sdhosts import SystemdHost
from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.store.store import RunRow, Store
from tests.support.campaign_lab import (
    LAB,
    UNIT_DIR,
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
    """--cuda-graph-max-bs alone, with its effect measured; every run kept its figures."""
    assert out["status"] == "found", out
    assert out["target"] == TARGET
    assert sorted(out["deltas"]) == sorted([CULPRIT, HARMLESS])
    [culprit] = out["culprits"]
    assert culprit["flags"] == ["--cuda-graph-max-bs 512"] and not culprit["interacting"]
    [named] = out["effects"]["named"]
    assert named["flags"] == ["--cuda-graph-max-bs 512"]
    assert named["low"] <= -10.0 * 0.6 and named["high"] >= -10.0 * 1.4 and named["high"] < 0
    assert out["findings"] == [] and out["invalid"] == []
    store = Store(results)
    try:
        runs = store.runs(out["campaign"])
        records = [store.host_record(r.id) for r in runs]
    finally:
        store.close()
    for r, rec in zip(runs, records, strict=True):
        assert r.probe_metric is not None, r  # every variant became healthy and was measured
        assert rec is not None and len(rec["probe"]["values"]) == 4, r
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
        "--hosts",
        hosts,
        "--results",
        results,
        timeout=600,
    )
    assert code == 0, out
    runs = check_throughput_answer(out, results)
    # the measured search started good and bad several times to know the noise
    assert sum(r.variant == () for r in runs) >= 3
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
