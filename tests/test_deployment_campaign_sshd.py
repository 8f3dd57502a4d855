"""A bisection of a deployment through the command line, on real hosts: two host names on
OpenSSH's sshd at 127.0.0.1, each role a detached lab server of its own.

(a) two nodes where one flag makes node-rank 1 crash in graph capture while rank 0 only
times out in its watchdog: answered with the flag, rank 1's crash and rank 1 named;
(c) the B300 incident's pair spread over two nodes gives the answer it gives on one.
After each campaign every role's service is as found on every host.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.store.store import Store
from tests.hosts.wait import wait_until
from tests.support.campaign_lab import (
    cli,
    cli_json,
    our_processes,
    popen_cli,
    read_runs,
    stop_child,
)
from tests.support.deployment_lab import PD_TP, pd_files, two_node_pair, two_sshd_hosts

pytestmark = pytest.mark.sshd


@pytest.fixture
def hosts(sshd: SshdEndpoint, tmp_path: Path) -> Iterator[Path]:
    path = two_sshd_hosts(sshd, tmp_path)
    yield path
    for name in ("n0", "n1"):
        for pid in our_processes(str(tmp_path / f"run-{name}")):
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except OSError:
                pass


def nothing_left(tmp_path: Path) -> None:
    """No server of ours runs and no launch script or pid file is left on either host."""
    for name in ("n0", "n1"):
        run = tmp_path / f"run-{name}"
        assert our_processes(str(run)) == []
        for svc in run.iterdir() if run.is_dir() else ():
            if svc.is_dir() and svc.name not in ("locks",):
                assert not (svc / "pid").exists() and not (svc / "launch.sh").exists(), svc


def host_records(results: Path, ids: list[str]) -> list[dict]:
    store = Store(results)
    try:
        return [store.host_record(i) or {} for i in ids]
    finally:
        store.close()


def bisect(hosts: Path, tmp_path: Path, good: Path, bad: Path) -> tuple[int, dict]:
    argv = ["bisect", "--good", good, "--bad", bad, "--host", "n0", "--hosts", hosts]
    return cli_json(*argv, "--results", tmp_path / "results", "--no-report")


def test_two_node_pair_names_the_flag_rank1s_crash_and_rank1(hosts: Path, tmp_path: Path) -> None:
    good, bad = two_node_pair(tmp_path)
    code, out = bisect(hosts, tmp_path, good, bad)
    assert code == 0, out
    assert out["status"] == "found"
    assert [c["flags"] for c in out["culprits"]] == [["--enable-nccl-nvls"]], out
    assert out["target"].startswith("cuda_graph: cublas: CUBLAS_STATUS_EXECUTION_FAILED")
    # every failing run names rank 1 on its host, never rank 0's watchdog timeout
    runs = read_runs(tmp_path / "results", out["campaign"])
    failed = [r for r in runs if r.verdict is Verdict.FAIL]
    assert failed and all(r.host == "n1" for r in failed)
    records = host_records(tmp_path / "results", [r.id for r in failed])
    for record in records:
        ff = record["first_failure"]
        assert ff["role"] == "node1" and ff["host"] == "n1", ff
        assert ff["describe"].startswith("node1 on n1: cuda_graph: cublas"), ff
        roles = {x["role"]: x for x in record["roles"]}
        assert roles["node0"]["host"] == "n0" and roles["node0"]["log_tail"]
    nothing_left(tmp_path)


def test_b300_over_two_nodes_gives_the_answer_it_gives_on_one(hosts: Path, tmp_path: Path) -> None:
    good, bad = two_node_pair(tmp_path, scenario="b300")
    code, out = bisect(hosts, tmp_path, good, bad)
    assert code == 0, out
    assert out["status"] == "found"
    # as on one node (tests/test_campaign_e2e.py): the pair together, ep-size alone a finding
    assert [sorted(c["flags"]) for c in out["culprits"]] == [
        ["--enable-nccl-nvls", "--ep-size 8"]
    ], out
    assert out["culprits"][0]["interacting"] is True
    assert out["target"].startswith("cuda_graph: cublas: CUBLAS_STATUS_EXECUTION_FAILED")
    finding = " ".join(str(f) for f in out["findings"])
    assert "AttributeError" in finding and "--ep-size" in finding, out["findings"]
    nothing_left(tmp_path)


def test_pd_split_refused_before_it_starts_unless_asked_then_the_decode_flag(
    hosts: Path, tmp_path: Path
) -> None:
    files = pd_files(tmp_path)
    code, out = bisect(hosts, tmp_path, files["good"], files["bad"])
    assert code == 2, out  # refused before any start: bad can never be judged
    text = str(out)
    assert "roles disagree" in text and "decode: --page-size 64" in text, out
    runs = read_runs(tmp_path / "results")
    # nothing of the refused config was started: its runs are invalid, never failed
    assert all(r.verdict is not Verdict.FAIL for r in runs), [(r.label, r.verdict) for r in runs]
    nothing_left(tmp_path)
    code, out = bisect(hosts, tmp_path, files["good"], files["bad-start"])
    assert code == 0, out
    assert out["status"] == "found"
    assert [c["deltas"] for c in out["culprits"]] == [["decode: ~ --page-size 16 -> 64"]], out
    nothing_left(tmp_path)


def test_pd_of_different_tp_sizes_names_prefills_crash_under_requests(
    hosts: Path, tmp_path: Path
) -> None:
    """Prefill of TP4 and decode of TP2 behind a router, a layout SGLang supports
    (sglang#5922): said as a warning, never refused. Bad's prefill crashes with
    "misaligned address" after 5 of the answers check's requests while the router answers
    502 for the prompts it can no longer take: the answer is prefill's flag, prefill's
    crash the target and prefill the role that failed first, never the router's 502s."""
    files = pd_files(tmp_path, pair=PD_TP)
    argv = ["bisect", "--good", files["good"], "--bad", files["bad"], "--host", "n0"]
    res = cli(*argv, "--hosts", hosts, "--results", tmp_path / "results", "--no-report")
    text = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 0, text
    assert "warning: " in text and "the roles differ on --tp-size" in text, text
    assert "sglang#5922" in text, text
    assert "culprit (single flag): prefill: --enable-mixed-chunk" in text, text
    assert "the target failure happens first on prefill on n0" in text, text
    runs = read_runs(tmp_path / "results")
    failed = [r for r in runs if r.verdict is Verdict.FAIL]
    assert failed, [(r.label, r.verdict, r.signature) for r in runs]
    for r in failed:
        assert r.signature is not None and "misaligned address" in r.signature.message, r
        assert r.signature.phase.value == "serving", r.signature
    records = host_records(tmp_path / "results", [r.id for r in failed])
    for record in records:
        ff = record["first_failure"]
        assert ff["role"] == "prefill" and ff["host"] == "n0", ff
        roles = {x["role"]: x for x in record["roles"]}
        assert roles["prefill"]["verdict"] == "fail", roles["prefill"]
        assert roles["router"]["verdict"] == "pass" and roles["decode"]["verdict"] == "pass"
    nothing_left(tmp_path)


HANG_SCENARIO = """
name: two-node-hang
startup: {init: 0.3, load_weights: 0.5, kv_cache: 0.2, cuda_graph: 0.6, warmup: 0.2}
known_flags: sglang
faults:
  - when: {node-rank: 1, enable-nccl-nvls: true}
    phase: cuda_graph
    effect: hang
"""


def hanging_pair(tmp_path: Path) -> tuple[Path, Path]:
    """The two-node pair where bad's rank 1 hangs in graph capture and rank 0 waits for
    it past the run's deadline: a campaign that is mid-run for as long as a test needs."""
    scenario = tmp_path / "hang.yaml"
    scenario.write_text(HANG_SCENARIO)
    good, bad = two_node_pair(tmp_path, watchdog=600)
    for path in (good, bad):
        doc = yaml.safe_load(path.read_text())
        doc["service"]["exec"] = f"python3 -m orchestrator.lab.server --scenario {scenario}"
        doc["health"]["timeout"] = "120s"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return good, bad


def wait_both_ranks_of_bad(tmp_path: Path, child: subprocess.Popen[bytes], log: Path) -> None:
    """Until both ranks of a bad variant (NVLS) run, each on its own host."""

    def up() -> bool | None:
        assert child.poll() is None, log.read_text()
        for node in ("0", "1"):
            svc = tmp_path / f"run-n{node}" / f"lab-node{node}.service"
            script = svc / "launch.sh"
            if not (script.is_file() and "enable-nccl-nvls" in script.read_text()):
                return None
            if not (svc / "pid").is_file():
                return None
        return True

    wait_until(up, timeout=180, interval=0.1, what="both ranks of bad", describe=log.read_text)
    time.sleep(1.0)  # the watch loop is polling both hosts


def test_ctrl_c_restores_every_host_of_the_deployment(hosts: Path, tmp_path: Path) -> None:
    good, bad = hanging_pair(tmp_path)
    log = tmp_path / "bisect.log"
    argv = ["bisect", "--good", good, "--bad", bad, "--host", "n0", "--hosts", hosts]
    child = popen_cli(*argv, "--results", tmp_path / "results", "--no-report", log=log)
    try:
        wait_both_ranks_of_bad(tmp_path, child, log)
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=120) == 130, log.read_text()
    finally:
        stop_child(child)
    out = " ".join(log.read_text().split())
    assert "interrupted" in out
    assert "the hosts were restored (read back: as found): n0, n1" in out, out
    assert "resume with: orchestrator bisect --resume" in out
    nothing_left(tmp_path)


def test_restore_after_kill_9_leaves_every_host_as_found(hosts: Path, tmp_path: Path) -> None:
    good, bad = hanging_pair(tmp_path)
    log = tmp_path / "bisect.log"
    argv = ["bisect", "--good", good, "--bad", bad, "--host", "n0", "--hosts", hosts]
    child = popen_cli(*argv, "--results", tmp_path / "results", "--no-report", log=log)
    try:
        wait_both_ranks_of_bad(tmp_path, child, log)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        stop_child(child)
    # the dead controller left both ranks running, each on its host
    assert our_processes(str(tmp_path / "run-n0")) and our_processes(str(tmp_path / "run-n1"))
    for name in ("n0", "n1"):
        res = cli("restore", "--host", name, "--hosts", hosts, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "read back: as found" in res.stdout, res.stdout
    nothing_left(tmp_path)


def test_run_starts_every_role_and_names_the_failing_one(hosts: Path, tmp_path: Path) -> None:
    _, bad = two_node_pair(tmp_path)
    argv = ["run", bad, "--host", "n0", "--hosts", hosts, "--results", tmp_path / "results"]
    code, out = cli_json(*argv)
    assert code == 0, out
    assert out["verdict"] == "fail" and out["host"] == "n1", out
    assert str(out["detail"]).startswith("node1 on n1: cuda_graph: cublas"), out
    nothing_left(tmp_path)
    # a rerun starts it again on the campaign's host, not the failing role's
    code, again = cli_json("rerun", out["run"], "--hosts", hosts, "--results", tmp_path / "results")
    assert code == 0, again
    assert again["verdict"] == "fail" and again["host"] == "n1", again
    assert str(again["detail"]).startswith("node1 on n1: cuda_graph: cublas"), again
    (record,) = host_records(tmp_path / "results", [again["run"]])
    assert [(r["role"], r["host"]) for r in record["roles"]] == [("node0", "n0"), ("node1", "n1")]
    nothing_left(tmp_path)


def test_two_roles_on_one_port_of_one_host_are_refused_not_host_trouble(
    hosts: Path, tmp_path: Path
) -> None:
    """Prefill and decode on one host, both told to listen on one port: the config's own
    clash, `invalid` before anything starts (the decode server would die binding it and
    the run would read as host trouble)."""
    good = pd_files(tmp_path, decode_host=None)["good"]
    doc = yaml.safe_load(good.read_text())
    doc["roles"]["decode"]["flags"]["port"] = doc["roles"]["prefill"]["flags"]["port"]
    good.write_text(yaml.safe_dump(doc, sort_keys=False))
    argv = ["run", good, "--host", "n0", "--hosts", hosts, "--results", tmp_path / "results"]
    code, out = cli_json(*argv)
    assert out["verdict"] == "invalid", out
    port = doc["roles"]["prefill"]["flags"]["port"]
    assert f"roles prefill and decode both listen on port {port} of n0" in out["detail"], out
    (record,) = host_records(tmp_path / "results", [out["run"]])
    # none started, each still named with its host and unit, for show, --role and reports
    assert [(r["role"], r["host"], r["verdict"]) for r in record["roles"]] == [
        ("router", "n0", "absent"),
        ("prefill", "n0", "absent"),
        ("decode", "n0", "absent"),
    ], record
    assert record["first_failure"] is None, record
    shown = cli("show", out["run"], "--role", "decode", "--results", tmp_path / "results")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    text = " ".join(shown.stdout.split())
    assert "decode [decode] on n0 (lab-pd-decode.service): absent" in text, text
    nothing_left(tmp_path)


def test_plan_host_asks_each_role_on_its_own_host(hosts: Path, tmp_path: Path) -> None:
    """`plan --host` of a deployment puts each role's own launch to the server on the
    role's host, as the bisection does: a misspelt flag of node1 (on n1) is refused by
    plan, not only once the campaign has begun."""
    good, bad = two_node_pair(tmp_path)
    doc = yaml.safe_load(bad.read_text())
    doc["roles"]["node1"]["flags"]["cuda-graph-max-bz"] = 8
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = cli("plan", "--good", good, "--bad", bad, "--host", "n0", "--hosts", hosts)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "role node1 on n1" in res.stderr and "--cuda-graph-max-bz" in res.stderr, res.stderr
    assert "roles.node1.flags" in res.stderr, res.stderr  # where the flag is, not service.flags
    doc["roles"]["node1"]["flags"].pop("cuda-graph-max-bz")
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = cli("plan", "--good", good, "--bad", bad, "--host", "n0", "--hosts", hosts)
    assert res.returncode == 0, res.stdout + res.stderr
    for name in ("n0", "n1"):  # both hosts asked, each named
        assert f"{name}: the server takes both configs' flags" in res.stdout, res.stdout
    nothing_left(tmp_path)


def test_sweep_runs_a_deployment_on_every_roles_host(hosts: Path, tmp_path: Path) -> None:
    """A sweep over a config with roles runs each config as the deployment (every role
    on its own host), as `run` does, instead of refusing it once the sweep is recorded."""
    good, _ = two_node_pair(tmp_path)
    sweep = tmp_path / "experiments" / "sweep.yaml"
    doc = {"name": "sweep-2n", "base": good.name, "matrix": {"max-running-requests": [128, 256]}}
    sweep.write_text(yaml.safe_dump(doc))
    code, out = cli_json(
        "sweep", sweep, "--host", "n0", "--hosts", hosts, "--results", tmp_path / "results"
    )
    assert code == 0, out
    runs = out["rows"]
    assert [r["verdict"] for r in runs] == ["pass", "pass"], out
    records = host_records(tmp_path / "results", [r["run"] for r in runs])
    for record in records:
        assert [(r["role"], r["host"]) for r in record["roles"]] == [
            ("node0", "n0"),
            ("node1", "n1"),
        ]
        assert "--max-running-requests" in str(record["roles"][1]["rendered"])
    nothing_left(tmp_path)


def test_a_run_carries_the_environment_of_the_host_that_names_it(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    """n1 has other GPUs and another driver than n0: a run that failed on node1 (host n1)
    is recorded with n1's environment, a run that passed (host n0, the health role's)
    with n0's; never one host's environment under the other's name."""
    hosts = two_sshd_hosts(sshd, tmp_path)
    gpus = tmp_path / "gpus-n1.json"
    gpus.write_text('{"name": "NVIDIA H200", "driver": "590.10.01"}')
    doc = yaml.safe_load(hosts.read_text())
    doc["hosts"]["n1"]["env"]["ORCH_LAB_GPUS"] = str(gpus)
    hosts.write_text(yaml.safe_dump(doc, sort_keys=False))
    good, bad = two_node_pair(tmp_path)
    results = tmp_path / "results"
    try:
        seen = {}
        for exp in (bad, good):
            code, out = cli_json("run", exp, "--host", "n0", "--hosts", hosts, "--results", results)
            assert code == 0, out
            code, shown = cli_json("show", out["run"], "--results", results)
            seen[out["host"]] = shown["environment"]
        assert set(seen) == {"n0", "n1"}, seen
        assert (seen["n1"]["gpu_model"], seen["n1"]["driver"]) == ("NVIDIA H200", "590.10.01")
        assert seen["n0"]["gpu_model"] == "NVIDIA B300 SXM6 AC", seen["n0"]
        nothing_left(tmp_path)
    finally:
        for name in ("n0", "n1"):
            for pid in our_processes(str(tmp_path / f"run-{name}")):
                try:
                    os.killpg(os.getpgid(pid), signal.SIGKILL)
                except OSError:
                    pass


def test_a_role_host_gone_for_good_stops_the_campaign_naming_its_restore(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    """n1 (node1's host) is reached through a forwarder of its own; once a run is
    recorded the forwarder is killed: the runs are `infra`, each saying under its line
    that n1 was lost, the campaign stops (exit 3) naming n1 (not n0, the host it runs the
    deployment on) with the command that checks the deployment's hosts and its resume
    command, n0 is restored and read back, and the output names n1 as not restored with
    the command that finishes it."""
    import sys

    from orchestrator.lab.sshd import free_port
    from tests.test_campaign_resume import recorded_count

    hosts = two_sshd_hosts(sshd, tmp_path)
    port = free_port()
    doc = yaml.safe_load(hosts.read_text())
    doc["hosts"]["n1"]["port"] = port
    known = tmp_path / "known_hosts_n1"
    line = Path(sshd.known_hosts).read_text().strip().split(" ", 1)[1]
    known.write_text(f"[127.0.0.1]:{port} {line}\n")
    doc["hosts"]["n1"]["known_hosts"] = str(known)
    hosts.write_text(yaml.safe_dump(doc, sort_keys=False))
    fwd = subprocess.Popen(
        [sys.executable, "-m", "tests.support.tcp_forward", str(port), str(sshd.port)],
        cwd=Path(__file__).resolve().parents[1],
    )
    good, bad = two_node_pair(tmp_path)
    results, log = tmp_path / "results", tmp_path / "bisect.log"
    argv = ["bisect", "--good", good, "--bad", bad, "--host", "n0", "--hosts", hosts]
    child = popen_cli(*argv, "--results", results, "--no-report", log=log)
    try:

        def one_run() -> tuple[str, int] | None:
            assert child.poll() is None, log.read_text()
            got = recorded_count(results)
            return got if got and got[1] >= 1 else None

        wait_until(one_run, timeout=120, interval=0.05, what="a run", describe=log.read_text)
        fwd.kill()
        code = child.wait(timeout=300)
    finally:
        stop_child(child)
        if fwd.poll() is None:
            fwd.kill()
        fwd.wait(timeout=30)
        for name in ("n0", "n1"):
            for pid in our_processes(str(tmp_path / f"run-{name}")):
                try:
                    os.killpg(os.getpgid(pid), signal.SIGKILL)
                except OSError:
                    pass
    text = log.read_text()
    out = " ".join(text.split())
    assert code == 3, out
    assert len(re.findall(r"host trouble on n1: \S", text)) == 3, text
    assert "host trouble on n0" not in out, out
    assert "3 runs in a row failed on host trouble; last on n1: " in out, out
    check = (
        f"check n1 with: orchestrator hosts check --experiment {os.path.abspath(good)} "
        f"--hosts {os.path.abspath(hosts)}; then resume with: "
    )
    assert check in out and "--resume" in out, out
    assert "n1 could not be restored or read back" in out, out
    assert "orchestrator restore --host n1" in out, out
    assert "Traceback" not in out, out
    assert not list((tmp_path / "run-n0" / "locks").iterdir())  # n0 restored, unlocked


def test_resume_after_ctrl_c_mid_run_reuses_only_judged_runs_and_answers(
    hosts: Path, tmp_path: Path
) -> None:
    """Ctrl-C while both ranks of a bad variant run: every host restored; `--resume`
    continues the same campaign, starts the interrupted variant again (it was never
    judged), judges each variant once, gives the answer, and leaves every host as found."""
    from tests.test_campaign_resume import recorded_count

    good, bad = two_node_pair(tmp_path)
    results, log = tmp_path / "results", tmp_path / "bisect.log"
    argv = ["bisect", "--good", good, "--bad", bad, "--host", "n0", "--hosts", hosts]
    child = popen_cli(*argv, "--results", results, "--no-report", log=log)
    try:
        wait_both_ranks_of_bad(tmp_path, child, log)
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=120) == 130, log.read_text()
    finally:
        stop_child(child)
    out = " ".join(log.read_text().split())
    assert "the hosts were restored (read back: as found): n0, n1" in out, out
    nothing_left(tmp_path)
    got = recorded_count(results)
    assert got is not None
    cid, before = got
    code, answer = cli_json(
        "bisect", "--resume", cid, "--hosts", hosts, "--results", results, "--no-report"
    )
    assert code == 0, answer
    assert answer["campaign"] == cid and answer["status"] == "found", answer
    assert [c["flags"] for c in answer["culprits"]] == [["--enable-nccl-nvls"]], answer
    runs = read_runs(results, cid)
    assert [r.seq for r in runs] == list(range(1, len(runs) + 1))
    judged = [r.variant for r in runs if r.verdict is not Verdict.INFRA]
    assert len(judged) == len(set(judged)), [(r.seq, r.variant, r.verdict) for r in runs]
    assert len(runs) > before and all(r.cached_from is None for r in runs)
    nothing_left(tmp_path)
