"""Signals to the controller on the real systemd host, and `restore` beside a live campaign.

- Ctrl-C twice, 0.5 s apart, in the middle of a run: the second one does not cut the
  restore short ("please wait"); the message says "restored" and the host read back agrees
  (no drop-in, the unit as found, no server, no lock); the campaign is `interrupted` and
  the printed command resumes it.
- Ctrl-C three times: the restore is abandoned; the message never says "restored" but what
  was not read back and the `restore` command, which, run as printed, finishes it.
- The terminal closes (the controller's controlling terminal hung up: SIGHUP): the host is
  restored and the campaign recorded as interrupted, exit 130, like SIGTERM.
- `restore` while a campaign runs on the unit: refused, naming the holder, with or without
  `--break-lock`; the campaign goes on and answers. A lock renewed by a controller on
  another machine is refused until its lease expires; then `restore` removes it.
- A campaign refused by the lock is recorded as `refused`; a SIGKILLed one shows `dead`.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.errors import StoreError
from orchestrator.store.store import Store
from tests.hosts.faults import B300, UNIT_DIR, SdLab
from tests.hosts.wait import wait_until
from tests.support.campaign_lab import cli, popen_cli, read_runs, stop_child
from tests.test_faults_campaign import REPO, bisect_args, check_found, json_of

DROPIN = f"{UNIT_DIR}/{B300}.d/99-orchestrator.conf"


def in_progress(
    sd: SdLab,
    results: Path,
    child: subprocess.Popen[bytes],
    log: Path,
) -> str:
    """Wait until a run of our variant is active on the unit, after one recorded run;
    the campaign's id."""

    def there() -> str | None:
        assert child.poll() is None, log.read_text() if log.exists() else child.returncode
        return in_progress_once(sd, results)

    return wait_until(
        there,
        timeout=240,
        interval=0.1,
        what="a run in progress",
        describe=lambda: log.read_text() if log.exists() else "",
    )


def status(results: Path, cid: str) -> str:
    store = Store(results, readonly=True)
    try:
        return store.campaign(cid).status
    finally:
        store.close()


def signalled(sd: SdLab, results: Path, log: Path, gaps: list[float]) -> tuple[int, str, str]:
    """A bisect in progress on `sd`, sent SIGINT once and again after each of `gaps`
    (seconds): (its exit code, its output, its campaign id)."""
    child = popen_cli(*bisect_args(sd, results), log=log)
    try:
        cid = in_progress(sd, results, child, log)
        child.send_signal(signal.SIGINT)
        for gap in gaps:
            time.sleep(gap)
            child.send_signal(signal.SIGINT)
        code = child.wait(timeout=300)
    finally:
        stop_child(child)
    return code, log.read_text(), cid


def test_ctrl_c_twice_half_a_second_apart_restores_and_says_so_truly(
    sd: SdLab, tmp_path: Path
) -> None:
    sha = sd.unit_sha()
    results = tmp_path / "results"
    code, out, cid = signalled(sd, results, tmp_path / "bisect.log", [0.5])
    assert code == 130, out
    assert "restoring the hosts, please wait" in out, out
    assert "sd: NOT restored" not in out and "Traceback" not in out, out
    assert "the host was restored (read back: as found): sd" in out, out
    assert sd.restored_problems(sha=sha) == []  # the host agrees with the message
    assert status(results, cid) == "interrupted"
    [line] = [ln for ln in out.splitlines() if ln.startswith("resume with: ")]
    res = cli(*shlex.split(line.removeprefix("resume with: "))[1:], "--json")
    check_found(res.returncode, json_of(res), results)
    assert sd.restored_problems(sha=sha) == []


def test_ctrl_c_three_times_abandons_and_prints_the_restore_that_finishes_it(
    sd: SdLab, tmp_path: Path
) -> None:
    sha = sd.unit_sha()
    code, out, _ = signalled(sd, tmp_path / "results", tmp_path / "bisect.log", [0.05, 0.05])
    assert code == 130, out
    assert "NOT restored" in out and "restored (read back" not in out, out
    restore = [ln for ln in out.splitlines() if "finish it with: " in ln]
    assert restore, out
    command = shlex.split(restore[0].split("finish it with: ", 1)[1])
    assert command[:4] == ["orchestrator", "restore", "--host", "sd"], command
    res = cli(*command[1:])
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{B300}: read back: as found" in res.stdout, res.stdout
    assert sd.restored_problems(sha=sha) == []


def _on_a_terminal(args: list[str | Path], log: Path) -> tuple[subprocess.Popen[bytes], int]:
    """`orchestrator ARGS` as a terminal's foreground job: a session of its own whose
    controlling terminal is a new pty (closing its master hangs it up, as a closed terminal
    window or a dropped SSH session does). Returns the child and the master's fd."""
    master, slave = os.openpty()

    def controlling_tty() -> None:  # runs in the child, after setsid
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *map(str, args)],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=REPO,
            start_new_session=True,
            preexec_fn=controlling_tty,
            env={**os.environ, "COLUMNS": "200"},
        )
    finally:
        os.close(slave)
    os.set_blocking(master, False)
    del log
    return child, master


def test_a_closed_terminal_restores_the_host_and_records_the_campaign(
    sd: SdLab, tmp_path: Path
) -> None:
    sha = sd.unit_sha()
    results, log = tmp_path / "results", tmp_path / "bisect.log"
    child, master = _on_a_terminal(bisect_args(sd, results), log)
    seen = bytearray()
    try:

        def drain() -> str:
            try:
                while chunk := os.read(master, 65536):
                    seen.extend(chunk)
            except (BlockingIOError, OSError):
                pass
            return seen.decode(errors="replace")

        def there() -> str | None:
            drain()
            assert child.poll() is None, drain()
            return in_progress_once(sd, results)

        cid = wait_until(there, timeout=240, interval=0.1, what="a run in progress", describe=drain)
        os.close(master)  # the terminal is gone: the kernel hangs up the session
        master = -1
        code = child.wait(timeout=300)
    finally:
        if master >= 0:
            os.close(master)
        stop_child(child)
    assert code == 130  # interrupted, not killed by SIGHUP (-1), not 129
    assert sd.restored_problems(sha=sha) == []
    assert status(results, cid) == "interrupted"
    # The same command resumes it.
    res = cli(*bisect_args(sd, results), "--json")
    answer = json_of(res)
    assert answer["campaign"] == cid
    check_found(res.returncode, answer, results)


def in_progress_once(sd: SdLab, results: Path) -> str | None:
    """The campaign's id once it recorded a run and a run of our variant is active."""
    if not (results / "orchestrator.db").exists():
        return None
    try:
        store = Store(results, readonly=True)
    except StoreError:  # created, its tables not yet
        return None
    try:
        camps = store.campaigns()
        if not camps or not store.runs(camps[0].id):
            return None
        cid = camps[0].id
    finally:
        store.close()
    r = sd.box.ssh_run(f"test -e {DROPIN} && systemctl is-active {B300}", timeout=60)
    return cid if r.returncode == 0 and r.stdout.strip() == "active" else None


def test_restore_refuses_a_live_campaign_and_a_second_one_is_recorded_refused(
    sd: SdLab, tmp_path: Path
) -> None:
    sha = sd.unit_sha()
    results, log = tmp_path / "results", tmp_path / "bisect.log"
    child = popen_cli(*bisect_args(sd, results, "--json"), log=log)
    try:
        cid = in_progress(sd, results, child, log)
        for extra in ([], ["--break-lock"]):
            res = cli("restore", "--host", "sd", "--hosts", sd.hosts_file, *extra)
            assert res.returncode == 1, res.stdout + res.stderr
            assert f"refused: {B300} belongs to a campaign that is running" in res.stdout
            assert f"campaign {cid}" in res.stdout and f"pid {child.pid}" in res.stdout
        # Untouched: its lock is there (and its runs below: none stopped from outside).
        assert sd.locks()
        other = tmp_path / "other"
        res = cli(*bisect_args(sd, other, "--strategy", "linear"))
        assert res.returncode == 3 and "is locked by" in res.stderr, res.stderr
        assert "restore refuses to touch a live one" in res.stderr
        store = Store(other, readonly=True)
        try:
            assert [c.status for c in store.campaigns()] == ["refused"]
        finally:
            store.close()
        code = child.wait(timeout=400)
    finally:
        stop_child(child)
    text = log.read_text()
    check_found(
        code, json_of(subprocess.CompletedProcess([], code, text[text.index("{") :], "")), results
    )
    runs = read_runs(results, cid)
    assert runs and all(r.verdict is not Verdict.INFRA for r in runs), runs
    assert sd.restored_problems(sha=sha) == []


def test_a_lock_from_another_machine_is_kept_while_its_lease_runs(
    sd: SdLab, tmp_path: Path
) -> None:
    lock = f"/tmp/orchestrator/locks/{B300}.lock"
    body = (
        '{"owner": "ops@elsewhere", "campaign": "far001", "pid": 4242, '
        f'"since": {time.time():.0f}}}'
    )
    sd.sh(f"mkdir -p /tmp/orchestrator/locks && echo {shlex.quote(body)} > {lock}")
    res = cli("restore", "--host", "sd", "--hosts", sd.hosts_file, "--break-lock")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "refused" in res.stdout and "ops@elsewhere" in res.stdout
    assert "renewed its lease" in res.stdout
    assert sd.exists(lock)
    sd.sh(f"touch -d '20 minutes ago' {lock}")  # the holder stopped renewing: it is gone
    res = cli("restore", "--host", "sd", "--hosts", sd.hosts_file)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "removed the lock" in res.stdout and "which is gone" in res.stdout
    assert not sd.exists(lock)


def test_a_sigkilled_campaign_shows_dead(sd: SdLab, tmp_path: Path) -> None:
    results, log = tmp_path / "results", tmp_path / "bisect.log"
    child = popen_cli(*bisect_args(sd, results), log=log)
    try:
        cid = in_progress(sd, results, child, log)
        running = cli("runs", "--campaigns", "--results", results, "--json")
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        stop_child(child)
    assert [c["status"] for c in json_of(running)] == ["running"]
    dead = json_of(cli("runs", "--campaigns", "--results", results, "--json"))
    assert [(c["id"], c["status"]) for c in dead] == [(cid, "dead")]
    # `hosts check` reports what the dead controller left, which `restore` then undoes
    checked = cli("hosts", "check", "sd", "--hosts", sd.hosts_file, "--json")
    assert checked.returncode == 3, checked.stdout + checked.stderr
    found = {c["name"]: c for c in json_of(checked)["sd"]}
    detail = found["leftovers"]["detail"]
    assert found["leftovers"]["ok"] is False and f"{B300} has orchestrator's drop-in" in detail
    assert f"the lock on {B300} left by" in detail and f"pid {child.pid}" in detail, detail
    res = cli("restore", "--host", "sd", "--hosts", sd.hosts_file)  # a dead holder's
    assert res.returncode == 0, res.stdout + res.stderr
    assert sd.restored_problems() == []
    checked = cli("hosts", "check", "sd", "--hosts", sd.hosts_file, "--json")
    found = {c["name"]: c for c in json_of(checked)["sd"]}
    assert found["leftovers"]["ok"] is True, found
