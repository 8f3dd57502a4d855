"""A real vLLM deployed over two hosts with networks of their own: data parallel 2 with one
rank per node (`experiments/real/vllm-cpu/dp2_good.yaml`: node 0 serves the API and
engine 0, node 1 runs engine 1 `--headless` and dials node 0's `--data-parallel-address`
across the namespaces), each host an sshd in a network namespace of its own
(`netns_hosts`), each rank a detached server of the process manager on its host.

`bisect dp2_good dp2_bad`: node 1's `--max-model-len 100000` kills its engine at config
validation while node 0 waits in the data-parallel handshake without a line; the answer is
node 1's flag with node 1's crash as the signature and node 1 named as the first failure,
`--disable-log-stats` (shared) cleared; afterwards no server of ours runs on either host.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.lab.nshosts import NetnsSshdHost
from orchestrator.store.store import Store
from tests.hosts.vllm import REAL, RealVllm
from tests.support.campaign_lab import cli_json

NODES = ("dp-node0", "dp-node1")


def _moved(root: Path, name: str, head: str) -> Path:
    """The shipped config with node 0's address as the one the ranks meet at (the ports
    stay: the namespaces are the test's own, nothing else listens there)."""
    path = root / name
    doc = {
        "name": f"test-{Path(name).stem}",
        "extends": str(REAL / name),
        "service": {"flags": {"data-parallel-address": head}},
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _nothing_left(hosts: list[NetnsSshdHost], tmp_path: Path) -> None:
    """No process of ours in either namespace; no launch script or pid file left."""
    for host in hosts:
        assert host.processes() == [], host.processes()
    for name in NODES:
        run = tmp_path / f"run-{name}"
        for svc in run.iterdir() if run.is_dir() else ():
            if svc.is_dir() and svc.name != "locks":
                assert not (svc / "pid").exists() and not (svc / "launch.sh").exists(), svc


def test_dp2_over_two_namespaces_names_node1s_flag(
    vllm_real: RealVllm, netns_hosts: list[NetnsSshdHost], tmp_path: Path
) -> None:
    entries = {
        name: host.endpoint.hosts_entry(run_dir=str(tmp_path / f"run-{name}"))
        for name, host in zip(NODES, netns_hosts, strict=True)
    }
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": entries}, sort_keys=False))
    head = netns_hosts[0].address
    good = _moved(tmp_path, "dp2_good.yaml", head)
    bad = _moved(tmp_path, "dp2_bad.yaml", head)
    argv = ["bisect", "--good", good, "--bad", bad, "--host", NODES[0], "--hosts", hosts]
    code, out = cli_json(*argv, "--results", tmp_path / "results", "--no-report", timeout=1800)
    assert code == 0 and out["status"] == "found", out
    assert [c["deltas"] for c in out["culprits"]] == [["node1: + --max-model-len 100000"]], out
    # node 1's own crash, not node 0's silent wait
    assert "max_model_len" in out["target"], out["target"]

    store = Store(tmp_path / "results")
    try:
        runs = [r for r in store.runs(out["campaign"]) if r.cached_from is None]
        records = {r.id: store.host_record(r.id) or {} for r in runs}
    finally:
        store.close()
    failed = [r for r in runs if r.verdict is Verdict.FAIL]
    assert failed and all(r.host == NODES[1] for r in failed), [(r.label, r.host) for r in runs]
    for r in failed:
        assert "--max-model-len" in str(records[r.id]["roles"][1]["rendered"]), r.id
        ff = records[r.id]["first_failure"]
        assert ff["role"] == "node1" and ff["host"] == NODES[1], ff
        # node 0 waited for it without a line: a consequence, told as such
        assert "node0 then hung without a word" in ff["describe"], ff
        roles = {x["role"]: x for x in records[r.id]["roles"]}
        assert "greater than the derived max_model_len" in roles["node1"]["log_tail"]
    # the harmless shared flag: a run with it and without node 1's flag served
    harmless = [r for r in runs if any("disable-log-stats" in a for a in r.argv)]
    assert any(r.verdict is Verdict.PASS for r in harmless), [(r.label, r.verdict) for r in runs]
    _nothing_left(netns_hosts, tmp_path)
