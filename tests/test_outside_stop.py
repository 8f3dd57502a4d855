"""A server stopped from outside the campaign is `infra`, even when it exits 0; a server
that fails and then exits 0 on its own stays a failure. On the real systemd container and
the sshd process host.

- `systemctl stop` of the unit while the run waits for health, the server exiting 0
  without a word (a shell that traps SIGTERM): systemd's own record of the stop job
  (its UNIT_STOPPING journal entry for this invocation) says someone stopped it: `infra`.
- `kill -TERM` of the lab server's pid (no systemd involved in the stop): it says so in
  its log as SGLang does ("SIGTERM received. ... shutting down") and exits 0: `infra`,
  on the systemd host and on the process host.
- a crash whose process then exits 0 by itself (no one sent anything): a traceback in the
  log, exit status 0: `fail` with the crash's signature, never `infra`.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import yaml

from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.execution.contract import RunResult
from orchestrator.execution.executor import Executor
from orchestrator.lab.sshd import SshdEndpoint, free_port
from tests.hosts.faults import B300, SdLab
from tests.hosts.wait import wait_until
from tests.support.campaign_lab import LAB
from tests.test_executor_process import lab_exp, make_host, server_pid_in_group

#: a server that never becomes healthy and exits 0, silently, on SIGTERM
#: (`--help`, which the flag preflight asks, answers nothing and ends)
SILENT = "[ \"$0\" = --help ] && exit 0; trap 'exit 0' TERM; while :; do sleep 0.2; done"


def _slow(exp: Experiment, *, scale: str = "2") -> Experiment:
    """The lab server, starting slowly enough to be stopped during its startup."""
    exp = exp.with_changes(env={"ORCH_LAB_TIME_SCALE": scale})
    return replace(exp, health=replace(exp.health, timeout=120))


def _run_while(
    ex: Executor, exp: Experiment, run_id: str, outside: Callable[[], None]
) -> RunResult:
    """Run `exp`; call `outside` from another thread meanwhile; the run's result."""
    box: dict[str, RunResult | BaseException] = {}

    def target() -> None:
        try:
            box["r"] = ex.run(exp, run_id=run_id)
        except BaseException as exc:  # noqa: BLE001 (re-raised below, in the test)
            box["r"] = exc

    worker = threading.Thread(target=target)
    worker.start()
    try:
        outside()
    finally:
        worker.join(timeout=180)
    assert not worker.is_alive(), "the run did not end"
    result = box["r"]
    if isinstance(result, BaseException):
        raise result
    return result


def _main_pid(sd: SdLab) -> str:
    found: dict[str, str] = {}

    def started() -> bool:
        found.update(sd.show("ActiveState", "MainPID"))
        return found.get("ActiveState") == "active" and found.get("MainPID", "0") != "0"

    wait_until(
        started,
        timeout=60,
        what="the unit runs the variant",
        describe=lambda: str(found) + sd.sh(f"journalctl -u {B300} -n 20 --no-pager"),
    )
    return found["MainPID"]


def test_systemctl_stop_of_a_server_that_exits_0_is_infra(sd: SdLab) -> None:
    exp = load_experiment(LAB / "b300" / "good.yaml")
    exp = replace(exp, exec=("/bin/sh", "-c", SILENT), health=replace(exp.health, timeout=120))
    with Executor(sd.host, service=B300, campaign="c-stop") as ex:

        def stop() -> None:
            _main_pid(sd)
            sd.sh(f"systemctl stop {B300}")

        r = _run_while(ex, exp, "stop-1", stop)
    assert r.verdict is Verdict.INFRA, (r.verdict, r.signature, r.detail)
    assert "stopped from outside the campaign" in r.detail and "systemd:" in r.detail, r.detail
    assert sd.show("ExecMainStatus")["ExecMainStatus"] == "0"  # it did exit 0


def test_kill_term_of_the_lab_server_on_systemd_is_infra(sd: SdLab) -> None:
    exp = _slow(load_experiment(LAB / "b300" / "good.yaml"))

    def term() -> None:
        pid = _main_pid(sd)
        # its first line comes after its signal handlers are set: it can answer SIGTERM
        said = (
            f"journalctl _SYSTEMD_INVOCATION_ID=$(systemctl show -p InvocationID --value "
            f"{B300}) -o cat -n 1 --no-pager -q"
        )
        wait_until(lambda: sd.sh(said).strip(), timeout=60, what="the server's first line")
        sd.sh(f"kill -TERM {pid}")

    with Executor(sd.host, service=B300, campaign="c-term") as ex:
        r = _run_while(ex, exp, "term-1", term)
    assert r.verdict is Verdict.INFRA, (r.verdict, r.signature, r.detail)
    assert "SIGTERM received" in r.detail and "no failure of its own" in r.detail
    assert "SIGTERM received" in r.log_tail


def _exit0_crash(tmp_path: Path, port: int) -> Experiment:
    """b300 good, whose scenario now crashes in CUDA-graph capture and exits 0."""
    data = yaml.safe_load((LAB / "b300" / "scenario.yaml").read_text())
    data["name"] = "b300-exit0"
    data["faults"].insert(
        0,
        {
            "description": "crash, then a clean exit",
            "when": {},
            "phase": "cuda_graph",
            "error": "RuntimeError: CUDA error: an illegal memory access was encountered",
            "exit_code": 0,
        },
    )
    scen = tmp_path / "exit0.yaml"
    scen.write_text(yaml.safe_dump(data, sort_keys=False))
    exp = lab_exp("b300/good.yaml", port)
    return replace(exp, exec=("python3", "-m", "orchestrator.lab.server", "--scenario", str(scen)))


def test_on_the_process_host_an_outside_term_is_infra_and_an_exit_0_crash_fails(
    sshd: SshdEndpoint,
    tmp_path: Path,
) -> None:
    host: Host = make_host(sshd, tmp_path)[0]
    port = free_port()
    slow = _slow(lab_exp("b300/good.yaml", port))
    with Executor(host, service="lab-b300", campaign="c-outside") as ex:

        def term() -> None:
            pid_file = tmp_path / "run" / "lab-b300" / "pid"
            log = tmp_path / "run" / "lab-b300" / "run-outside-1.log"
            # its first line comes after its signal handlers are set: it can answer SIGTERM
            wait_until(
                lambda: log.exists() and log.stat().st_size > 0 and pid_file.exists(),
                timeout=60,
                what="the server started",
            )
            pgid = int(pid_file.read_text())
            found: list[int] = []
            wait_until(
                lambda: bool(found.append(server_pid_in_group(pgid) or 0) or found[-1]),
                timeout=60,
                what="the lab server runs",
            )
            os.kill(found[-1], signal.SIGTERM)  # the server only: its wrapper sees nothing

        stopped = _run_while(ex, slow, "outside-1", term)
        crashed = ex.run(_exit0_crash(tmp_path, port), run_id="outside-2")
    assert stopped.verdict is Verdict.INFRA, (stopped.verdict, stopped.signature, stopped.detail)
    assert "SIGTERM received" in stopped.detail
    # no one sent anything: the crash is the config's, whatever the exit status says
    assert crashed.verdict is Verdict.FAIL, (crashed.verdict, crashed.detail)
    assert crashed.signature is not None and "illegal memory access" in crashed.signature.message
    assert "outside" not in crashed.detail
