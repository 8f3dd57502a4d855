"""A deployment of node ranks as one Slurm job over its nodes (`--nodes N`, one task each).

The pure part: the sbatch words and the job script of two ranks, whose `ranks.sh` is run
by bash as each task would run it (the command lines it starts are read back word for
word); a deployment of other roles, and one asking for a private network, refused. On the
single-node lab cluster (Slurm 22.05, this machine as its login node): a job of one rank
runs the lab server through `srun` and is judged from that rank's own log, and a job of
two ranks is refused before it is submitted, naming the one node the cluster has.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.config.hosts import SlurmOptions, load_inventory
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.first_failure import RoleResult, first_failure
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.errors import ConfigError, SchedulerError
from orchestrator.execution.backends import executor_for
from orchestrator.execution.slurm import facts, jobscript, multinode
from orchestrator.execution.slurm.multinode import deployment_record, rank_results
from orchestrator.lab import slurmlab
from orchestrator.lab.slurmlab import SlurmCluster
from orchestrator.lab.sshd import free_port
from orchestrator.store.store import Store
from tests.hosts.slurm import local_slurm_hosts_file
from tests.hosts.wait import wait_until
from tests.support.campaign_lab import LAB
from tests.support.deployment_runs import record_campaign

TWO = """\
name: two-nodes
service:
  exec: echo
  flags: {model-path: /m, tp-size: 16, nnodes: 2, dist-init-addr: "10.0.0.1:5757", port: 30000}
  env: {NCCL_DEBUG: WARN}
roles:
  node1:
    kind: node
    rank: 1
    flags: {node-rank: 1, cuda-graph-max-bs: 512, served-model-name: "it's $(x)"}
    env: {ONLY_ON_1: "a b"}
  node0: {kind: node, rank: 0, flags: {node-rank: 0}}
"""


def _write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text)
    return path


def _ranks_sh(script: str) -> str:
    """The ranks script the job script writes (its here-document)."""
    m = re.search(rf"<<'{multinode.RANKS_EOF}'\n(.*?)\n{multinode.RANKS_EOF}\n", script, flags=re.S)
    assert m, script
    return m[1] + "\n"


def test_two_ranks_are_one_job_of_two_nodes_one_task_each(tmp_path: Path) -> None:
    exp = load_experiment(_write(tmp_path, "two.yaml", TWO))
    files = jobscript.JobFiles("/shared/runs/c1/c1.3")
    opts = SlurmOptions(partition="gpu", gres="gpu:8")
    argv = jobscript.sbatch_argv(exp, opts, files, campaign="c1", run_id="c1.3", controller="x")
    assert "--nodes=2" in argv and "--ntasks=2" in argv and "--ntasks-per-node=1" in argv
    assert "--gres=gpu:8" in argv  # per node
    script = jobscript.render(exp, files, run_id="c1.3", campaign="c1")
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    [srun] = [x for x in script.splitlines() if x.startswith("setsid srun")]
    assert "--nodes=2 --ntasks=2 --ntasks-per-node=1" in srun
    assert '--output="$D/rank-%n.log" bash "$D/ranks.sh"' in srun
    assert 'ln -sf rank-0.log "$D/server.log"' in script  # rank 0's is the polled one
    assert "URL=http://127.0.0.1:30000/health" in script
    # each task starts its rank's launch: run ranks.sh as a task of node 0 and of node 1
    ranks = _write(tmp_path, "ranks.sh", _ranks_sh(script))
    assert subprocess.run(["bash", "-n", str(ranks)]).returncode == 0

    def task(node: int) -> list[str]:
        r = subprocess.run(
            ["bash", str(ranks)],
            env={"PATH": "/usr/bin:/bin", "SLURM_NODEID": str(node), "ORCH_HEAD": "10.9.8.7"},
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    rank0, rank1 = task(0), task(1)
    for node, words in ((0, rank0), (1, rank1)):
        at = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
        assert at["--node-rank"] == str(node)
        assert at["--nnodes"] == "2"
        assert at["--dist-init-addr"] == "10.9.8.7:5757"  # the first node, the config's port
        assert at["--model-path"] == "/m" and at["--port"] == "30000"
    assert "--cuda-graph-max-bs" in rank1 and "--cuda-graph-max-bs" not in rank0
    assert "it's $(x)" in " ".join(rank1)  # one word, never run
    # a rank's own environment reaches only that rank
    envs = subprocess.run(
        ["bash", "-c", f"sed 's/; echo /; env; : /' {ranks} > {ranks}.env"], check=True
    )
    assert envs.returncode == 0
    got = subprocess.run(
        ["bash", f"{ranks}.env"],
        env={"PATH": "/usr/bin:/bin", "SLURM_NODEID": "1", "ORCH_HEAD": "h"},
        capture_output=True,
        text=True,
    ).stdout
    assert "ONLY_ON_1=a b" in got and "NCCL_DEBUG=WARN" in got
    r = subprocess.run(
        ["bash", str(ranks)],
        env={"PATH": "/usr/bin:/bin", "SLURM_NODEID": "2"},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "no node rank 2 in this deployment" in r.stderr


def test_a_missing_init_address_takes_the_first_node_and_the_default_port(tmp_path: Path) -> None:
    text = TWO.replace(', dist-init-addr: "10.0.0.1:5757"', "")
    exp = load_experiment(_write(tmp_path, "two.yaml", text))
    script = jobscript.render(exp, jobscript.JobFiles("/d"), run_id="r", campaign="c")
    assert f'--dist-init-addr "$ORCH_HEAD":{multinode.DEFAULT_INIT_PORT}' in script


def test_other_roles_and_a_private_network_are_refused(tmp_path: Path) -> None:
    pd = """\
name: pd
service:
  exec: python3 -m sglang.launch_server
  flags: {model-path: /m, port: 30000}
roles:
  prefill: {flags: {port: 30001}}
  decode: {flags: {port: 30002}}
"""
    exp = load_experiment(_write(tmp_path, "pd.yaml", pd))
    with pytest.raises(ConfigError) as err:
        jobscript.render(exp, jobscript.JobFiles("/d"), run_id="r", campaign="c")
    assert "node ranks only" in str(err.value) and "prefill, decode" in str(err.value)
    exp = load_experiment(_write(tmp_path, "two.yaml", TWO))
    with pytest.raises(ConfigError) as err:
        jobscript.render(
            exp, jobscript.JobFiles("/d"), run_id="r", campaign="c", private_network=True
        )
    assert "private_network" in str(err.value) and err.value.key == "roles"


def test_sinfo_nodes_and_the_lines_slurmstepd_writes_into_a_rank_log() -> None:
    text = "node1|idle\nnode2|drain*\nnode3|mix\nnode1|idle\n"
    assert facts.parse_sinfo_nodes(text) == {"node1": "idle", "node2": "drain", "node3": "mix"}
    log = (
        "[2026-01-01 00:00:00] The server is fired up and ready to roll!\n"
        "slurmstepd: error: *** STEP 12.0 ON vm CANCELLED AT 2026-01-01T00:00:05 ***\n"
        "slurmstepd-vm: error: *** JOB 12 ON vm CANCELLED AT 2026-01-01T00:00:06 DUE TO "
        "TIME LIMIT ***\n"
        "RuntimeError: slurmstepd: error: *** STEP quoted by the server is the server's\n"
    )
    assert facts.server_lines(log).splitlines() == [
        "[2026-01-01 00:00:00] The server is fired up and ready to roll!",
        "RuntimeError: slurmstepd: error: *** STEP quoted by the server is the server's",
    ]


def test_show_and_the_issue_give_each_rank_the_command_line_its_task_ran(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Slurm job replaces the config's `--dist-init-addr` host with the first node's
    address and gives each rank its node rank: the record holds each rank's command line
    as its task ran it, and `show` and `report --issue` give that one, not the config's."""
    monkeypatch.setenv("COLUMNS", "300")
    exp = load_experiment(_write(tmp_path, "two.yaml", TWO.replace("{node-rank: 0}", "{}")))
    ranks = multinode.node_roles(exp)
    roles = [(RoleResult(r.name, "n"), "") for r in ranks]
    record = deployment_record(ranks, roles, None, exp, {"job": "7"}, head="10.9.8.7")
    argv = {r["role"]: r["argv"] for r in record["roles"]}  # type: ignore[union-attr]
    for k, name in enumerate(("node0", "node1")):
        at = {w: argv[name][i + 1] for i, w in enumerate(argv[name][:-1]) if w.startswith("--")}
        assert at["--dist-init-addr"] == "10.9.8.7:5757" and at["--node-rank"] == str(k)
        assert at["--nnodes"] == "2"
    unknown = deployment_record(ranks, roles, None, exp, {})["roles"]  # no head: the config's
    assert unknown[0]["argv"] is None  # type: ignore[index]
    # recorded runs whose roles carry the command lines their tasks ran
    rec = record_campaign(tmp_path / "pair")
    db = sqlite3.connect(rec.results / "orchestrator.db")
    for run_id, text in db.execute("SELECT run_id, record FROM run_host").fetchall():
        got = json.loads(text)
        for role in got["roles"]:
            role["argv"] = ["sglang", "--dist-init-addr", "10.9.8.7:5000", "--ran-as", role["role"]]
        db.execute("UPDATE run_host SET record=? WHERE run_id=?", (json.dumps(got), run_id))
    db.commit()
    db.close()
    capsys.readouterr()
    assert main(["show", rec.runs["bad"], "--results", str(rec.results)]) == 0
    lines = [x.strip() for x in capsys.readouterr().out.splitlines()]
    assert "command: sglang --dist-init-addr 10.9.8.7:5000 --ran-as node1" in lines, lines
    assert main(["report", rec.campaign, "--issue", "--results", str(rec.results)]) == 0
    out = capsys.readouterr().out
    n1 = out.split("node1 (node rank 1) on b300-02:")[1].split("```")[1]
    assert "--ran-as node1" in n1 and "10.9.8.7:5000" in n1, n1


def test_a_deployment_a_cluster_cannot_run_is_refused_before_any_campaign(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Prefill/decode/router roles, or node ranks on a cluster whose jobs each get a private
    network, cannot be one job over the nodes: `bisect` says so naming the config's
    `roles` before a campaign is recorded (not after, in some other words)."""
    hosts = _write(
        tmp_path,
        "hosts.yaml",
        "hosts:\n  c:\n    address: localhost\n    transport: local\n"
        "    service_manager: slurm\n    run_dir: /nonexistent/jobs\n"
        "    slurm: {partition: gpu, private_network: PRIVATE}\n",
    )
    pd = LAB / "pd-page-size"
    two = LAB / "two-node"
    for private, good, bad, said in (
        ("false", pd / "good.yaml", pd / "bad-start.yaml", "node ranks only"),
        ("true", two / "good.yaml", two / "bad.yaml", "slurm.private_network"),
    ):
        hosts.write_text(
            hosts.read_text()
            .replace("PRIVATE", private)
            .replace("private_network: false", f"private_network: {private}")
        )
        results = tmp_path / f"results-{private}"
        capsys.readouterr()
        code = main(
            ["bisect", "--good", str(good), "--bad", str(bad), "--host", "c"]
            + ["--hosts", str(hosts), "--results", str(results)]
        )
        err = capsys.readouterr().err
        assert code == 2, err
        assert f"{good}: roles: " in err and said in err, err
        store = Store(results)
        try:
            assert store.campaigns() == [], "a campaign was recorded"
        finally:
            store.close()


# ---------------------------------------------------------------------------- the cluster


def _one_rank(tmp: Path, *, ranks: int = 1, extra: dict | None = None) -> Path:
    scenario = LAB / "b300" / "scenario.yaml"
    roles = {
        f"node{k}": {"kind": "node", "rank": k, "flags": {"node-rank": k}} for k in range(ranks)
    }
    data = {
        "name": f"lab-{ranks}-nodes",
        "extends": str(LAB / "b300" / "good.yaml"),
        "service": {
            "exec": f"python3 -m orchestrator.lab.server --scenario {scenario}",
            "flags": {
                "nnodes": ranks,
                "dist-init-addr": f"127.0.0.1:{free_port()}",
                "port": free_port(),
                **(extra or {}),
            },
        },
        "health": {"timeout": "120s", "settle": "0.1s"},
        "roles": roles,
    }
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f"lab-{ranks}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_job_of_one_rank_runs_on_the_lab_cluster(
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "300")  # `show`'s lines unclipped
    hosts = local_slurm_hosts_file(slurm_cluster, tmp_path, private_network=False, max_jobs=1)
    host = load_inventory(hosts).host("lab-slurm")
    exp = load_experiment(_one_rank(tmp_path))
    bad = load_experiment(_one_rank(tmp_path / "bad", extra={"ep-size": 8}))
    with executor_for(host, service="lab-nodes", campaign="nodes1") as ex:
        result = ex.run(exp, run_id="nodes1.1", label="one rank")
        failed = ex.run(bad, run_id="nodes1.2", label="one rank, ep-size 8")
    assert result.verdict is Verdict.PASS, (result.verdict, result.detail, result.log_tail)
    rec = result.host_record
    assert rec is not None and rec["manager"] == "deployment"
    assert rec["slurm"]["state"] == "COMPLETED" and "--nodes=1" in rec["slurm"]["sbatch"]
    [role] = rec["roles"]
    assert role["role"] == "node0" and role["host"] == slurm_cluster.node
    assert role["verdict"] == "pass", rec
    assert rec["first_failure"] is None, rec
    assert '--node-rank "$SLURM_NODEID"' in role["command"]
    assert "ranks.sh" in (result.rendered or "")
    # a crash of the rank is judged from the rank's own log, and named with its node
    assert failed.verdict is Verdict.FAIL, (failed.verdict, failed.detail, failed.log_tail)
    assert failed.signature is not None and failed.signature.phase.value == "init"
    first = failed.host_record["first_failure"]  # type: ignore[index]
    assert first["role"] == "node0" and first["host"] == slurm_cluster.node
    assert failed.detail.startswith(f"node0 on {slurm_cluster.node}: init: ")
    assert "AttributeError" in failed.host_record["roles"][0]["log_tail"]  # type: ignore[index]
    left = slurm_cluster.client("squeue", "-h", "-o", "%i")
    assert left.stdout.strip() == ""
    # recorded, `show` names the rank, its node and the job
    store = Store(tmp_path / "results")
    try:
        cid = store.create_campaign(kind="run", key="k", command="test", spec={})
        run_id = store.add_run(cid, variant=(), purpose="run", result=failed)
    finally:
        store.close()
    capsys.readouterr()
    assert main(["show", run_id, "--results", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert f"node0 [node rank 0] on {slurm_cluster.node}: fail: init: " in out, out
    assert f"failed first: node0 on {slurm_cluster.node}: init: " in out, out
    assert "on the cluster (lab-slurm): job " in out, out


def test_a_job_of_more_ranks_than_nodes_is_refused_naming_the_nodes(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    hosts = local_slurm_hosts_file(slurm_cluster, tmp_path, private_network=False, max_jobs=1)
    host = load_inventory(hosts).host("lab-slurm")
    exp = load_experiment(_one_rank(tmp_path, ranks=2))
    with executor_for(host, service="lab-nodes", campaign="nodes2") as ex:
        with pytest.raises(SchedulerError) as err:
            ex.run(exp, run_id="nodes2.1", label="two ranks")
    said = str(err.value)
    assert "deployment lab-2-nodes needs 2 nodes, one per node rank" in said, said
    assert f"has 1 that take jobs: {slurm_cluster.node} (" in said, said
    left = slurm_cluster.client("squeue", "-h", "-o", "%i")
    assert left.stdout.strip() == ""  # nothing was submitted


@pytest.mark.parametrize(
    ("case", "failing", "waiting"),
    [("rank1_cublas", "node1", "node0"), ("rank0_oom", "node0", "node1")],
)
def test_a_job_of_two_ranks_is_judged_by_the_rank_that_failed_first(
    tmp_path: Path, case: str, failing: str, waiting: str
) -> None:
    """The lab's recorded two-rank logs, as the job's rank logs come back (with the line
    slurmstepd adds when the step ends): the first failure is the failing rank's, on its
    node, the other rank a consequence; whatever order the ranks are read in."""
    exp = load_experiment(_write(tmp_path, "two.yaml", TWO))
    ranks = multinode.node_roles(exp)
    stepd = "slurmstepd: error: *** STEP 7.0 ON n2 CANCELLED AT 2026-12-04T21:46:00 ***\n"
    data = Path(__file__).parent / "data" / "multinode"
    out = {f"rank-{k}": (data / f"{case}.rank{k}.log").read_text() + stepd for k in (0, 1)}
    result = {"rank_nodes": "n1,n2"}
    roles = rank_results(ranks, out, result, 2026)
    for order in (roles, list(reversed(roles))):
        first = first_failure([r for r, _ in order])
        assert first is not None and first.role == failing
        assert first.host == ("n2" if failing == "node1" else "n1")
        assert not first.consequence
        assert first.describe().endswith(f"{waiting} then timed out in a collective")
    record = deployment_record(ranks, roles, first, exp, {"manager": "slurm", "job": "7"})
    by_role = {r["role"]: r for r in record["roles"]}  # type: ignore[union-attr]
    assert by_role[failing]["verdict"] == "fail" and by_role[waiting]["verdict"] == "timeout"
    assert record["first_failure"]["role"] == failing  # type: ignore[index]
    assert "slurmstepd" not in by_role[failing]["log_tail"]
    assert [r["rank"] for r in record["roles"]] == [0, 1]  # type: ignore[union-attr]


def test_run_of_a_deployment_on_a_cluster_is_one_job_of_its_ranks(
    slurm_cluster: SlurmCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`orchestrator run` of a config with node roles on a Slurm host goes to the cluster's
    executor (one job over its nodes), not to one unit per role on SSH hosts."""
    hosts = local_slurm_hosts_file(slurm_cluster, tmp_path, private_network=False, max_jobs=1)
    config = _one_rank(tmp_path)
    got = _run_json(config, hosts, tmp_path / "results", capsys)
    text = json.dumps(got)
    assert got["verdict"] == "pass", got
    [role] = got["deployment"]["roles"]
    assert role["role"] == "node0" and role["host"] == slurm_cluster.node, text
    left = slurm_cluster.client("squeue", "-h", "-o", "%i")
    assert left.stdout.strip() == ""


def test_a_rank_that_hangs_silently_is_the_failure_not_the_watchdog_it_caused(
    tmp_path: Path,
) -> None:
    """Rank 1 stops logging in graph capture and never ends; rank 0 waits for it until its
    NCCL watchdog ends it: the job stops rank 1 (no exit of its own). Rank 1's silent hang
    is the run's failure, as on SSH hosts, not rank 0's watchdog; whatever the order."""
    exp = load_experiment(_write(tmp_path, "two.yaml", TWO))
    ranks = multinode.node_roles(exp)
    data = Path(__file__).parent / "data" / "multinode"
    hung = "".join((data / "rank1_cublas.rank1.log").read_text().splitlines(True)[:16])
    out = {"rank-0": (data / "rank1_cublas.rank0.log").read_text(), "rank-1": hung}
    result = {"rank_nodes": "n1,n2", "state": "dead", "rank_exit_0": "134 1796444170.5"}
    roles = rank_results(ranks, out, result, 2026)
    for order in (roles, list(reversed(roles))):
        first = first_failure([r for r, _ in order])
        assert first is not None and first.role == "node1" and first.host == "n2", first
        assert first.signature.error_class == "hang", first.signature
        assert first.signature.phase.value == "cuda_graph", first.signature
        assert "node0 then timed out in a collective" in first.describe()
    record = deployment_record(ranks, roles, first, exp, {"manager": "slurm", "job": "7"})
    by_role = {r["role"]: r for r in record["roles"]}  # type: ignore[union-attr]
    assert by_role["node1"]["verdict"] == "fail" and by_role["node0"]["verdict"] == "timeout"
    # a rank that ended with a bare exit status and no line of its own is a failure too
    result = {"rank_nodes": "n1,n2", "state": "dead", "rank_exit_1": "1 1796444170.5"}
    roles = rank_results(ranks, {"rank-0": hung, "rank-1": hung}, result, 2026)
    first = first_failure([r for r, _ in roles])
    assert first is not None and first.role == "node1", first
    assert first.signature.message == "exit status 1", first.signature


def test_each_rank_leaves_its_own_end_and_the_job_stops_the_others_after_a_grace(
    tmp_path: Path,
) -> None:
    """`ranks.sh` leaves `rank-K.exit` (status, time) when the rank's server ends on its
    own; the job script stops every rank a grace after the first such end and notes the
    ends it saw before it stopped anything."""
    exp = load_experiment(_write(tmp_path, "two.yaml", TWO.replace("exec: echo", "exec: 'false'")))
    script = jobscript.render(exp, jobscript.JobFiles(str(tmp_path)), run_id="r", campaign="c")
    ranks = _write(tmp_path, "ranks.sh", _ranks_sh(script))
    r = subprocess.run(
        ["bash", str(ranks)],
        env={"PATH": "/usr/bin:/bin", "SLURM_NODEID": "1", "ORCH_HEAD": "h"},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1, r.stderr
    code, when = (tmp_path / "rank-1.exit").read_text().split()
    assert code == "1" and float(when) > 0
    assert not (tmp_path / "rank-0.exit").exists()
    loop = script[script.index("while :; do") : script.index("done\nres state")]
    assert "if rank_ended; then" in loop and "ranks_seen; stop_server; died; break" in loop
    assert f"seq {multinode.DEATH_GRACE_S * 10}" in loop
    assert "ranks_seen; if alive; then stop_server; fi" in script
    single = load_experiment(LAB / "b300" / "good.yaml")
    assert "rank_ended" not in jobscript.render(
        single, jobscript.JobFiles("/d"), run_id="r", campaign="c"
    )


def test_hosts_check_of_a_deployment_says_the_cluster_lacks_its_nodes(
    slurm_cluster: SlurmCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hosts check --experiment` fails, before any campaign, the job a run would refuse:
    more node ranks than the partition has nodes, or roles that are not node ranks."""
    hosts = local_slurm_hosts_file(slurm_cluster, tmp_path, private_network=False, max_jobs=1)
    two = _one_rank(tmp_path, ranks=2)
    capsys.readouterr()
    argv = ["hosts", "check", "lab-slurm", "--hosts", str(hosts), "--json", "--experiment"]
    assert main([*argv, str(two)]) == 3
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["lab-slurm"]}
    assert checks["nodes"]["ok"] is False, checks
    assert "needs 2 nodes, one per node rank" in checks["nodes"]["detail"], checks
    assert f"{slurm_cluster.node} (" in checks["nodes"]["detail"], checks
    assert main([*argv, str(_one_rank(tmp_path / "one"))]) == 0
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["lab-slurm"]}
    assert checks["nodes"]["ok"] is True, checks
    pd = _write(
        tmp_path,
        "pd.yaml",
        "name: pd\nservice: {exec: python3 -m sglang.launch_server, flags: {port: 30000}}\n"
        "roles:\n  prefill: {flags: {port: 30001}}\n  decode: {flags: {port: 30002}}\n",
    )
    assert main([*argv, str(pd)]) == 3
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["lab-slurm"]}
    assert checks["deployment"]["ok"] is False, checks
    assert "node ranks only" in checks["deployment"]["detail"], checks


def _two_node(tmp: Path, name: str, flags: dict) -> Path:
    """The lab's two-node pair (good) with `flags`, under a scenario where node-rank 0 runs
    out of memory with `ep-size 8` and node-rank 1 hangs silently in graph capture at batch
    size 512; every port its own."""
    scen = yaml.safe_load((LAB / "two-node" / "scenario.yaml").read_text())
    scen["faults"] = [
        {
            "when": {"node-rank": 0, "ep-size": 8},
            "phase": "kv_cache",
            "error": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        },
        {
            "when": {"node-rank": 1, "cuda-graph-max-bs": 512},
            "phase": "cuda_graph",
            "effect": "hang",
        },
    ]
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "scenario.yaml").write_text(yaml.safe_dump(scen, sort_keys=False))
    data = {
        "name": name,
        "extends": str(LAB / "two-node" / "good.yaml"),
        "service": {
            "exec": f"python3 -m orchestrator.lab.server --scenario {tmp / 'scenario.yaml'}",
            "flags": {"dist-init-addr": f"127.0.0.1:{free_port()}", "dist-timeout": 2, **flags},
        },
        "roles": {
            "node0": {"flags": {"port": free_port()}},
            "node1": {"flags": {"port": free_port()}},
        },
        "health": {"timeout": "60s", "settle": "0.1s"},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("flags", "failing", "waiting", "error_class"),
    [
        ({"cuda-graph-max-bs": 512}, "node1", "node0", "hang"),
        ({"ep-size": 8}, "node0", "node1", "cuda_oom"),
    ],
)
def test_a_job_over_two_nodes_names_the_rank_that_failed_first_and_leaves_nothing(
    slurm_cluster2: SlurmCluster,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: dict,
    failing: str,
    waiting: str,
    error_class: str,
) -> None:
    """On a cluster of two nodes: node-rank 1 hangs silently while rank 0's watchdog ends
    it, or rank 0 runs out of memory while rank 1 waits. The run is the failing rank's, on
    its node; the job stops the other rank once one ended (never at the health deadline);
    no job and no server is left."""
    hosts = local_slurm_hosts_file(slurm_cluster2, tmp_path, private_network=False, max_jobs=1)
    config = _two_node(tmp_path / "cfg", f"two-{error_class}", flags)
    got = _run_json(config, hosts, tmp_path / "results", capsys)
    nodes = slurm_cluster2.node_names()
    where = {"node0": nodes[0], "node1": nodes[1]}
    assert got["verdict"] == "fail", got
    assert got["signature"].split(": ")[1] == error_class, got
    first = got["deployment"]["first_failure"]
    assert first["role"] == failing and first["host"] == where[failing], first
    assert first["describe"].endswith(f"{waiting} then timed out in a collective"), first
    assert "not ready after" not in got["detail"], got["detail"]
    by_role = {r["role"]: r for r in got["deployment"]["roles"]}
    assert by_role[failing]["verdict"] == "fail" and by_role[waiting]["verdict"] == "timeout"
    assert {r["host"] for r in by_role.values()} == set(nodes)
    assert slurm_cluster2.client("squeue", "-h", "-o", "%i").stdout.strip() == ""
    assert _no_job_processes(slurm_cluster2)
    if failing != "node1":
        return
    # `rerun` says where each run failed first, and every role of the new one
    code = main(
        ["rerun", got["run"], "--hosts", str(hosts), "--results", str(tmp_path / "results")]
    )
    lines = [x.strip() for x in capsys.readouterr().out.splitlines()]
    assert code == 0, lines
    said = [x for x in lines if x.startswith(("recorded run", "rerun "))]
    assert len(said) == 2 and all("failed first: node1 on " in x for x in said), lines
    assert "same verdict and signature" in lines, lines
    assert any(x.startswith("node0 [node rank 0] on ") and ": timeout: " in x for x in lines)
    # `show` names the job's nodes, and the command line each rank's task ran
    assert main(["show", got["run"], "--results", str(tmp_path / "results")]) == 0
    shown = capsys.readouterr().out
    assert f" on nodes {nodes[0]},{nodes[1]}, ended " in shown, shown
    assert "--node-rank 1 --port" in shown and "$SLURM_NODEID" not in shown, shown
    assert slurm_cluster2.client("squeue", "-h", "-o", "%i").stdout.strip() == ""


def test_ranks_that_disagree_on_what_they_must_share_are_never_submitted(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """A launch whose ranks split a flag they must agree on (here `--nnodes 3` for a
    deployment of two ranks, which the job would quietly replace by 2) is `invalid` with
    the reason, as on SSH hosts, before anything is submitted; unless the campaign starts
    such launches anyway (then it goes on to the job, here refused for its nodes)."""
    hosts = local_slurm_hosts_file(slurm_cluster, tmp_path, private_network=False, max_jobs=1)
    host = load_inventory(hosts).host("lab-slurm")
    exp = load_experiment(_one_rank(tmp_path, ranks=2, extra={"nnodes": 3}))
    with executor_for(host, service="lab-nodes", campaign="split") as ex:
        result = ex.run(exp, run_id="split.1", label="nnodes 3 for two ranks")
    assert result.verdict is Verdict.INVALID, (result.verdict, result.detail)
    assert "roles disagree" in result.detail and "--nnodes 3" in result.detail, result.detail
    assert not (tmp_path / "jobs" / "split" / "split.1" / "job.sh").exists()
    assert slurm_cluster.client("squeue", "-h", "-o", "%i").stdout.strip() == ""
    with executor_for(host, service="lab-nodes", campaign="split", start_mismatched=True) as ex:
        with pytest.raises(SchedulerError):
            ex.run(exp, run_id="split.2", label="started anyway")


def test_a_rank_that_ends_while_rank_0_serves_is_a_failure_of_the_run(tmp_path: Path) -> None:
    """Rank 0 became ready, but node-rank 1's server ended on its own before the job
    stopped the ranks: the run failed on node1, in serving. What a rank logs only as the
    job stops it after serving stays no failure."""
    exp = load_experiment(_write(tmp_path, "two.yaml", TWO))
    ranks = multinode.node_roles(exp)
    crash = (
        "[2026-12-05 04:44:25 TP8] The server is fired up and ready to roll!\n"
        "[2026-12-05 04:44:27 TP8] Scheduler hit an exception: Traceback (most recent call "
        "last):\nRuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    fine = "[2026-12-05 04:44:25 TP0] The server is fired up and ready to roll!\n"
    result = {"rank_nodes": "n1,n2", "state": "ready", "rank_exit_1": "1 1796445867.5"}
    roles = rank_results(ranks, {"rank-0": fine, "rank-1": crash}, result, 2026)
    first = first_failure([r for r, _ in roles])
    assert first is not None and first.role == "node1" and first.host == "n2", first
    assert first.signature.phase.value == "serving", first.signature
    # the same lines, logged by a rank the job stopped after serving: no end of its own
    stopped = {"rank_nodes": "n1,n2", "state": "ready"}
    roles = rank_results(ranks, {"rank-0": fine, "rank-1": crash}, stopped, 2026)
    assert first_failure([r for r, _ in roles]) is None


def test_a_rank_that_dies_behind_a_serving_rank_0_fails_the_run_on_two_nodes(
    slurm_cluster2: SlurmCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rank 0 is ready and keeps answering (its watchdog is long); node-rank 1's server is
    killed 4 s after it started and its task ends with a CUDA error: the run fails on
    node1, in serving, not `pass` because rank 0 still answers."""
    hosts = local_slurm_hosts_file(slurm_cluster2, tmp_path, private_network=False, max_jobs=1)
    rank1 = (
        'bash -c \'python3 -m orchestrator.lab.server --scenario two-node "$@" & p=$!; '
        'sleep 4; kill -9 $p; echo "RuntimeError: CUDA error: an illegal memory access was '
        "encountered\"; exit 1' rank1"
    )
    config = _write(
        tmp_path,
        "late.yaml",
        yaml.safe_dump(
            {
                "name": "late",
                "extends": str(LAB / "two-node" / "good.yaml"),
                "service": {
                    "flags": {"dist-init-addr": f"127.0.0.1:{free_port()}", "dist-timeout": 60}
                },
                "roles": {
                    "node0": {"flags": {"port": free_port()}},
                    "node1": {"exec": rank1, "flags": {"port": free_port()}},
                },
                "health": {"timeout": "30s", "settle": "6s"},
            },
            sort_keys=False,
        ),
    )
    got = _run_json(config, hosts, tmp_path / "results", capsys)
    assert got["verdict"] == "fail", got
    assert got["signature"].startswith("serving: illegal_address"), got
    assert got["deployment"]["first_failure"]["role"] == "node1", got
    assert slurm_cluster2.client("squeue", "-h", "-o", "%i").stdout.strip() == ""
    assert _no_job_processes(slurm_cluster2)


def test_plan_on_a_cluster_says_a_deployment_needs_more_nodes_than_it_has(
    slurm_cluster: SlurmCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`plan --host` asks what a bisection would: the job of two ranks on the one-node lab
    cluster could never run, and plan says so (exit 3, naming the nodes it has)."""
    hosts = local_slurm_hosts_file(slurm_cluster, tmp_path, private_network=False, max_jobs=1)
    good = _one_rank(tmp_path, ranks=2)
    bad = _one_rank(tmp_path / "bad", ranks=2, extra={"ep-size": 8})
    capsys.readouterr()
    code = main(
        ["plan", "--good", str(good), "--bad", str(bad), "--host", "lab-slurm"]
        + ["--hosts", str(hosts)]
    )
    err = capsys.readouterr().err
    assert code == 3, err
    assert "needs 2 nodes, one per node rank" in err and f"{slurm_cluster.node} (" in err, err
    assert slurm_cluster.client("squeue", "-h", "-o", "%i").stdout.strip() == ""


def _no_job_processes(cluster: SlurmCluster) -> bool:
    """No process of the cluster's jobs is left: slurmd ends a cancelled job's processes
    after its KillWait, which a loaded machine can stretch; waited for, bounded."""
    return (
        wait_until(
            lambda: not slurmlab.job_processes(cluster.conf) or None,
            timeout=240,
            what="the jobs' processes gone",
            describe=lambda: str(slurmlab.job_processes(cluster.conf)),
        )
        is True
    )


def _run_json(config: Path, hosts: Path, results: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    """`orchestrator run CONFIG --host lab-slurm --json`: its one JSON document (exit 0)."""
    capsys.readouterr()
    code = main(
        ["run", str(config), "--host", "lab-slurm", "--hosts", str(hosts), "--json"]
        + ["--results", str(results)]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)
