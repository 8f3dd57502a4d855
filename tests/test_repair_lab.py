"""The RTX PRO 6000 incident, repaired: the lab pair end to end on the real test hosts.

`experiments/lab/rtx6000-repair`: every EP variant runs out of memory at
`--mem-fraction-static 0.85`; started again at 0.92 (the pair's declared move), EP with
the FlashInfer all-to-all backend hits the AssertionError in CUDA-graph capture. With
repair the answer is {ep-size, moe-a2a-backend} and names the repair; with `--no-repair`
the same pair ends as it always did: the out-of-memory failure is the target and
`--ep-size` alone its cause. Through OpenSSH's sshd (process manager, the CLI in a
subprocess) and on the systemd lab host (drop-ins, systemctl, the journal).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    lab_servers,
    load_host,
    sshd_hosts_file,
)

MEM = "--mem-fraction-static"
UNIT = "lab-rtx6000.service"


def check_repaired(answer: dict[str, Any], results: Path) -> None:
    """The real bug, seen behind the repaired out-of-memory start, and the repair named."""
    assert answer["status"] == "found", answer
    assert answer["target"].startswith("cuda_graph: AssertionError"), answer["target"]
    [cul] = answer["culprits"]
    assert sorted(cul["flags"]) == ["--ep-size 8", "--moe-a2a-backend flashinfer"]
    assert cul["repaired_with"] == [f"{MEM} 0.85 -> 0.92"]
    check_answer_evidence(results, answer, answer["target"])
    notes = {n["variant"]: n for n in answer["repairs"]}
    bad = notes["bad"]
    assert bad["state"] == "repaired" and bad["moves"] == [f"{MEM} 0.85 -> 0.92"]
    assert bad["before"].startswith("failed on a resource (kv_cache: cuda_oom: CUDA out of memory")
    assert bad["after"].startswith("failed with the target (cuda_graph: AssertionError")
    assert f"{MEM} 0.92" in bad["command"]
    # EP alone, repaired, starts and serves: it clears moe-a2a-backend's partner
    assert notes["good + --ep-size 8"]["after"] == "passed"
    assert answer["findings"] == []  # the out-of-memory failure was repaired everywhere
    store = Store(results)
    try:
        runs = store.runs(answer["campaign"])
    finally:
        store.close()
    repaired = [r for r in runs if r.repair]
    assert repaired and all(r.repair["knob"] == "mem-fraction-static" for r in repaired)
    assert all(r.repair["value"] == 0.92 for r in repaired)
    before = {r.id: r for r in runs}
    for r in repaired:  # each repaired start names the start it repaired: out of memory
        first = before[r.repair["after"]]
        assert first.signature is not None and first.signature.error_class == "cuda_oom"
        assert first.variant == r.variant and f"{MEM} 0.85" in " ".join(first.argv)
        assert f"{MEM} 0.92" in " ".join(r.argv)


def check_unrepaired(answer: dict[str, Any]) -> None:
    """As the pair ended before repairs: the out-of-memory failure hides the real bug."""
    assert answer["status"] == "found", answer
    assert answer["target"].startswith("kv_cache: cuda_oom: CUDA out of memory")
    assert [c["flags"] for c in answer["culprits"]] == [["--ep-size 8"]]
    assert "repairs" not in answer


def test_the_incident_over_sshd_with_and_without_repair(sshd: SshdEndpoint, tmp_path: Path) -> None:
    pair = lab_pair(tmp_path, "rtx6000-repair")
    hosts = sshd_hosts_file(sshd, tmp_path)
    args = ("bisect", "--good", pair.good, "--bad", pair.bad, "--host", "lab", "--hosts", hosts)
    code, repaired = cli_json(*args, "--results", tmp_path / "results")
    assert code == 0, repaired
    check_repaired(repaired, tmp_path / "results")
    code, plain = cli_json(*args, "--no-repair", "--results", tmp_path / "plain")
    assert code == 0, plain
    check_unrepaired(plain)
    # the difference: the same pair, the culprit of the real bug only under repair
    assert repaired["target"] != plain["target"]
    assert repaired["runs_executed"] > plain["runs_executed"]
    # the upstream issue reproduces with the repaired command line
    issue = cli("report", repaired["campaign"], "--issue", "--results", tmp_path / "results")
    assert issue.returncode == 0, issue.stderr
    assert f"{MEM} 0.92" in issue.stdout and "This command line is the repaired one" in issue.stdout
    # the same command again: a new campaign that reuses every start, the repaired ones
    # under their moves, and prints the answer with the repairs
    again = cli(*args, "--results", tmp_path / "results", "--no-report")
    assert again.returncode == 0, again.stdout + again.stderr
    said = " ".join(again.stdout.split())
    assert f"(repaired with {MEM} 0.85 -> 0.92)" in said
    assert "repair: bad: failed on a resource (kv_cache: cuda_oom" in said
    assert f"with {MEM} 0.85 -> 0.92 it failed with the target (cuda_graph: AssertionError" in said
    assert f"runs: 0 executed, {repaired['runs_executed']} reused" in said
    assert lab_servers(pair.port) == []


def test_the_incident_on_the_systemd_host(systemd_host: SystemdHost, tmp_path: Path) -> None:
    box = systemd_host
    box.install_unit(UNIT, LAB_UNIT)
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(box.hosts_yaml("sd", env={"PYTHONPATH": "/opt/orchestrator"}))
    plan = make_plan(
        str(LAB / "rtx6000-repair" / "good.yaml"), str(LAB / "rtx6000-repair" / "bad.yaml"), "auto"
    )
    answers = {}
    for repair in (True, False):
        results = tmp_path / f"results-{repair}"
        store = Store(results)
        try:
            outcome = Bisection(
                store,
                plan,
                [load_host(hosts, "sd")],
                options=BisectOptions(repair=repair),
                command="test",
            ).run()
            runs = store.runs(outcome.campaign_id)
        finally:
            store.close()
        answers[repair] = outcome.to_dict()
        # every start went through our drop-in, the repaired ones with the moved flag
        for r in runs:
            assert r.rendered and "ExecStart=" in r.rendered, r
            if r.repair:
                assert f'"{MEM}" "0.92"' in r.rendered
    check_repaired(answers[True], tmp_path / "results-True")
    check_unrepaired(answers[False])
    assert (
        box.ssh_run(f"test -e /etc/systemd/system/{UNIT}.d/99-orchestrator.conf").returncode != 0
    )  # left as found
