"""A campaign stopped in the middle of a run continues where it stopped.

`orchestrator bisect` runs in a subprocess against a real host. Once the store holds at
least three runs and the next run's server is up on the host, the campaign is killed
(SIGKILL: a lost controller), or interrupted (SIGINT: Ctrl-C; SIGTERM: a stopped job).
Then the campaign is resumed, by the same command or by `--resume ID`, and must give the
same answer as an uninterrupted one, with the same runs: every variant recorded once (the
one in progress at the kill runs again, because it never got a verdict), none missing,
sequence numbers without gaps, and the host left as it was found.
"""

from __future__ import annotations

import hashlib
import shlex
import signal
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.lab.sdhosts import SystemdHost
from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.store.store import Store
from tests.hosts.wait import wait_until
from tests.support.campaign_lab import (
    LAB,
    LAB_UNIT,
    UNIT_DIR,
    Recorded,
    check_b300_answer,
    cli_json,
    lab_pair,
    lab_servers,
    popen_cli,
    read_runs,
    recorded_b300,
    sshd_hosts_file,
    stop_child,
)

B300_UNIT = "lab-b300.service"
MIN_RUNS = 3


def recorded_count(results: Path) -> tuple[str, int] | None:
    """(campaign id, runs recorded) as another process sees them; None before any."""
    db = results / "orchestrator.db"
    if not db.exists():
        return None
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            row = con.execute(
                "SELECT c.id, count(r.id) FROM campaigns c LEFT JOIN runs r ON r.campaign = c.id"
                " WHERE c.kind = 'bisect' GROUP BY c.id"
            ).fetchone()
        finally:
            con.close()
    except sqlite3.Error:  # created but not yet initialised by the writer
        return None
    return (row[0], row[1]) if row else None


def wait_mid_run(
    child: subprocess.Popen[bytes],
    results: Path,
    log: Path,
    in_progress: Callable[[str, int], bool],
) -> tuple[str, int]:
    """Wait until >= MIN_RUNS runs are stored and run MIN_RUNS+1.. is on the host."""

    def ready() -> tuple[str, int] | None:
        assert child.poll() is None, f"bisect ended early ({child.returncode}):\n{log.read_text()}"
        got = recorded_count(results)
        if got is None or got[1] < MIN_RUNS:
            return None
        cid, n = got
        return (cid, n) if in_progress(cid, n + 1) else None

    return wait_until(
        ready,
        timeout=180,
        interval=0.05,
        what="a run in progress after 3 runs",
        describe=log.read_text,
    )


def check_same_runs(results: Path, cid: str, reference: Recorded) -> None:
    """The resumed campaign ran exactly the variants of an uninterrupted one, in order."""
    runs = read_runs(results, cid)
    ref = read_runs(reference.root / "results", reference.campaign)
    assert [r.variant for r in runs] == [r.variant for r in ref]
    assert [r.seq for r in runs] == list(range(1, len(runs) + 1))
    assert len({r.id for r in runs}) == len(runs)


def same_answer(answer: dict, reference: dict) -> None:
    for key in ("target", "deltas"):
        assert answer[key] == reference[key]
    assert [c["flags"] for c in answer["culprits"]] == [c["flags"] for c in reference["culprits"]]
    assert [f["signature"] for f in answer["findings"]] == [
        f["signature"] for f in reference["findings"]
    ]


# ---- the process manager over sshd --------------------------------------------------------


class SshdLab:
    """The b300 pair on the sshd host, with what a test needs to see on the host."""

    def __init__(self, sshd: SshdEndpoint, tmp: Path) -> None:
        self.pair = lab_pair(tmp, "b300")
        self.hosts = sshd_hosts_file(sshd, tmp)
        self.results = tmp / "results"
        self.svc = tmp / "run" / B300_UNIT  # the process manager's dir for the service
        self.log = tmp / "bisect.log"

    def command(self) -> list[str | Path]:
        return [
            "bisect",
            "--good",
            self.pair.good,
            "--bad",
            self.pair.bad,
            "--host",
            "lab",
            "--hosts",
            self.hosts,
            "--results",
            self.results,
        ]

    def in_progress(self, cid: str, seq: int) -> bool:
        """Run `seq`'s server started and is alive on the host."""
        pid = (self.svc / "pid").read_text().strip() if (self.svc / "pid").exists() else ""
        return (
            (self.svc / f"run-{cid}.{seq}.log").exists()
            and pid.isdigit()
            and Path(f"/proc/{pid}").exists()
        )

    def restored(self) -> bool:
        return not lab_servers(self.pair.port) and not (self.svc / "pid").exists()


@pytest.fixture
def reference(sshd: SshdEndpoint, tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """An uninterrupted b300 bisection on the same host (made once per session)."""
    rec = recorded_b300(sshd, tmp_path_factory.getbasetemp())
    assert rec.exit_code == 0, rec.outcome
    return rec


def test_sigkill_mid_run_then_the_same_command_resumes(
    sshd: SshdEndpoint, tmp_path: Path, reference: Recorded
) -> None:
    lab = SshdLab(sshd, tmp_path)
    child = popen_cli(*lab.command(), log=lab.log)
    try:
        cid, n = wait_mid_run(child, lab.results, lab.log, lab.in_progress)
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        stop_child(child)
    # Killed in the middle of run n+1: its server is still up on the host, unjudged.
    assert recorded_count(lab.results) == (cid, n)
    assert (lab.svc / "pid").exists() and lab_servers(lab.pair.port)

    code, answer = cli_json(*lab.command())
    assert code == 0, answer
    assert answer["campaign"] == cid  # the same campaign, continued
    same_answer(answer, reference.outcome)
    check_b300_answer(answer, lab.results, resumed=True)
    check_same_runs(lab.results, cid, reference)
    # The resumed process executed exactly the runs the killed one had not recorded.
    assert answer["runs_executed"] == len(read_runs(lab.results, cid)) - n
    assert lab.restored()


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"]
)
def test_interrupt_restores_the_host_prints_the_resume_command_and_resumes(
    sshd: SshdEndpoint, tmp_path: Path, reference: Recorded, sig: signal.Signals
) -> None:
    lab = SshdLab(sshd, tmp_path)
    child = popen_cli(*lab.command(), log=lab.log)
    try:
        cid, n = wait_mid_run(child, lab.results, lab.log, lab.in_progress)
        child.send_signal(sig)
        code = child.wait(timeout=120)
    finally:
        stop_child(child)
    out = lab.log.read_text()
    assert code == 130, out
    [line] = [ln for ln in out.splitlines() if ln.startswith("resume with: ")]
    resume = shlex.split(line.removeprefix("resume with: "))
    assert resume[:4] == ["orchestrator", "bisect", "--resume", cid]
    assert "Traceback" not in out
    # Restored before it exited: the server of the interrupted run is gone, and the
    # message says so only because the host read back showed it.
    assert lab.restored(), out
    assert "the host was restored (read back: as found)" in out, out
    store = Store(lab.results)
    try:
        assert store.campaign(cid).status == "interrupted"
        assert len(store.runs(cid)) == n  # the interrupted run has no verdict: not recorded
    finally:
        store.close()

    # The printed command, exactly as printed, continues the campaign.
    code, answer = cli_json(*resume[1:])
    assert code == 0, answer
    assert answer["campaign"] == cid
    same_answer(answer, reference.outcome)
    check_b300_answer(answer, lab.results, resumed=True)
    check_same_runs(lab.results, cid, reference)
    assert answer["runs_executed"] == len(read_runs(lab.results, cid)) - n
    assert lab.restored()


# ---- the systemd host -------------------------------------------------------------------------


def test_sigkill_mid_run_on_systemd_then_resume_restores_the_unit(
    systemd_host: SystemdHost, tmp_path: Path, reference: Recorded
) -> None:
    box = systemd_host
    box.install_unit(B300_UNIT, LAB_UNIT)

    def sh(command: str) -> str:
        return box.ssh_run(command, check=True, timeout=120).stdout

    def unit_sha() -> str:
        return hashlib.sha256(sh(f"cat {UNIT_DIR}/{B300_UNIT}").encode()).hexdigest()

    def state() -> dict[str, str]:
        out = sh(f"systemctl show {B300_UNIT} -p ActiveState -p DropInPaths")
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    dropin = f"{UNIT_DIR}/{B300_UNIT}.d/99-orchestrator.conf"

    def in_progress(cid: str, seq: int) -> bool:
        res = box.ssh_run(
            f"grep -q 'run {cid}.{seq})' {dropin} && systemctl is-active {B300_UNIT}", timeout=60
        )
        return res.returncode == 0 and res.stdout.strip() == "active"

    sha = unit_sha()
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(box.hosts_yaml("sd", env={"PYTHONPATH": "/opt/orchestrator"}))
    results = tmp_path / "results"
    log = tmp_path / "bisect.log"
    command: list[str | Path] = [
        "bisect",
        "--good",
        LAB / "b300" / "good.yaml",
        "--bad",
        LAB / "b300" / "bad.yaml",
        "--host",
        "sd",
        "--hosts",
        hosts,
        "--results",
        results,
    ]
    child = popen_cli(*command, log=log)
    try:
        cid, n = wait_mid_run(child, results, log, in_progress)
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        stop_child(child)
    # Our drop-in is left on the host, with the variant of the unfinished run.
    assert box.ssh_run(f"test -e {dropin}").returncode == 0
    assert recorded_count(results) == (cid, n)

    code, answer = cli_json(*command)
    assert code == 0, answer
    assert answer["campaign"] == cid
    same_answer(answer, reference.outcome)
    check_b300_answer(answer, results, resumed=True)
    check_same_runs(results, cid, reference)
    # The unit as found: byte-identical, no drop-in, stopped.
    assert unit_sha() == sha
    assert box.ssh_run(f"test -e {UNIT_DIR}/{B300_UNIT}.d").returncode != 0
    after = state()
    assert after["ActiveState"] == "inactive"
    assert "99-orchestrator" not in after["DropInPaths"]
