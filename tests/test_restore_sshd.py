"""`orchestrator restore` on the real sshd host (process manager) beside a live campaign.

A campaign runs on the host while a dead controller's leftovers (a server still running
under the same run_dir, its lock naming a pid that is gone) sit beside it: `restore` stops
the dead one's server and removes its lock, reads it back, and refuses the live campaign's
service by name, touching nothing of it; the campaign goes on to its answer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.execution.hostlock import me
from orchestrator.lab.sshd import SshdEndpoint
from tests.hosts.wait import wait_until
from tests.support.campaign_lab import cli, popen_cli, read_runs, stop_child
from tests.test_campaign_resume import B300_UNIT, SshdLab, wait_mid_run


def test_restore_stops_only_what_a_dead_controller_left(sshd: SshdEndpoint, tmp_path: Path) -> None:
    lab = SshdLab(sshd, tmp_path)
    old = tmp_path / "run" / "old-svc"
    old.mkdir(parents=True, mode=0o700)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    orphan = subprocess.Popen(["setsid", "sh", "-c", f"echo $$ > {old}/pid; exec sleep 300"])
    child = popen_cli(*lab.command(), "--json", log=lab.log)
    try:
        cid, _ = wait_mid_run(child, lab.results, lab.log, lab.in_progress)
        wait_until(lambda: (old / "pid").exists() or None, timeout=30, what="the orphan's pid")
        locks = tmp_path / "run" / "locks"
        (locks / "old-svc.lock").write_text(
            json.dumps({"owner": me(), "campaign": "dead01", "pid": gone.pid, "since": time.time()})
        )
        # `hosts check` reports what `restore` is about to undo, and only that
        checked = cli("hosts", "check", "lab", "--hosts", lab.hosts, "--json", timeout=120)
        assert checked.returncode == 3, checked.stdout + checked.stderr
        found = {c["name"]: c for c in json.loads(checked.stdout)["lab"]}
        assert found["leftovers"]["ok"] is False, found
        assert f"session {orphan.pid}) still runs" in found["leftovers"]["detail"]
        assert "the lock on old-svc left by" in found["leftovers"]["detail"]
        assert B300_UNIT not in found["leftovers"]["detail"]  # the live campaign's
        assert f"orchestrator restore --host lab --hosts {lab.hosts}" in found["leftovers"]["hint"]
        assert found["in use"]["ok"] is None and f"campaign {cid}" in found["in use"]["detail"]
        res = cli("restore", "--host", "lab", "--hosts", lab.hosts, timeout=120)
        out = res.stdout
        assert res.returncode == 1, out + res.stderr  # one service refused
        assert f"refused: {B300_UNIT} belongs to a campaign that is running" in out, out
        assert f"campaign {cid}" in out and f"pid {child.pid}" in out
        assert f"stopped the server started by orchestrator in {old}" in out, out
        assert "removed the lock on old-svc" in out and "which is gone" in out
        assert "old-svc: read back: as found" in out, out
        assert orphan.wait(timeout=30) is not None  # the dead controller's server is gone
        assert not (locks / "old-svc.lock").exists()
        assert (locks / f"{B300_UNIT}.lock").exists()  # the live one's lock is kept
        checked = cli("hosts", "check", "lab", "--hosts", lab.hosts, "--json", timeout=120)
        found = {c["name"]: c for c in json.loads(checked.stdout)["lab"]}
        assert found["leftovers"]["ok"] is True, found
        code = child.wait(timeout=400)
    finally:
        stop_child(child)
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait(timeout=30)
    text = lab.log.read_text()
    assert code == 0, text
    answer = json.loads(text[text.index("{") :])
    assert answer["status"] == "found"
    runs = read_runs(lab.results, cid)
    assert all(r.verdict is not Verdict.INFRA for r in runs), runs  # none stopped by restore
    assert lab.restored()
