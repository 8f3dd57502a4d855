"""Helpers for the deployment tests: the lab's two-node and prefill/decode pairs moved to
free ports, and hosts files whose roles' hosts are the real sshd on 127.0.0.1 (one host
name per node, each with a run_dir of its own, so that every role is a service of its own
on a host of its own name)."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.config.hosts import Inventory, load_inventory
from orchestrator.lab.sshd import SshdEndpoint, free_port
from tests.support.campaign_lab import LAB, TIME_SCALE


def two_sshd_hosts(sshd: SshdEndpoint, tmp: Path, names: tuple[str, ...] = ("n0", "n1")) -> Path:
    """A hosts file naming the sshd once per node (run_dir and lab time scale of its own)."""
    hosts = {}
    for name in names:
        hosts[name] = sshd.hosts_entry(
            run_dir=str(tmp / f"run-{name}"), env={"ORCH_LAB_TIME_SCALE": TIME_SCALE}
        )
    path = tmp / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": hosts}, sort_keys=False))
    return path


def inventory(path: Path) -> Inventory:
    return load_inventory(path)


def two_node_pair(
    tmp: Path,
    *,
    scenario: str = "two-node",
    node1_host: str | None = "n1",
    watchdog: float = 3,
    init_host: str = "127.0.0.1",
) -> tuple[Path, Path]:
    """The shipped two-node pair (or b300's pair spread over two nodes, `scenario="b300"`)
    on free ports: rank 0's HTTP port, rank 1's, and the init address (on `init_host`,
    rank 0's address as rank 1 reaches it)."""
    out = tmp / "experiments"
    out.mkdir(parents=True, exist_ok=True)
    init, p0, p1 = free_port(), free_port(), free_port()
    paths = []
    for side in ("good", "bad"):
        doc: dict[str, object] = {"name": f"test-{scenario}-2n-{side}"}
        if scenario == "two-node":
            doc["extends"] = str(LAB / "two-node" / f"{side}.yaml")
            shared: dict[str, object] = {}
        else:  # a single-node pair spread over two nodes: the same flags on both
            doc["extends"] = str(LAB / scenario / f"{side}.yaml")
            shared = {"nnodes": 2}
        shared |= {"dist-init-addr": f"{init_host}:{init}", "dist-timeout": watchdog, "port": None}
        doc["service"] = {"flags": shared}
        doc["roles"] = {
            "node0": {"kind": "node", "rank": 0, "flags": {"node-rank": 0, "port": p0}},
            "node1": {"kind": "node", "rank": 1, "flags": {"node-rank": 1, "port": p1}},
        }
        if node1_host:
            doc["roles"]["node1"]["host"] = node1_host  # type: ignore[index]
        doc["health"] = {"settle": f"{float(TIME_SCALE):g}s"}
        path = out / f"{scenario}-2n-{side}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        paths.append(path)
    return paths[0], paths[1]


PD = LAB / "pd-page-size"
#: prefill of TP4 and decode of TP2; bad's prefill crashes under requests
PD_TP = LAB / "pd-tp"


def pd_files(tmp: Path, *, decode_host: str | None = "n1", pair: Path = PD) -> dict[str, Path]:
    """A shipped prefill/decode pair (`good`, `bad`, and `bad-start` where it has one) on
    free ports: the router's command names the workers' ports; the decode role on
    `decode_host`."""
    out = tmp / "experiments"
    out.mkdir(parents=True, exist_ok=True)
    router, prefill, decode = free_port(), free_port(), free_port()
    paths = {}
    for side in ("good", "bad", "bad-start"):
        if not (pair / f"{side}.yaml").is_file():
            continue
        roles: dict[str, dict[str, object]] = {
            "router": {
                "exec": "python3 -m orchestrator.lab.pd --prefill "
                f"http://127.0.0.1:{prefill} --decode http://127.0.0.1:{decode}",
                "flags": {"port": router},
            },
            "prefill": {"flags": {"port": prefill}},
            "decode": {"flags": {"port": decode}},
        }
        if decode_host:
            roles["decode"]["host"] = decode_host
        doc = {
            "name": f"test-{pair.name}-{side}",
            "extends": str(pair / f"{side}.yaml"),
            "roles": roles,
            "health": {"settle": f"{float(TIME_SCALE):g}s"},
        }
        path = out / f"{pair.name}-{side}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        paths[side] = path
    return paths
