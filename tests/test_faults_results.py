"""The results directory and database under faults, with a real systemd host at hand.

A read-only or full results directory is refused before any host is touched (exit 3, one
line and a hint; no drop-in, no lock on the host). A truncated or overwritten database is
detected (exit 3, one line naming the file, a hint to move it aside), and the earlier runs'
log files stay readable. A WAL whose tail was torn by a controller killed mid-write still
gives every committed run back.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.store.store import Store
from tests.hosts.faults import SdLab, read_only_dir, small_tmpfs
from tests.support.campaign_lab import cli

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "experiments" / "lab"


@pytest.fixture(scope="module")
def recorded(sd_box: SdLab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results dir with two real runs on the host (a pass and an init crash)."""
    results = tmp_path_factory.mktemp("recorded") / "results"
    for rel in ("b300/good.yaml", "b300/ep8_only.yaml"):
        res = cli(
            "run",
            LAB / rel,
            "--host",
            "sd",
            "--hosts",
            sd_box.hosts_file,
            "--results",
            results,
            "--json",
        )
        assert res.returncode == 0, res.stdout + res.stderr
    sd_box.reset()
    return results


def bisect(sd: SdLab, results: Path) -> tuple[int, str]:
    res = cli(
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
    )
    return res.returncode, res.stdout + res.stderr


def one_error(out: str) -> str:
    """The `error:` line the CLI printed; asserts there is exactly one, and no traceback."""
    assert "Traceback" not in out, out
    lines = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, out
    return lines[0]


def untouched(sd: SdLab, invocation: str) -> None:
    """Nothing of ours was created on the host, and the unit was not started again: its
    InvocationID is the one it had before (systemd keeps the last one while the unit stays
    loaded, so an earlier run in this module may have left one), or none at all when
    systemd unloaded the inactive unit meanwhile (it may, at any time); a start of ours
    would have left a new one, active or failed (failed units stay loaded)."""
    assert sd.restored_problems() == []
    assert sd.sh("ls -d /tmp/orchestrator 2>/dev/null; true").strip() == ""
    now = sd.show("InvocationID", "ActiveState")
    assert now["InvocationID"] in (invocation, ""), (now, invocation)
    if not now["InvocationID"]:
        assert now["ActiveState"] in ("inactive", ""), now


# ---- 8. read-only or full ----------------------------------------------------------------------


def test_read_only_results_refused_before_the_host_is_touched(sd: SdLab, tmp_path: Path) -> None:
    results = tmp_path / "results"
    Store(results).close()  # an existing store, then the directory turns read-only
    before = sd.show("InvocationID")["InvocationID"]
    with read_only_dir(results):
        code, out = bisect(sd, results)
    assert code == 3, out
    line = one_error(out)
    assert f"cannot write results to {results}" in line and "Read-only file system" in line
    assert "hint:" in out and "--results DIR" in out
    untouched(sd, before)


@pytest.mark.parametrize("size", ["32k", "64k"], ids=["probe-fails", "database-fails"])
def test_full_results_dir_refused_before_the_host_is_touched(
    sd: SdLab, tmp_path: Path, size: str
) -> None:
    # 32k: the store's write probe fails; 64k: the probe fits, the database does not.
    before = sd.show("InvocationID")["InvocationID"]
    with small_tmpfs(tmp_path / "results", size=size) as results:
        code, out = bisect(sd, results)
    assert code == 3, out
    line = one_error(out)
    assert f"cannot write results to {results}" in line
    assert "No space left on device" in line or "disk is full" in line
    assert "free some space" in out
    untouched(sd, before)


# ---- 9. truncated or corrupted database ---------------------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "overwritten"])
def test_damaged_database_detected_logs_still_readable(
    sd: SdLab, recorded: Path, tmp_path: Path, damage: str
) -> None:
    results = tmp_path / "results"
    shutil.copytree(recorded, results)
    db = results / "orchestrator.db"
    assert not (results / "orchestrator.db-wal").exists()  # closed cleanly: all in the file
    data = db.read_bytes()
    if damage == "truncated":
        db.write_bytes(data[: len(data) // 3])
    else:
        db.write_bytes(b"\x00garbage, not a database" * 50 + data[1200:])
    logs = sorted((results / "logs").glob("*.log"))
    assert len(logs) == 2

    res = cli("runs", "--results", results)
    assert res.returncode == 3, res.stdout + res.stderr
    line = one_error(res.stdout + res.stderr)
    assert f"the results database {db} is unreadable" in line
    assert f"mv {db} {db}.broken" in res.stdout + res.stderr
    before = sd.show("InvocationID")["InvocationID"]
    code, out = bisect(sd, results)
    assert code == 3 and "is unreadable" in one_error(out), out
    untouched(sd, before)
    # The earlier runs' logs are plain files, readable without the database.
    texts = [p.read_text() for p in logs]
    assert any("The server is fired up" in t for t in texts)
    assert any("AttributeError: 'NoneType' object has no attribute 'dtype'" in t for t in texts)


def test_torn_wal_tail_keeps_every_committed_run(recorded: Path, tmp_path: Path) -> None:
    live = tmp_path / "live"
    shutil.copytree(recorded, live)
    # A reader holds the database open, so the writer's WAL is not checkpointed away: a
    # snapshot of the files is what a controller killed mid-write leaves on disk.
    holder = sqlite3.connect(live / "orchestrator.db")
    holder.execute("PRAGMA wal_autocheckpoint=0")
    holder.execute("SELECT count(*) FROM runs").fetchone()
    try:
        store = Store(live)
        try:
            store.db.execute("PRAGMA wal_autocheckpoint=0")
            before = store.runs()
            store.update_campaign(before[0].campaign, status="done")  # a committed write
        finally:
            store.db.close()
        snap = tmp_path / "snap"
        shutil.copytree(live, snap)
    finally:
        holder.close()
    wal = snap / "orchestrator.db-wal"
    assert wal.exists() and wal.stat().st_size > 0
    with open(wal, "ab") as f:  # half a frame of a write that never finished
        f.write(b"\x37" * 2100)
    store = Store(snap)
    try:
        runs = store.runs()
        assert sorted(r.id for r in runs) == sorted(r.id for r in before)
        assert {r.verdict for r in runs} == {Verdict.PASS, Verdict.FAIL}
        assert all(r.log_tail() for r in runs)
    finally:
        store.close()
    res = cli("runs", "--results", snap)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stdout + res.stderr
