"""Deployments: roles in an experiment, deltas of one role, flags the roles must agree on,
and `plan` on the lab's prefill/decode pair (no host needed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.config import load_experiment
from orchestrator.config.deployment import (
    disagreements,
    listens,
    refusal,
    split_warnings,
    starts_anyway,
)
from orchestrator.errors import ConfigError, PlanError
from orchestrator.planner.deltas import Delta, apply_deltas, diff

REPO = Path(__file__).resolve().parents[1]
PD = REPO / "experiments" / "lab" / "pd-page-size"
LAB = REPO / "experiments" / "lab"

SINGLE = """\
name: one
service:
  unit: sglang.service
  exec: /opt/sglang/bin/python -m sglang.launch_server
  flags: {model-path: /m, tp-size: 8, port: 30000}
"""

PAIR = """\
name: pd
service:
  exec: /opt/sglang/bin/python -m sglang.launch_server
  flags: {model-path: /m, tp-size: 4, page-size: 16, max-running-requests: 128}
  env: {NCCL_DEBUG: WARN}
roles:
  router:
    unit: router.service
    exec: /opt/sglang/bin/python -m sglang_router.launch_router --pd-disaggregation
    flags: {port: 30000}
  prefill: {host: b300-01, unit: prefill.service, flags: {port: 30001}}
  decode: {host: b300-02, unit: decode.service, flags: {port: 30002}}
"""

NODES = """\
name: two-nodes
service:
  exec: /opt/sglang/bin/python -m sglang.launch_server
  flags: {model-path: /m, tp-size: 16, nnodes: 2, dist-init-addr: "10.0.0.1:5000", port: 30000}
roles:
  node1: {kind: node, rank: 1, host: b300-02, flags: {node-rank: 1}}
  node0: {kind: node, rank: 0, host: b300-01, flags: {node-rank: 0}}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ---------------------------------------------------------------------------- config


def test_a_single_unit_is_a_deployment_of_one_role_as_before(tmp_path: Path) -> None:
    exp = load_experiment(write(tmp_path, "one.yaml", SINGLE))
    dep = exp.deployment()
    assert [r.name for r in dep.roles] == ["server"] and dep.single
    assert dep.start_order == dep.stop_order == ("server",) and dep.health_role == "server"
    assert exp.role_launch("server") is exp
    assert exp.roles == () and "roles" not in exp.to_dict()
    assert disagreements(exp) == () and refusal(exp) is None


def test_roles_give_each_unit_the_shared_flags_and_its_own(tmp_path: Path) -> None:
    exp = load_experiment(write(tmp_path, "pd.yaml", PAIR))
    dep = exp.deployment()
    assert dep.start_order == ("router", "prefill", "decode")
    assert dep.stop_order == ("decode", "prefill", "router")
    assert dep.health_role == "router" and exp.port == 30000
    decode = exp.role_launch("decode")
    assert decode.unit == "decode.service" and decode.port == 30002
    assert decode.flag_map() == {
        "model-path": "/m",
        "tp-size": 4,
        "page-size": 16,
        "max-running-requests": 128,
        "port": 30002,
    }
    assert decode.env_map() == {"NCCL_DEBUG": "WARN"}
    router = exp.role_launch("router")  # takes only what it names
    assert router.argv()[-3:] == ["--pd-disaggregation", "--port", "30000"]
    assert router.env_map() == {}
    # the roles survive a round trip (store, rerun) and join the cache key
    again = type(exp).from_dict(exp.to_dict())
    assert again.roles == exp.roles and again.fingerprint() == exp.fingerprint()
    assert exp.fingerprint() != exp.role_launch("router").fingerprint()


def test_node_ranks_start_from_rank_zero_which_health_is_polled_on(tmp_path: Path) -> None:
    exp = load_experiment(write(tmp_path, "nodes.yaml", NODES))
    dep = exp.deployment()
    assert dep.start_order == ("node0", "node1") and dep.stop_order == ("node1", "node0")
    assert dep.health_role == "node0"
    assert dep.role("node1").host == "b300-02"
    assert disagreements(exp) == ()


@pytest.mark.parametrize(
    ("roles", "key", "words"),
    [
        (
            "  decode: {kind: decode, flgs: {port: 1}}\n",
            "roles.decode.flgs",
            "did you mean 'flags'",
        ),
        ("  worker: {flags: {port: 1}}\n", "roles.worker.kind", "needs its kind"),
        ("  decode: {kind: decoder}\n", "roles.decode.kind", "expected one of"),
        ("  n0: {kind: node}\n", "roles.n0.rank", "needs its rank"),
        (
            "  n0: {kind: node, rank: 0}\n  n1: {kind: node, rank: 2}\n",
            "roles",
            "ranks 0..1 once each",
        ),
        (
            "  n0: {kind: node, rank: 0}\n  n1: {kind: node, rank: 1, flags: {node-rank: 0}}\n",
            "roles.n1.flags.node-rank",
            "differs from the role's rank 1",
        ),
        ("  router: {flags: {port: 1}}\n", "roles", "needs a server role"),
        ("  decode: {unit: ../x.service}\n", "roles.decode.unit", "plain systemd unit"),
        (
            "  router: {exec: r, flags: {policy: random}}\n  decode: {flags: {port: 1}}\n",
            "roles.router.flags.port",
            "health is polled on the role 'router'",
        ),
    ],
)
def test_bad_roles_are_refused_naming_file_and_key(
    tmp_path: Path, roles: str, key: str, words: str
) -> None:
    text = SINGLE + "roles:\n" + roles
    path = write(tmp_path, "bad-roles.yaml", text)
    with pytest.raises(ConfigError) as err:
        load_experiment(path)
    assert err.value.key == key and words in str(err.value)
    assert str(path) in str(err.value.file)


def test_mismatched_roles_takes_refuse_or_start(tmp_path: Path) -> None:
    path = write(tmp_path, "m.yaml", PAIR + "mismatched_roles: later\n")
    with pytest.raises(ConfigError) as err:
        load_experiment(path)
    assert err.value.key == "mismatched_roles" and "refuse, start" in str(err.value)


# ---------------------------------------------------------------------------- deltas


def _pd_pair(tmp_path: Path, bad_tail: str) -> tuple:
    write(tmp_path, "good.yaml", PAIR)
    good = load_experiment(tmp_path / "good.yaml")
    bad = load_experiment(write(tmp_path, "bad.yaml", "name: bad\nextends: good.yaml\n" + bad_tail))
    return good, bad


def test_a_flag_changed_on_one_role_is_that_roles_delta(tmp_path: Path) -> None:
    good, bad = _pd_pair(
        tmp_path,
        "service: {flags: {max-running-requests: 256}}\n"
        "roles:\n"
        "  decode: {flags: {page-size: 64, cuda-graph-max-bs: 8}, env: {X: '1'}}\n"
        "  router: {flags: {policy: random}}\n",
    )
    ds = diff(good, bad)
    assert [d.describe() for d in ds] == [
        "decode: ~ --page-size 16 -> 64",
        "~ --max-running-requests 128 -> 256",
        "router: + --policy random",
        "decode: + --cuda-graph-max-bs 8",
        "decode: + env X=1",
    ]
    assert [d.role for d in ds] == ["decode", None, "router", "decode", "decode"]
    assert ds[0].short() == "decode: --page-size 64"
    assert Delta.from_dict(ds[0].to_dict()) == ds[0] and ds[0].to_dict()["role"] == "decode"
    # every role of good + all deltas launches what bad launches
    full = apply_deltas(good, ds)
    for role in ("router", "prefill", "decode"):
        assert full.role_launch(role).argv() == bad.role_launch(role).argv()
        assert full.role_launch(role).env_map() == bad.role_launch(role).env_map()
    # one role's delta changes that role only; the shared one every server role
    only = apply_deltas(good, [ds[0]])
    assert only.role_launch("decode").flag_map()["page-size"] == 64
    assert only.role_launch("prefill").flag_map()["page-size"] == 16
    shared = apply_deltas(good, [ds[1]])
    for role in ("prefill", "decode"):
        assert shared.role_launch(role).flag_map()["max-running-requests"] == 256
    assert "max-running-requests" not in shared.role_launch("router").flag_map()


def test_a_change_on_every_server_role_alike_is_one_delta(tmp_path: Path) -> None:
    good, bad = _pd_pair(
        tmp_path,
        "roles:\n  prefill: {flags: {page-size: 32, tp-size: null}}\n"
        "  decode: {flags: {page-size: 32, tp-size: null}}\n",
    )
    ds = diff(good, bad)
    assert [d.describe() for d in ds] == ["- --tp-size 4", "~ --page-size 16 -> 32"]
    assert all(d.role is None for d in ds)
    full = apply_deltas(good, ds)
    for role in ("prefill", "decode"):
        assert full.role_launch(role).flag_map() == bad.role_launch(role).flag_map()
    # and back: bad's own values are dropped when good's shared ones are applied
    back = apply_deltas(bad, diff(bad, good))
    for role in ("prefill", "decode"):
        assert back.role_launch(role).flag_map() == good.role_launch(role).flag_map()


def test_single_unit_deltas_name_no_role(tmp_path: Path) -> None:
    good = load_experiment(write(tmp_path, "g.yaml", SINGLE))
    bad = load_experiment(
        write(tmp_path, "b.yaml", "name: b\nextends: g.yaml\nservice: {flags: {ep-size: 8}}\n")
    )
    (d,) = diff(good, bad)
    assert d.role is None and d.describe() == "+ --ep-size 8" and "role" not in d.to_dict()


def test_a_pair_of_other_roles_is_refused(tmp_path: Path) -> None:
    good, bad = _pd_pair(tmp_path, "roles:\n  decode: {host: b300-03}\n")
    with pytest.raises(PlanError) as err:
        diff(good, bad)
    # the error names what differs, where, and each side's value
    assert "roles.decode.host: good has b300-02, bad has b300-03" in str(err.value)
    assert str(bad.source) in str(err.value)
    renamed, _ = _pd_pair(tmp_path, "")
    other = load_experiment(
        write(
            tmp_path,
            "renamed.yaml",
            PAIR.replace("decode: {", "decoder: {kind: decode, ").replace("name: pd", "name: r"),
        )
    )
    with pytest.raises(PlanError) as err:
        diff(renamed, other)
    assert "only good has decode, only bad has decoder" in str(err.value)
    single = load_experiment(write(tmp_path, "one.yaml", SINGLE))
    with pytest.raises(PlanError):
        diff(single, good)


# ---------------------------------------------------------------------------- agreement


@pytest.mark.parametrize(
    ("tail", "flag", "roles"),
    [
        ("roles: {decode: {flags: {page-size: 64}}}\n", "page-size", ("prefill", "decode")),
        ("roles: {decode: {flags: {kv-cache-dtype: fp8_e4m3}}}\n", "kv-cache-dtype", None),
        ("roles: {prefill: {flags: {model-path: /other}}}\n", "model-path", None),
    ],
)
def test_a_split_of_flags_the_roles_share_is_refused(
    tmp_path: Path, tail: str, flag: str, roles: tuple[str, ...] | None
) -> None:
    good, bad = _pd_pair(tmp_path, tail)
    assert refusal(good) is None
    why = refusal(bad)
    assert why is not None
    (d,) = why.disagreements
    assert d.flag == flag and d.roles == ("prefill", "decode")
    assert "prefill: --" in why.reason and "decode: --" in why.reason
    assert why.to_dict()["disagreements"][0]["flag"] == flag
    assert d.required and d.source and d.source in why.reason  # the servers' own word
    # the experiment may say to start it anyway
    assert refusal(bad, start=True) is None
    assert disagreements(bad) == why.disagreements


def test_every_agreement_entry_cites_the_servers_own_word() -> None:
    """Each entry of the table names where the servers say it (their docs, tests or
    reports): a refusal or a warning the user can check."""
    from orchestrator.config.deployment import AGREE

    for rule in AGREE:
        assert re.search(r"(sglang|vllm)#\d+|docs\.(sglang|vllm)|\.py", rule.source), rule
    required = {(n, r.over) for r in AGREE if r.required for n in r.names}
    # a layout SGLang and vLLM support (sglang#5922, test_disaggregation_different_tp.py)
    assert ("tp-size", "serving") not in required
    assert ("block-size", "serving") not in required  # vLLM: heterogeneous block size
    assert {("page-size", "serving"), ("kv-cache-dtype", "serving")} <= required
    assert {("tp-size", "server"), ("dist-init-addr", "server"), ("nnodes", "server")} <= required


@pytest.mark.parametrize(
    ("tail", "flag", "source"),
    [
        ("roles: {decode: {flags: {tp-size: 2}}}\n", "tp-size", "sglang#5922"),
        ("roles: {decode: {flags: {block-size: 32}}}\n", "block-size", "nixl_connector"),
    ],
)
def test_a_split_the_servers_support_in_some_setups_is_a_warning_not_a_refusal(
    tmp_path: Path, tail: str, flag: str, source: str
) -> None:
    """Prefill with --tp-size 4 and decode with --tp-size 2 behind a router is a layout
    SGLang supports (sglang#5922): it starts, and is said once before the campaign."""
    good, split = _pd_pair(tmp_path, tail)
    assert refusal(split) is None
    (d,) = disagreements(split)
    assert not d.required and source in d.source
    (line,) = split_warnings(good, split)
    assert line.startswith(f"{split.source}: the roles differ on --{flag}"), line
    assert "some setups only" in line and source in line, line
    assert split_warnings(good, good) == []


def test_plan_and_bisect_say_the_warning_and_refuse_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, split = _pd_pair(tmp_path, "roles: {decode: {flags: {tp-size: 2}}}\n")
    assert main(["plan", "--good", str(good.source), "--bad", str(split.source), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["refused"] == {"good": None, "bad": None}
    err = " ".join(captured.err.split())
    assert "warning: " in err and "the roles differ on --tp-size" in err, err
    from orchestrator.cli.bisect import refuse_split_endpoints

    refuse_split_endpoints(split, split)  # a good of different TP sizes goes on to the hosts


def test_the_ranks_of_one_server_must_agree_on_their_tp_size(tmp_path: Path) -> None:
    write(tmp_path, "n.yaml", NODES)
    split = load_experiment(
        write(
            tmp_path, "s.yaml", "name: s\nextends: n.yaml\nroles: {node1: {flags: {tp-size: 8}}}\n"
        )
    )
    (d,) = refusal(split).disagreements
    assert d.flag == "tp-size" and d.roles == ("node1", "node0")
    assert "multi_node_deployment" in refusal(split).reason


def test_equal_values_written_differently_agree(tmp_path: Path) -> None:
    good, bad = _pd_pair(tmp_path, "roles: {decode: {flags: {page-size: '16'}}}\n")
    assert refusal(bad) is None


@pytest.mark.parametrize(
    ("tail", "agree"),
    [
        ("roles: {decode: {flags: {kv-cache-dtype: auto}}}\n", True),
        ("roles: {decode: {flags: {kv-cache-dtype: fp8_e5m2}}}\n", False),
    ],
)
def test_a_role_that_writes_the_servers_default_agrees_with_one_that_leaves_it_out(
    tmp_path: Path, tail: str, agree: bool
) -> None:
    # `--kv-cache-dtype auto` on one role only refused good itself: "roles disagree"
    good, bad = _pd_pair(tmp_path, tail)
    assert (disagreements(bad) == ()) is agree, disagreements(bad)
    assert (refusal(bad) is None) is agree


def test_the_ranks_of_one_server_agree_on_init_address_and_node_count(tmp_path: Path) -> None:
    write(tmp_path, "n.yaml", NODES)
    split = load_experiment(
        write(
            tmp_path,
            "s.yaml",
            "name: s\nextends: n.yaml\n"
            "roles: {node1: {flags: {dist-init-addr: '10.0.0.9:5000'}}}\n",
        )
    )
    (d,) = refusal(split).disagreements
    assert d.flag == "dist-init-addr" and d.roles == ("node1", "node0")
    three = load_experiment(
        write(tmp_path, "t.yaml", "name: t\nextends: n.yaml\nservice: {flags: {nnodes: 3}}\n")
    )
    (d,) = refusal(three).disagreements
    assert d.flag == "nnodes" and "2 node roles" in d.why


DATA_PARALLEL = """\
name: dp2
service:
  exec: /opt/vllm/bin/vllm serve /models/m
  flags:
    data-parallel-size: 2
    data-parallel-size-local: 1
    data-parallel-address: 10.0.0.1
    data-parallel-rpc-port: 13345
    port: 8000
roles:
  node0: {kind: node, rank: 0, host: b300-01}
  node1: {kind: node, rank: 1, host: b300-02, flags: {headless: true, data-parallel-start-rank: 1}}
"""


@pytest.mark.parametrize(
    ("own", "flag"),
    [
        ("{data-parallel-address: 10.0.0.9}", "data-parallel-address"),
        ("{data-parallel-rpc-port: 13346}", "data-parallel-rpc-port"),
        ("{-dpp: 13346}", "data-parallel-rpc-port"),  # vLLM's short alias: the same option
        ("{data-parallel-size: 4}", "data-parallel-size"),
        ("{data-parallel-address: null}", "data-parallel-address"),  # absent on one rank
    ],
)
def test_the_data_parallel_ranks_of_one_vllm_server_agree_on_where_they_meet(
    tmp_path: Path, own: str, flag: str
) -> None:
    good = load_experiment(write(tmp_path, "dp.yaml", DATA_PARALLEL))
    # a rank's own flags (headless, its start rank) are no split
    assert refusal(good) is None
    split = load_experiment(
        write(
            tmp_path, "s.yaml", f"name: s\nextends: dp.yaml\nroles: {{node1: {{flags: {own}}}}}\n"
        )
    )
    why = refusal(split)
    assert why is not None
    (d,) = why.disagreements
    assert d.flag == flag and d.roles == ("node0", "node1"), d
    assert "data-parallel ranks" in d.why
    # moved alike on every rank, it is one delta and no split
    alike = load_experiment(
        write(
            tmp_path,
            "a.yaml",
            "name: a\nextends: dp.yaml\nservice: {flags: {data-parallel-rpc-port: 13399}}\n",
        )
    )
    assert refusal(alike) is None


def test_only_the_roles_that_serve_http_listen(tmp_path: Path) -> None:
    dp = load_experiment(write(tmp_path, "dp.yaml", DATA_PARALLEL))
    # the headless rank serves no HTTP: rank 0's port on its host is not its own
    assert listens(dp, "node0") and not listens(dp, "node1")
    assert dp.role_launch("node1").port == 8000  # what a port check would have held it to
    pd = load_experiment(write(tmp_path, "pd.yaml", PAIR))
    assert all(listens(pd, r) for r in ("router", "prefill", "decode"))
    assert listens(load_experiment(write(tmp_path, "one.yaml", SINGLE)), "server")
    # an SGLang rank above 0 serves no HTTP either, though it inherits the shared port
    two = load_experiment(LAB / "two-node" / "good.yaml")
    ranks = [r.name for r in two.roles if r.rank]
    assert ranks and not any(listens(two, r) for r in ranks)


def test_start_anyway_is_the_pairs_word() -> None:
    good = load_experiment(PD / "good.yaml")
    bad = load_experiment(PD / "bad.yaml")
    start = load_experiment(PD / "bad-start.yaml")
    assert not starts_anyway(good, bad) and starts_anyway(good, start)
    assert start.fingerprint() != bad.fingerprint()  # a refused verdict is not reused


# ---------------------------------------------------------------------------- plan


def test_plan_of_the_lab_pd_pair_names_the_role_and_refuses_bad(
    capsys: pytest.CaptureFixture[str],
) -> None:
    good, bad = str(PD / "good.yaml"), str(PD / "bad.yaml")
    assert main(["plan", "--good", good, "--bad", bad]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "router [router] on the campaign's host (lab-pd-router.service), health polled" in text
    assert "decode: ~ --page-size 16 -> 64" in text
    assert (
        "bad is refused before it starts (invalid): roles disagree: prefill: --page-size 16;"
        in text
    )
    assert main(["plan", "--good", good, "--bad", bad, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["role"] for r in out["roles"]] == ["router", "prefill", "decode"]
    assert out["refused"]["good"] is None and "decode: --page-size 64" in out["refused"]["bad"]
    page = next(d for d in out["deltas"] if d["key"] == "page-size")
    assert page["role"] == "decode" and page["new"] == 64
    for v in out["first_round"]:
        assert (v["refused"] is not None) == (page["index"] in v["deltas"])
    # started anyway when the experiment says so
    assert main(["plan", "--good", good, "--bad", str(PD / "bad-start.yaml"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["refused"]["bad"] is None
    assert all(v["refused"] is None for v in out["first_round"])


def test_a_role_on_a_host_the_hosts_file_lacks_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Runs start every role on its host; a role's `host:` must be a host of the hosts
    file: refused (exit 2) naming the role's key, before anything is recorded or started."""
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(
        "hosts:\n  lab: {address: localhost, transport: local, service_manager: process}\n"
    )
    moved = tmp_path / "moved.yaml"
    moved.write_text(
        f"name: moved\nextends: {PD / 'bad-start.yaml'}\nroles:\n  decode: {{host: gpu-02}}\n"
    )
    argv = ["--host", "lab", "--hosts", str(hosts), "--results", str(tmp_path / "r")]
    assert main(["run", str(moved), *argv]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "role decode runs on host 'gpu-02'" in err and "roles.decode.host" in err, err
    assert "moved.yaml" in err
    assert not (tmp_path / "r").exists()  # nothing recorded, nothing started


def test_an_interrupt_names_the_restore_of_every_host_of_a_deployment() -> None:
    """When the restore could not be read back, or left something on one host, the lines
    name `orchestrator restore --host H` for each host of the deployment concerned."""
    import argparse

    from orchestrator.cli.common import restore_lines

    args = argparse.Namespace(host="n0", hosts=None, deployment_hosts=["n0", "n1"])
    ok, lines = restore_lines(args, None)
    assert not ok
    text = " ".join(lines)
    assert "orchestrator restore --host n0" in text and "orchestrator restore --host n1" in text
    ok, lines = restore_lines(args, {"n0": [], "n1": ["lab-node1.service: still running"]})
    assert not ok
    assert lines[0] == "n0: restored (read back: as found)"
    assert lines[1].endswith("finish it with: orchestrator restore --host n1"), lines


def test_a_bisection_whose_bad_splits_its_roles_is_refused_before_any_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bad's roles split a flag they must agree on and neither config says to start it:
    bad can never be judged, so the bisection is refused before good's start is spent
    (exit 2, naming bad's file and `mismatched_roles`); with `mismatched_roles: start` the
    same pair goes on to the hosts."""
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(
        "hosts:\n  lab:\n    address: 127.0.0.1\n    port: 1\n    known_hosts: /dev/null\n"
        "    service_manager: process\n"
    )
    argv = ["--host", "lab", "--hosts", str(hosts), "--results", str(tmp_path / "r"), "--no-report"]
    good = str(PD / "good.yaml")
    assert main(["bisect", "--good", good, "--bad", str(PD / "bad.yaml"), *argv]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "bad.yaml: mismatched_roles: the bad config would never start" in err, err
    assert "decode: --page-size 64" in err and "mismatched_roles: start" in err, err
    assert not (tmp_path / "r").exists()  # nothing recorded, nothing started
    from orchestrator.cli.bisect import refuse_split_endpoints

    start = load_experiment(PD / "bad-start.yaml")
    refuse_split_endpoints(load_experiment(PD / "good.yaml"), start)  # goes on to the hosts


def test_two_roles_on_one_unit_of_one_host_are_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """decode given prefill's unit on the same host: each role's drop-in, start and
    restore would be the other's, so the config is refused (exit 2) naming the role's
    unit key, before anything is recorded or started."""
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(
        "hosts:\n  lab: {address: localhost, transport: local, service_manager: process}\n"
    )
    same = tmp_path / "same.yaml"
    same.write_text(
        f"name: same\nextends: {PD / 'good.yaml'}\n"
        "roles:\n  decode: {unit: lab-pd-prefill.service}\n"
    )
    argv = ["--host", "lab", "--hosts", str(hosts), "--results", str(tmp_path / "r")]
    assert main(["run", str(same), *argv]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "same.yaml: roles.decode.unit: roles prefill and decode would both run as" in err, err
    assert "lab-pd-prefill.service on lab" in err, err
    assert not (tmp_path / "r").exists()  # nothing recorded, nothing started


def test_a_pool_with_roles_that_name_their_hosts_is_refused_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pool runs a whole deployment on each of its hosts; a role fixed to one host
    cannot be on all of them: refused (exit 2) naming the file and the role's host key."""
    hosts = tmp_path / "hosts.yaml"
    local = "{address: localhost, transport: local, service_manager: process}"
    hosts.write_text(
        f"hosts:\n  a: {local}\n  b: {local}\n  gpu-02: {local}\npools:\n  ab: [a, b]\n"
    )
    moved = tmp_path / "moved.yaml"
    moved.write_text(
        f"name: moved\nextends: {PD / 'bad-start.yaml'}\nroles:\n  decode: {{host: gpu-02}}\n"
    )
    good = tmp_path / "good.yaml"
    good.write_text(f"name: g\nextends: {PD / 'good.yaml'}\nroles:\n  decode: {{host: gpu-02}}\n")
    argv = ["--host", "ab", "--hosts", str(hosts), "--results", str(tmp_path / "r")]
    assert main(["bisect", "--good", str(good), "--bad", str(moved), *argv]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "good.yaml: roles.decode.host: role decode names its host" in err, err
    assert "pool 'ab'" in err, err
    assert not (tmp_path / "r").exists()
