"""Campaign-level faults: `orchestrator bisect` in a subprocess on the real systemd host.

- The host unreachable for good in the middle of a campaign: three `infra` runs in a row
  stop it with exit 3, the resume command and a note that the host could not be
  restored; once the host is back, resuming restores it first and completes the answer.
  Unreachable for a while only: the campaign retries and completes by itself.
- The controller SIGKILLed at each step of a run (before the drop-in, after
  daemon-reload, while polling, while recording the run): the same command resumes it,
  the host is restored, and every run is recorded exactly once.
- A second campaign on the same host and unit is refused, naming the lock's holder
  (owner, campaign, pid), with exit 3; the first one goes on unaffected.

The pauses come from `python -m tests.hosts.faults STEP N -- ARGS` (see there).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.store.store import Store
from tests.hosts.faults import STEPS, NetFault, SdLab, marker_path
from tests.hosts.wait import wait_until
from tests.support.campaign_lab import check_answer_evidence, cli, popen_cli, stop_child
from tests.test_campaign_resume import recorded_count

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "experiments" / "lab"


def bisect_args(sd: SdLab, results: Path, *extra: str) -> list[str | Path]:
    return [
        "bisect",
        "--good",
        LAB / "b300" / "good.yaml",
        "--bad",
        LAB / "b300" / "bad.yaml",
        "--host",
        "sd",
        "--hosts",
        sd.hosts_file,
        "--results",
        results,
        *extra,
    ]


def check_runs_once(results: Path, cid: str) -> list:
    """Every variant judged once (infra rows aside: they are retried; and the runs again of
    the posterior search that makes the answer sure), seq without gaps."""
    store = Store(results)
    try:
        runs = store.runs(cid)
    finally:
        store.close()
    assert [r.seq for r in runs] == list(range(1, len(runs) + 1))
    judged = [
        r.variant
        for r in runs
        if r.verdict is not Verdict.INFRA and not r.purpose.startswith("noise-")
    ]
    assert len(judged) == len(set(judged)), [(r.seq, r.variant, r.verdict) for r in runs]
    return runs


def check_found(code: int, answer: dict, results: Path) -> None:
    assert code == 0, answer
    assert answer["status"] == "found"
    [culprit] = answer["culprits"]
    assert sorted(culprit["flags"]) == ["--enable-nccl-nvls", "--ep-size 8"]
    check_answer_evidence(results, answer, answer["target"])


def json_of(res: subprocess.CompletedProcess[str]) -> dict:
    try:
        return json.loads(res.stdout)
    except json.JSONDecodeError:
        raise AssertionError(
            f"exit {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        ) from None


# ---- 3. unreachable past the reconnect budget: stop with the resume command, or retry ----------


def test_host_gone_stops_after_3_infra_with_the_resume_command_then_resume_completes(
    sd: SdLab, net: NetFault, tmp_path: Path
) -> None:
    sha = sd.unit_sha()
    results, log = tmp_path / "results", tmp_path / "bisect.log"
    child = popen_cli(*bisect_args(sd, results), log=log)
    try:

        def one_run() -> tuple[str, int] | None:
            assert child.poll() is None, log.read_text()
            got = recorded_count(results)
            return got if got and got[1] >= 1 else None

        cid, n = wait_until(
            one_run, timeout=180, interval=0.05, what="a recorded run", describe=log.read_text
        )
        net.block("REJECT")  # for good, as far as this process can tell
        code = child.wait(timeout=400)
    finally:
        stop_child(child)
    out = log.read_text()
    assert code == 3, out
    assert "3 runs in a row failed on host trouble" in out
    assert f"then resume with: orchestrator bisect --resume {cid}" in out
    assert "could not be restored" in out and "orchestrator restore --host sd" in out
    assert "Traceback" not in out
    runs = check_runs_once(results, cid)
    assert [r.verdict for r in runs[-3:]] == [Verdict.INFRA] * 3
    assert len(runs) >= n + 3

    net.unblock()
    res = cli(*bisect_args(sd, results), "--json")
    answer = json_of(res)
    assert answer["campaign"] == cid  # the same campaign, continued
    check_found(res.returncode, answer, results)
    check_runs_once(results, cid)
    assert sd.restored_problems(sha=sha) == []


def test_host_away_for_a_while_the_campaign_retries_and_completes(
    sd: SdLab, net: NetFault, tmp_path: Path
) -> None:
    results, log = tmp_path / "results", tmp_path / "bisect.log"
    child = popen_cli(*bisect_args(sd, results, "--json"), log=log)
    try:

        def one_run() -> tuple[str, int] | None:
            assert child.poll() is None, log.read_text()
            got = recorded_count(results)
            return got if got and got[1] >= 1 else None

        cid, _ = wait_until(
            one_run, timeout=180, interval=0.05, what="a recorded run", describe=log.read_text
        )
        net.block("REJECT")
        # Longer than one run's reconnect budget (~8 s), shorter than three of them.
        wait_until(
            lambda: (recorded_count(results) or ("", 0))[1] > _ or None,
            timeout=60,
            what="an infra run",
        )
        net.unblock()
        code = child.wait(timeout=400)
    finally:
        stop_child(child)
    answer = json.loads(log.read_text()[log.read_text().index("{") :])
    check_found(code, answer, results)
    runs = check_runs_once(results, cid)
    assert any(r.verdict is Verdict.INFRA for r in runs)
    assert sd.restored_problems() == []


# ---- 7. SIGKILL at each step of a run ------------------------------------------------------


def paused_child(
    step: str, nth: int, args: list[str | Path], log: Path, marker: Path
) -> subprocess.Popen[bytes]:
    fh = open(log, "wb")  # noqa: SIM115 - the child owns it until it ends
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.hosts.faults", step, str(nth), "--", *map(str, args)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            env={**os.environ, "COLUMNS": "200", "ORCH_FAULT_MARKER": str(marker)},
        )
    finally:
        fh.close()


def wait_paused(child: subprocess.Popen[bytes], marker: Path, log: Path, step: str) -> None:
    def there() -> bool:
        assert child.poll() is None, f"ended early ({child.returncode}):\n{log.read_text()}"
        return marker.exists() and marker.read_text() == step

    wait_until(
        there,
        timeout=180,
        interval=0.05,
        what=f"the child paused at {step}",
        describe=log.read_text,
    )


@pytest.mark.parametrize("step", STEPS)
def test_sigkill_at_each_step_then_resume(sd: SdLab, tmp_path: Path, step: str) -> None:
    sha = sd.unit_sha()
    results, log, marker = tmp_path / "results", tmp_path / "child.log", marker_path()
    args = bisect_args(sd, results, "--max-runs", "2")
    child = paused_child(step, 2, args, log, marker)
    try:
        wait_paused(child, marker, log, step)
        dropin = sd.sh(
            "cat /etc/systemd/system/lab-b300.service.d/99-orchestrator.conf 2>/dev/null; true"
        )
        state = sd.show("ActiveState", "DropInPaths")
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        stop_child(child)
        marker.unlink(missing_ok=True)
    cid, n = recorded_count(results) or ("", 0)
    # Where it was killed, as seen on the host and in the store.
    assert n == 1  # run 1 recorded; run 2 never (its COMMIT did not happen either)
    assert sd.locks()  # a crashed controller leaves its lock ...
    if step == "before-dropin":
        assert f"run {cid}.1)" in dropin  # ... and run 1's drop-in; run 2 wrote none yet
    else:
        assert f"run {cid}.2)" in dropin
    if step == "polling":
        # started under our drop-in (the bad endpoint may already have crashed)
        assert state["ActiveState"] in ("active", "activating", "failed")
    if step in ("after-daemon-reload", "polling", "recording"):
        assert "99-orchestrator" in state["DropInPaths"]

    res = cli(*args, "--json")
    answer = json_of(res)
    assert res.returncode == 1, answer  # --max-runs 2: stopped after both endpoints
    assert answer["campaign"] == cid and "--max-runs 2 reached" in answer["message"]
    assert "Traceback" not in res.stderr
    runs = check_runs_once(results, cid)
    assert [r.variant for r in runs] == [(), (0, 1, 2)]  # run 2 recorded once, by the resume
    assert [r.verdict for r in runs] == [Verdict.PASS, Verdict.FAIL]
    assert sd.restored_problems(sha=sha) == []


# ---- 10. two campaigns on one unit ------------------------------------------------------------


def test_second_campaign_on_the_same_unit_is_refused_naming_the_holder(
    sd: SdLab, tmp_path: Path
) -> None:
    results, log, marker = tmp_path / "results", tmp_path / "first.log", marker_path()
    go = marker.with_name(marker.name + ".go")
    first = paused_child("polling", 1, bisect_args(sd, results, "--json"), log, marker)
    try:
        wait_paused(first, marker, log, "polling")
        cid, _ = recorded_count(results) or ("", 0)
        holder = sd.show("InvocationID")["InvocationID"]
        # The same command again (the same campaign), and another campaign on the unit.
        same = cli(*bisect_args(sd, results))
        other = cli(*bisect_args(sd, tmp_path / "other-results", "--strategy", "linear"))
        assert sd.show("InvocationID")["InvocationID"] == holder  # the first's run untouched
        store = Store(results)
        try:  # the refused second process left the first one's record as it was
            camp = store.campaign(cid)
            assert (camp.status, camp.controller["pid"]) == ("running", first.pid)
        finally:
            store.close()
        go.touch()
        code = first.wait(timeout=400)
    finally:
        stop_child(first)
        marker.unlink(missing_ok=True)
        go.unlink(missing_ok=True)
    for res in (same, other):
        assert res.returncode == 3, res.stdout + res.stderr
        err = res.stderr
        assert "lab-b300.service is locked by" in err
        assert f"campaign {cid}" in err and f"pid {first.pid}" in err and "@" in err
        # a live holder: waiting is the advice, never breaking its lock
        assert "wait for that campaign" in err and "--break-lock" not in err
        assert "Traceback" not in err
    assert "is running now" in same.stderr
    answer = json.loads(log.read_text()[log.read_text().index("{") :])
    check_found(code, answer, results)  # the first campaign, unaffected
    check_runs_once(results, cid)
    store = Store(tmp_path / "other-results")
    try:
        assert all(not store.runs(c.id) for c in store.campaigns())  # refused: no run
    finally:
        store.close()
    assert sd.restored_problems() == []
