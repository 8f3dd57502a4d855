"""The executor on a real systemd host: drop-ins, daemon-reload, read-back, journald.

One Debian container booted with systemd-nspawn serves the whole module (a boot costs
seconds); a fixture puts it back to its installed state after every test. The executor
reaches it only through the project's `SSHTransport`; the fixture's OpenSSH client is
used for setup and for checking what the executor did.

The watch loop's decisions (deadline, last phase, settle, probe, other vs fail) are
proven on the scripted host (test_executor_watch.py); here, what only systemd can show:
the unit's state, InvocationID and journal read through the real commands, the drop-in
applied and read back exactly, and the unit left as found.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import yaml

from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import load_inventory
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Phase, Verdict
from orchestrator.errors import LockError
from orchestrator.events import Event, PhaseReached, Polled, StepDone
from orchestrator.execution.contract import RunResult
from orchestrator.execution.executor import Executor
from orchestrator.execution.transport.ssh import SSHTransport
from orchestrator.lab.sdhosts import SystemdHostFactory
from tests.hosts.faults import BoxView
from tests.hosts.wait import wait_until
from tests.support.campaign_lab import LAB_UNIT, sigkill_executor_child_while_polling

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "experiments" / "lab"
UNIT_DIR = "/etc/systemd/system"
B300 = "lab-b300.service"
GLM5 = "lab-glm5.service"
HANG_SCENARIO = "/etc/orch-lab/hang.yaml"
ODD = "a b 'single' \"double\" $HOME ${X} `id` ; & | %n %% \\ \\\\n * ? ü ✓ end"


@dataclass
class Lab(BoxView):
    hosts_file: Path

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.sh(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in props))
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def unit_sha(self, unit: str) -> str:
        return hashlib.sha256(self.sh(f"cat {UNIT_DIR}/{unit}").encode()).hexdigest()

    def proc_words(self, pid: str, what: str) -> list[str]:
        raw = base64.b64decode(self.sh(f"base64 -w0 /proc/{pid}/{what}"))
        return [w.decode() for w in raw.split(b"\0")[:-1]]


def hang_scenario_text() -> str:
    data = yaml.safe_load((LAB / "b300" / "scenario.yaml").read_text())
    data["name"] = "b300-hang"
    data["faults"].insert(
        0,
        {
            "description": "graph capture deadlocks",
            "when": {"cuda-graph-max-bs": 512},
            "phase": "cuda_graph",
            "effect": "hang",
        },
    )
    return yaml.safe_dump(data, sort_keys=False)


def argv_of(exec_start: str) -> str:
    """The `argv[]=` part of `systemctl show -p ExecStart` (without run-time fields)."""
    m = re.search(r"argv\[\]=([^;]*);", exec_start)
    return m[1].strip() if m else exec_start


def exp(rel: str) -> Experiment:
    return load_experiment(LAB / rel)


def hang_exp(timeout: float) -> Experiment:
    e = replace(
        exp("b300/good.yaml"),
        exec=("python3", "-m", "orchestrator.lab.server", "--scenario", HANG_SCENARIO),
    )
    e = e.with_changes(flags={"cuda-graph-max-bs": 512}, name="b300-hang")
    return replace(e, health=replace(e.health, timeout=timeout))


@pytest.fixture(scope="module")
def lab_box(
    systemd_hosts: SystemdHostFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Lab]:
    box = systemd_hosts.boot()
    try:
        for unit in (B300, GLM5):
            box.write_file(f"{UNIT_DIR}/{unit}", LAB_UNIT)
        box.write_file(HANG_SCENARIO, hang_scenario_text())
        box.ssh_run("systemctl daemon-reload", check=True)
        d = tmp_path_factory.mktemp("sd-hosts")
        hosts_file = d / "hosts.yaml"
        # The host's env reaches every command, so `EXEC --help` finds the lab package.
        hosts_file.write_text(box.hosts_yaml("sd", env={"PYTHONPATH": "/opt/orchestrator"}))
        yield Lab(box, load_inventory(hosts_file).host("sd"), hosts_file)
    finally:
        systemd_hosts.stop(box)


@pytest.fixture
def lab(lab_box: Lab) -> Iterator[Lab]:
    """The module's host, put back to its installed state after each test."""
    yield lab_box
    lab_box.sh(
        f"systemctl stop {B300} {GLM5}; rm -rf {UNIT_DIR}/{B300}.d {UNIT_DIR}/{GLM5}.d "
        f"/tmp/orchestrator; systemctl daemon-reload; systemctl reset-failed",
        check=False,
    )


def test_verdicts_and_the_host_left_as_found(lab: Lab) -> None:
    before = lab.unit_sha(B300)
    assert lab.show(B300, "ActiveState")["ActiveState"] == "inactive"
    phases: list[Phase] = []
    with Executor(
        lab.host,
        service=B300,
        campaign="c-verdicts",
        listener=lambda e: phases.append(e.phase) if isinstance(e, PhaseReached) else None,
    ) as ex:
        assert isinstance(ex.t, SSHTransport)
        good = ex.run(exp("b300/good.yaml"), run_id="good")
        assert lab.exists(f"{UNIT_DIR}/{B300}.d/99-orchestrator.conf")  # ours, during
        bad = ex.run(exp("b300/bad.yaml"), run_id="bad")
        assert ex.t.connection_count == 1
    assert good.verdict is Verdict.PASS, (good.detail, good.log_tail[-2000:])
    assert good.invocation and good.ready_s is not None
    assert "The server is fired up" in good.log_tail  # the journal of that invocation
    assert bad.verdict is Verdict.FAIL, (bad.detail, bad.log_tail[-2000:])
    assert bad.signature is not None
    assert (bad.signature.phase, bad.signature.error_class) == (Phase.CUDA_GRAPH, "cublas")
    assert "The server is fired up" not in bad.log_tail  # only its own invocation's lines
    assert bad.invocation and bad.invocation != good.invocation
    assert Phase.CUDA_GRAPH in phases
    # Left as found: the unit file byte-identical, no drop-in, stopped, no lock.
    assert lab.unit_sha(B300) == before
    assert not lab.exists(f"{UNIT_DIR}/{B300}.d")
    assert lab.show(B300, "ActiveState")["ActiveState"] == "inactive"
    assert "99-orchestrator" not in lab.show(B300, "DropInPaths")["DropInPaths"]
    assert lab.sh("ls /tmp/orchestrator/locks 2>/dev/null; true").strip() == ""


def test_found_running_is_running_again_with_its_own_config(lab: Lab) -> None:
    lab.sh(f"systemctl start {B300}")
    before = lab.show(B300, "ActiveState", "InvocationID", "ExecStart")
    assert before["ActiveState"] == "active"
    ex = Executor(lab.host, service=B300, campaign="c-running").open()
    try:
        r = ex.run(exp("b300/good.yaml"), run_id="good")
    finally:
        said = ex.close()
    assert r.verdict is Verdict.PASS, (r.detail, r.log_tail[-2000:])
    after = lab.show(B300, "ActiveState", "InvocationID", "ExecStart", "MainPID")
    assert after["ActiveState"] == "active", (
        said,
        ex.left,
        lab.sh(f"journalctl -u {B300} -n 40 --no-pager", check=False),
    )
    assert f"started {B300} again with its own configuration (it was running)" in said
    assert ex.left == []
    assert after["InvocationID"] != before["InvocationID"]  # started again by restore
    assert argv_of(after["ExecStart"]) == argv_of(before["ExecStart"]) == "/bin/sleep infinity"
    assert lab.proc_words(after["MainPID"], "cmdline") == ["/bin/sleep", "infinity"]
    assert not lab.exists(f"{UNIT_DIR}/{B300}.d")


ONCE = "lab-once.service"  # its own start fails while a marker file is there
ONCE_UNIT = (
    "[Service]\nType=simple\nExecStart=/bin/sh -c 'if [ -e /run/fail-always ]; then "
    "exit 3; fi; if [ -e /run/fail-next ]; then rm -f /run/fail-next; exit 3; fi; "
    "exec sleep infinity'\n"
)


@pytest.mark.parametrize("marker", ["fail-next", "fail-always"])
def test_a_unit_found_running_is_said_running_again_only_when_it_is(lab: Lab, marker: str) -> None:
    lab.box.write_file(f"{UNIT_DIR}/{ONCE}", ONCE_UNIT)
    lab.sh(f"systemctl daemon-reload; systemctl start {ONCE}")
    try:
        assert lab.show(ONCE, "ActiveState")["ActiveState"] == "active"
        lab.sh(f"touch /run/{marker}")  # its next start (the restore's) fails
        ex = Executor(lab.host, service=ONCE, campaign="c-once").open()
        said = ex.close()
        state = lab.show(ONCE, "ActiveState", "Result")
        if marker == "fail-next":  # tried again: running, and said so
            assert state["ActiveState"] == "active", (said, state)
            assert said[-1] == f"started {ONCE} again with its own configuration (it was running)"
            assert ex.left == []
        else:  # never said started: what the host shows instead
            assert state["ActiveState"] == "failed", (said, state)
            assert said[-1].startswith(
                f"could not start {ONCE} again with its own "
                "configuration (it was running): it is failed (failed, "
                "result exit-code)"
            ), said
            assert ex.left == [f"{ONCE} is failed (it was active when the campaign found it)"]
    finally:
        lab.sh(
            f"rm -f /run/fail-next /run/fail-always {UNIT_DIR}/{ONCE}; systemctl stop {ONCE}; "
            "systemctl daemon-reload; systemctl reset-failed",
            check=False,
        )


SHIM = "/opt/orchestrator/orchestrator/lab/bin/nvidia-smi"  # the lab's stand-in
GPUS = "/etc/orchestrator-lab/gpus.json"


def test_gpu_memory_of_another_process_is_waited_for_then_infra(lab: Lab) -> None:
    # Someone's process holds GPU 5 (nvidia-smi lists it): the run waits, does not start
    # the server beside it, and is infra naming it; once it is gone, the run judges.
    lab.sh(f"mkdir -p /etc/orchestrator-lab && ln -sf {SHIM} /usr/local/bin/nvidia-smi")
    lab.box.write_file(
        GPUS, json.dumps({"apps": [{"gpu": 5, "pid": 4242, "name": "python3", "used_mib": 81000}]})
    )
    try:
        with Executor(lab.host, service=B300, campaign="c-gpus") as ex:
            ex.gpu_wait = 2.0
            held = ex.run(exp("b300/good.yaml"), run_id="held")
            inv_held = lab.show(B300, "InvocationID")["InvocationID"]
            lab.box.write_file(GPUS, json.dumps({"apps": []}))
            free = ex.run(exp("b300/good.yaml"), run_id="free")
        assert held.verdict is Verdict.INFRA and held.signature is None, held.detail
        # waited at least gpu_wait on the host's real clock: more on a busy machine
        assert re.search(
            r"GPU 5: 81000 MiB held by pid 4242 \(python3\), still after ([2-9]|\d\d+)s",
            held.detail,
        ), held.detail
        assert held.invocation is None and inv_held == ""  # the server never started
        assert free.verdict is Verdict.PASS, (free.detail, free.log_tail[-2000:])
    finally:
        lab.sh(f"rm -f /usr/local/bin/nvidia-smi {GPUS}", check=False)


def test_argv_and_env_round_trip_through_the_drop_in(lab: Lab) -> None:
    e = exp("b300/good.yaml").with_changes(flags={"served-model-name": ODD}, env={"ORCH_ODD": ODD})
    seen: dict[str, list[str]] = {}

    def listener(event: Event) -> None:
        if isinstance(event, Polled) and event.http_code == 200 and not seen:
            pid = lab.show(B300, "MainPID")["MainPID"]
            seen["argv"] = lab.proc_words(pid, "cmdline")
            seen["env"] = lab.proc_words(pid, "environ")

    with Executor(lab.host, service=B300, campaign="c-odd", listener=listener) as ex:
        r = ex.run(e, run_id="odd", env_keys=["ORCH_ODD"])
    assert r.verdict is Verdict.PASS, (r.detail, r.log_tail[-2000:])
    assert seen["argv"][1:] == e.argv()[1:]  # every word exact (argv[0] is the exec name)
    assert seen["argv"][seen["argv"].index("--served-model-name") + 1] == ODD
    env = dict(w.split("=", 1) for w in seen["env"] if "=" in w)
    assert env["ORCH_ODD"] == ODD
    assert env["PYTHONPATH"] == "/opt/orchestrator"  # the unit's own environment kept


def test_read_back_mismatch_is_invalid_and_nothing_starts(lab: Lab) -> None:
    # A higher-priority drop-in of someone else's resets ExecStart after ours.
    lab.box.install_unit(
        f"{B300}.d/zz-override.conf", "[Service]\nExecStart=\nExecStart=/bin/sleep 1234\n"
    )
    before = lab.show(B300, "InvocationID", "ActiveState")
    with Executor(lab.host, service=B300, campaign="c-readback") as ex:
        r = ex.run(exp("b300/good.yaml"), run_id="rb")
    assert r.verdict is Verdict.INVALID
    assert "ExecStart read back differs" in r.detail
    assert "orchestrator.lab.server" in r.detail and "'/bin/sleep', '1234'" in r.detail
    assert r.invocation is None
    # Never started: no new invocation. The previous test's InvocationID may be dropped by
    # systemd meanwhile (an inactive unit's runtime state is unloaded when unreferenced),
    # so "the same one, or none" is what an untouched unit shows.
    after = lab.show(B300, "InvocationID", "ActiveState")
    assert after["ActiveState"] == before["ActiveState"] == "inactive"
    assert after["InvocationID"] in (before["InvocationID"], "")
    assert not lab.exists(f"{UNIT_DIR}/{B300}.d/99-orchestrator.conf")
    assert lab.exists(f"{UNIT_DIR}/{B300}.d/zz-override.conf")  # theirs is left alone


def _run_good_with_steps(
    lab: Lab, campaign: str, *, wait: float
) -> tuple[RunResult, list[StepDone]]:
    """b300's good config run once (the setup retry after `wait` seconds), and the steps
    the executor said."""
    steps: list[StepDone] = []
    with Executor(
        lab.host,
        service=B300,
        campaign=campaign,
        listener=lambda e: steps.append(e) if isinstance(e, StepDone) else None,
    ) as ex:
        ex.setup_retry_wait = wait
        r = ex.run(exp("b300/good.yaml"), run_id=campaign)
    return r, steps


def _chdir_failures(lab: Lab) -> int:
    said = lab.sh(f"journalctl -u {B300} -o cat --no-pager | grep -c 'status=200/CHDIR'; true")
    return int(said.strip() or 0)


def test_a_process_systemd_could_not_set_up_is_infra_not_a_crash(lab: Lab) -> None:
    # Someone's drop-in names a working directory the host lacks: systemd's child fails
    # before the server's command runs and exits 200/CHDIR (a racing cgroup is 219/CGROUP).
    # The status is systemd's, never the server's: not "signal 72" (200 - 128), not a failure.
    lab.box.install_unit(f"{B300}.d/10-operator.conf", "[Service]\nWorkingDirectory=/no/such/dir\n")
    before = _chdir_failures(lab)
    r, steps = _run_good_with_steps(lab, "c-setup", wait=0.5)
    assert _chdir_failures(lab) - before == 2  # started once more, and failed the same way
    assert [s.step for s in steps].count("restarting") == 1
    assert r.verdict is Verdict.INFRA, (r.verdict, r.signature, r.detail)
    assert r.signature is None or r.signature.error_class != "signal", r.signature
    assert "status 200/CHDIR" in r.detail and "nothing about the config" in r.detail, r.detail
    assert not lab.exists(f"{UNIT_DIR}/{B300}.d/99-orchestrator.conf")  # left as found
    assert lab.exists(f"{UNIT_DIR}/{B300}.d/10-operator.conf")


def test_a_setup_failure_that_passes_is_started_once_more(lab: Lab) -> None:
    # The working directory appears once the first start has failed (the unit's OnFailure=
    # creates it), as a cgroup that was not there to join is there a moment later: the
    # second start runs the server, and the run is judged on what the server did.
    appears = "/var/tmp/orch-appears"
    lab.sh(f"rm -rf {appears}")
    lab.box.install_unit(
        "orch-appear.service", f"[Service]\nType=oneshot\nExecStart=/bin/mkdir -p {appears}\n"
    )
    lab.box.install_unit(
        f"{B300}.d/10-operator.conf",
        f"[Unit]\nOnFailure=orch-appear.service\n[Service]\nWorkingDirectory={appears}\n",
    )
    before = _chdir_failures(lab)
    try:
        # the wait covers the OnFailure= unit's start, on a loaded machine too
        r, steps = _run_good_with_steps(lab, "c-setup-once", wait=10.0)
    finally:
        lab.sh(f"rm -rf {appears} {UNIT_DIR}/orch-appear.service; systemctl daemon-reload")
    assert _chdir_failures(lab) - before == 1
    [again] = [s for s in steps if s.step == "restarting"]
    assert "200/CHDIR" in again.detail
    assert r.verdict is Verdict.PASS, (r.verdict, r.signature, r.detail, r.log_tail[-1500:])
    assert "The server is fired up" in r.log_tail  # the second start's own journal


def test_restore_after_the_controller_is_sigkilled(lab: Lab, tmp_path: Path) -> None:
    lab.sh(f"systemctl start {B300}")  # found running, with its own config
    sha = lab.unit_sha(B300)
    pid = sigkill_executor_child_while_polling(
        {
            "hosts": str(lab.hosts_file),
            "host": "sd",
            "service": B300,
            "campaign": "c-crash",
            "experiment": hang_exp(timeout=300).to_dict(),
        },
        tmp_path,
    )
    # The crash left our variant running under our drop-in, and the lock.
    assert lab.exists(f"{UNIT_DIR}/{B300}.d/99-orchestrator.conf")
    assert "orchestrator.lab.server" in lab.show(B300, "ExecStart")["ExecStart"]
    assert lab.sh("ls /tmp/orchestrator/locks").strip()

    with pytest.raises(LockError) as err:
        Executor(lab.host, service=B300, campaign="c-other").open()
    assert "c-crash" in str(err.value) and f"pid {pid}" in str(err.value)
    # the holder's process is gone from this machine: plain restore undoes it
    assert "the lock is stale" in str(err.value)
    assert err.value.hint and "orchestrator restore --host sd" in err.value.hint
    assert "--break-lock" not in err.value.hint
    assert lab.exists(f"{UNIT_DIR}/{B300}.d/99-orchestrator.conf")  # refused: untouched

    ex = Executor(lab.host, service=B300, campaign="c-crash").open()  # takes the lock over
    try:
        assert not lab.exists(f"{UNIT_DIR}/{B300}.d/99-orchestrator.conf")  # prepare cleaned
    finally:
        ex.close()
    after = lab.show(B300, "ActiveState", "ExecStart", "MainPID")
    assert after["ActiveState"] == "active"  # as found: running, with its own config
    assert lab.proc_words(after["MainPID"], "cmdline") == ["/bin/sleep", "infinity"]
    assert lab.unit_sha(B300) == sha
    assert not lab.exists(f"{UNIT_DIR}/{B300}.d")
    wait_until(
        lambda: lab.sh("ls /tmp/orchestrator/locks").strip() == "",
        timeout=10,
        what="the lock to be released",
    )


def test_run_with_a_null_env_var_removes_the_units_own_value(lab: Lab, tmp_path: Path) -> None:
    # The unit sets ORCH_X (a drop-in of the operator's); `run` of a config that says
    # `ORCH_X: null` starts the server without it, as `bisect` and `rerun` do (issue 35).
    from orchestrator.campaign.single import single_run
    from orchestrator.store.store import Store

    lab.box.install_unit(f"{B300}.d/10-operator.conf", "[Service]\nEnvironment=ORCH_X=unit\n")
    data = exp("b300/good.yaml").to_dict()
    data["service"]["env"] = {"ORCH_X": None}
    e = Experiment.from_dict(data, source="no-x.yaml")
    seen: dict[str, list[str]] = {}

    def listener(event: Event) -> None:
        if isinstance(event, Polled) and event.http_code == 200 and not seen:
            seen["env"] = lab.proc_words(lab.show(B300, "MainPID")["MainPID"], "environ")

    store = Store(tmp_path / "results")
    row = single_run(
        store,
        e,
        lab.host,
        kind="run",
        command="orchestrator run no-x.yaml",
        label=e.name,
        listener=listener,
    )
    assert row.verdict is Verdict.PASS, (row.detail, row.log_tail[-2000:])
    env = dict(w.split("=", 1) for w in seen["env"] if "=" in w)
    assert "ORCH_X" not in env  # the unit's own value did not reach the server
    assert env["PYTHONPATH"] == "/opt/orchestrator"  # the rest of the unit's environment did
    assert row.rendered is not None and "UnsetEnvironment=ORCH_X" in row.rendered
    assert row.experiment().unset == ("ORCH_X",)  # recorded as the launch it was


def test_an_imported_unit_is_the_launch_systemd_and_bash_make(lab: Lab) -> None:
    # The unit as systemd merges it (`systemctl cat`: the unit and an operator's drop-in),
    # imported, gives exactly the argv and environment systemd and bash give the server:
    # specifiers, ${VAR} (systemd's), "$MODEL" and "$@" (bash's), `bash -c` (issue 35).
    from orchestrator.config.importer import import_unit_file, render_yaml, to_experiment_mapping

    lab.box.install_unit(
        f"{B300}.d/20-operator.conf",
        (
            "[Service]\n"
            'Environment=TP=8 "MODEL=/models/Kimi K2"\n'
            "ExecStart=\n"
            "ExecStart=/bin/bash -c 'exec python3 -m orchestrator.lab.server --scenario b300 "
            '--model-path "$MODEL" --tp-size ${TP} --served-model-name "%N %%d" '
            '--port 30000 "$@"\' lab --mem-fraction-static 0.85\n'
        ),
    )
    spec = import_unit_file(lab.sh(f"systemctl cat {B300}"), source=B300)
    path = Path(lab.hosts_file).parent / "imported.yaml"
    path.write_text(render_yaml(to_experiment_mapping(spec, name="imported")))
    imported = load_experiment(path)
    assert imported.flag_map()["served-model-name"] == "lab-b300 %d"
    try:
        lab.sh(f"systemctl start {B300}")
        pid = wait_until(
            lambda: (
                (p := lab.show(B300, "MainPID")["MainPID"]) != "0"
                and "orchestrator.lab.server" in lab.proc_words(p, "cmdline")
                and p
            ),
            timeout=30,
            what="the unit's server",
        )
        argv = lab.proc_words(pid, "cmdline")
        env = dict(w.split("=", 1) for w in lab.proc_words(pid, "environ") if "=" in w)
    finally:
        lab.sh(f"systemctl stop {B300}", check=False)
    assert argv[1:] == imported.argv()[1:]  # every word as systemd and bash made it
    assert {k: env.get(k) for k in imported.env_map()} == imported.env_map()
    assert imported.env_map()["MODEL"] == "/models/Kimi K2"
