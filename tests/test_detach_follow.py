"""`--detach` and `runs --follow` on the real sshd host.

A detached bisection prints its campaign, its log and how to follow it, and returns at
once; the campaign runs in a session of its own (no terminal to lose), its output in the
log. `runs --follow ID` shows its progress; Ctrl-C stops following only (the campaign goes
on); following again to the end exits with the campaign's exit code, with the answer in
the output. A detached command that fails before it records a campaign says why, with its
exit code.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.cli import detached, main
from orchestrator.execution.hostlock import me
from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.store.store import Store
from tests.hosts.wait import wait_until
from tests.support.campaign_lab import REPO, cli
from tests.test_campaign_resume import SshdLab


def test_a_detached_bisection_runs_on_and_follow_exits_with_its_code(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    lab = SshdLab(sshd, tmp_path)
    res = cli(*lab.command(), "--detach", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    m = re.search(r"campaign (\w+) runs detached \(pid (\d+)\)", res.stdout)
    assert m, res.stdout
    cid, pid = m[1], int(m[2])
    [log] = re.findall(r"^output: (.+)$", res.stdout, re.M)
    assert Path(log).parent == (lab.results / "detached").resolve()
    [follow] = re.findall(r"^follow it with: (.+)$", res.stdout, re.M)
    assert follow == f"orchestrator runs --follow {cid} --results {lab.results}"
    [resume] = re.findall(r"then resume it with: (.+)\)$", res.stdout, re.M)
    assert resume.startswith(f"orchestrator bisect --resume {cid} --hosts ")
    try:
        assert os.getsid(pid) == pid != os.getsid(0)  # a session of its own: no terminal
        # Following, then Ctrl-C: following stops, the campaign goes on. The campaign is
        # held still (SIGSTOP) until the follower is up: on a loaded machine the lab's fast
        # campaign could otherwise end before it, and a follow of an ended campaign exits
        # with the campaign's code, not 130.
        os.kill(pid, signal.SIGSTOP)
        seen = tmp_path / "follow.out"
        with seen.open("wb") as fh:
            follower = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "orchestrator",
                    "runs",
                    "--follow",
                    cid,
                    "--results",
                    lab.results,
                ],
                cwd=REPO,
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_until(
                lambda: f"following campaign {cid}" in seen.read_text() or None,
                timeout=120,
                what="the campaign followed",
                describe=seen.read_text,
            )
            # going on again before the Ctrl-C: held still, it may hold the results store
            # the follower reads as it stops
            os.kill(pid, signal.SIGCONT)
            follower.send_signal(signal.SIGINT)
            follower.wait(timeout=60)
        finally:
            if follower.poll() is None:
                follower.kill()
            os.kill(pid, signal.SIGCONT)
        out = seen.read_text()
        assert follower.returncode == 130, out
        assert f"campaign {cid} keeps running" in out
        assert Path(f"/proc/{pid}").exists()
        # Following to the end, with the command it printed: the output and exit code.
        res = cli(*shlex.split(follow)[1:], timeout=400)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "culprit (interacting set): --ep-size 8 + --enable-nccl-nvls" in res.stdout
        assert f"campaign {cid} ended: done (exit 0)" in res.stdout
    finally:
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGTERM)
            wait_until(
                lambda: not Path(f"/proc/{pid}").exists() or None,
                timeout=120,
                what="the detached campaign to stop",
            )
    store = Store(lab.results, readonly=True)
    try:
        camp = store.campaign(cid)
        assert camp.status == "done" and camp.controller["exit_code"] == 0
        assert camp.controller["log"] == log
    finally:
        store.close()
    assert lab.restored()


@pytest.mark.slow
def test_a_detached_command_that_fails_at_once_says_why(tmp_path: Path) -> None:
    res = cli(
        "bisect",
        "--good",
        tmp_path / "missing.yaml",
        "--bad",
        tmp_path / "m2.yaml",
        "--host",
        "lab",
        "--results",
        tmp_path / "results",
        "--detach",
        timeout=120,
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert "missing.yaml" in res.stderr
    assert not (tmp_path / "results").exists()  # nothing recorded: no results directory


def test_follow_waits_for_the_answer_printed_after_the_status_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command records its campaign's end, then prints its answer, then records its exit
    code. A follower that sees the end must still show the answer (seen once: the output
    ended at the last run line).

    The answer comes at the first moment the follower waits after it saw the end, and not
    before: the follower runs in this process and its wait is where the command goes on.
    A follower that does not wait never gets it (a fixed sleep in a subprocess let a slow
    follower start after the answer on a busy machine, and the race went untested)."""
    results = tmp_path / "results"
    log = tmp_path / "detached.log"
    log.write_text(" 12. pass    bad - --ep-size 8\n")
    # A live process of this machine stands for the detached command.
    stand_in = subprocess.Popen(["sleep", "60"])
    store = Store(results)
    waits: list[float] = []
    try:
        cid = store.create_campaign(kind="bisect", key="k", command="bisect", spec={})
        controller = {"owner": me(), "pid": stand_in.pid, "log": str(log)}
        store.update_campaign(cid, status="done", controller=controller)

        def command_goes_on(seconds: float) -> None:
            if not waits:  # the command prints its answer, then records its exit code
                with log.open("a") as fh:
                    fh.write("culprit: --ep-size 8\n")
                store.update_campaign(cid, controller={**controller, "exit_code": 0})
            waits.append(seconds)

        monkeypatch.setattr(
            detached, "time", SimpleNamespace(monotonic=time.monotonic, sleep=command_goes_on)
        )
        code = main(["runs", "--follow", cid, "--results", str(results)])
    finally:
        store.close()
        stand_in.kill()
        stand_in.wait()
    text = capsys.readouterr().out
    assert code == 0, text
    assert waits, text  # it waited for the command once the status had ended
    assert " 12. pass" in text
    assert text.index("culprit: --ep-size 8") < text.index(f"campaign {cid} ended: done (exit 0)")
