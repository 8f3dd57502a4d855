"""The results store: atomic commits, the verdict cache, damaged databases, unwritable
directories and private file modes.

The campaign-level checks run real bisections of the b300 lab pair on the sshd host
(short ones: `max_runs` stops them after a few runs). Store-level checks record results
built here, of the shape the executor returns: what is tested is the store itself.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from orchestrator.campaign.bisect import Bisection, BisectOptions
from orchestrator.campaign.planning import make_plan
from orchestrator.cli import main
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict
from orchestrator.errors import StoreError
from orchestrator.events import Event, RunStarted
from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.store.store import Store
from tests.support.campaign_lab import LAB, REPO, cli, lab_pair, load_host, sshd_hosts_file
from tests.support.run_results import run_result

GOOD = LAB / "b300" / "good.yaml"


Result = run_result  # what the store records of a run


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextmanager
def umask(value: int) -> Iterator[None]:
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


# ---- store level ------------------------------------------------------------------------------


def test_infra_is_never_reused_from_the_cache(tmp_path: Path) -> None:
    exp = load_experiment(GOOD)
    store = Store(tmp_path / "results")
    cid = store.create_campaign(kind="bisect", key="k", command="test", spec={})
    store.add_run(
        cid,
        variant=(),
        purpose="endpoint",
        result=Result(exp, Verdict.INFRA, detail="ssh: connection reset"),
    )
    assert store.cached(exp.fingerprint(), "b300") is None
    rid = store.add_run(cid, variant=(), purpose="endpoint", result=Result(exp, Verdict.PASS))
    hit = store.cached(exp.fingerprint(), "b300")
    assert hit is not None and hit.id == rid
    # later infra results do not hide the real verdict, nor replace it
    store.add_run(cid, variant=(), purpose="endpoint", result=Result(exp, Verdict.INFRA))
    assert store.cached(exp.fingerprint(), "b300").id == rid  # type: ignore[union-attr]
    # the cache is per host class, and per config
    assert store.cached(exp.fingerprint(), "rtx-pro-6000") is None
    other = exp.with_changes(flags={"ep-size": 8})
    assert store.cached(other.fingerprint(), "b300") is None
    store.close()


def test_run_rows_and_log_files_survive_reopening(tmp_path: Path) -> None:
    exp = load_experiment(GOOD)
    sig = Signature(Phase.INIT, "AttributeError", "'NoneType' object has no attribute 'dtype'")
    store = Store(tmp_path / "results")
    cid = store.create_campaign(kind="bisect", key="k", command="test", spec={"x": 1})
    result = Result(exp, Verdict.OTHER, sig, log_tail="line 1\nboom\n")
    rid = store.add_run(cid, variant=(2, 0), purpose="search", result=result)
    store.close()
    again = Store(tmp_path / "results")
    row = again.run(rid)
    assert (row.variant, row.verdict, row.signature) == ((0, 2), Verdict.OTHER, sig)
    assert row.experiment().fingerprint() == exp.fingerprint()  # the full config, as run
    assert row.argv == list(exp.argv())
    assert row.log_tail() == "line 1\nboom\n"
    assert [r.id for r in again.runs_with_signature(sig)] == [rid]
    # found as the signature compares: another type of one message is one failure
    retyped = Signature(Phase.INIT, "TypeError", sig.message)
    assert [r.id for r in again.runs_with_signature(retyped)] == [rid]
    assert (
        again.runs_with_signature(Signature(Phase.LOAD_WEIGHTS, sig.error_class, sig.message)) == []
    )
    assert again.runs_with_signature(Signature(Phase.INIT, sig.error_class, "other")) == []
    # no temporary file is left beside the log
    assert sorted(p.name for p in (tmp_path / "results" / "logs").iterdir()) == [f"{rid}.log"]
    again.close()


@pytest.mark.parametrize("damage", ["header cut", "first page only", "half", "overwritten"])
def test_damaged_database_is_a_clear_store_error_and_logs_stay_readable(
    tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "results"
    exp = load_experiment(GOOD)
    store = Store(results)
    cid = store.create_campaign(kind="bisect", key="k", command="test", spec={"pad": "x" * 9000})
    for i in range(1, 21):  # a few pages of rows; run N's log says N
        result = Result(exp, Verdict.PASS, log_tail=f"log of run {i}\n" * 50)
        store.add_run(cid, variant=(i,), purpose="search", result=result)
    log_file = Path(store.run(f"{cid}.7").log_path or "")
    store.close()
    db = results / "orchestrator.db"
    assert not (results / "orchestrator.db-wal").exists()  # checkpointed at close
    data = db.read_bytes()
    assert len(data) > 3 * 4096
    cut = {
        "header cut": data[:60],
        "first page only": data[:4096],
        "half": data[: len(data) // 2],
        "overwritten": b"\x00garbage" * (len(data) // 8),
    }[damage]
    db.write_bytes(cut)

    with pytest.raises(StoreError) as err:
        Store(results)
    message = str(err.value)
    assert message.startswith(f"the results database {db} is unreadable: ")
    assert "\n" not in message
    assert err.value.hint and f"mv {db} {db}.broken" in err.value.hint
    assert "log files" in err.value.hint
    assert log_file.read_text() == "log of run 7\n" * 50  # the plain logs are intact

    # The CLI says the same in one line (plus the hint), exit 3, no traceback (its `main`,
    # in this process: an exception it let through would fail the test here).
    capsys.readouterr()
    code = main(["runs", "--results", str(results)])
    out, err = capsys.readouterr()
    assert code == 3
    assert "Traceback" not in err + out
    lines = err.strip().splitlines()
    assert lines[0] == f"error: {message}"
    assert lines[1].strip().startswith("hint: move it aside")
    assert len(lines) == 2

    # Moved aside as the hint says, a new store starts (in the same process: no lock left).
    db.rename(db.with_name("orchestrator.db.broken"))
    fresh = Store(results)
    assert fresh.campaigns() == []
    fresh.close()


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    """`path` read-only even for root: a read-only bind mount (or, not root, mode 0555)."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(0o755)
        return
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True, timeout=30)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True, timeout=30)
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True, timeout=30)


def test_read_only_results_dir_is_refused_before_any_host_is_touched(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    pair = lab_pair(tmp_path, "b300")
    hosts = sshd_hosts_file(sshd, tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    existing = ro / "results"
    Store(existing).close()  # a results dir from before, now on a read-only mount
    with read_only(ro):
        for results in (existing, ro / "new-results"):
            with pytest.raises(StoreError) as err:
                Store(results)
            assert str(err.value).startswith(f"cannot write results to {results}: ")
            assert err.value.hint and "--results DIR" in err.value.hint
            res = cli(
                "bisect",
                "--good",
                pair.good,
                "--bad",
                pair.bad,
                "--host",
                "lab",
                "--hosts",
                hosts,
                "--results",
                results,
                timeout=120,
            )
            assert res.returncode == 3, res.stdout + res.stderr
            assert res.stderr.startswith(f"error: cannot write results to {results}: ")
            assert "Traceback" not in res.stderr
    # Nothing happened on the host: no run dir, no lock, no launch script.
    assert not (tmp_path / "run").exists()


# ---- campaign level, on the sshd host ---------------------------------------------------------


def test_commits_cache_fresh_and_private_modes(sshd: SshdEndpoint, tmp_path: Path) -> None:
    """One short campaign records each run before the next starts; a second one reuses
    its verdicts, `fresh` does not; an infra record is not reused; files are private."""
    pair = lab_pair(tmp_path, "b300")
    host = load_host(sshd_hosts_file(sshd, tmp_path), "lab")
    plan = make_plan(str(pair.good), str(pair.bad), "auto")
    results = tmp_path / "results"
    with umask(0o022):  # what a user's shell typically has: the store must not rely on it
        store = Store(results)
    # A host-trouble record of the good config exists: it must not stand in for a verdict.
    scratch = store.create_campaign(kind="run", key="scratch", command="test", spec={})
    store.add_run(
        scratch,
        variant=(),
        purpose="run",
        result=Result(
            plan.good,
            Verdict.INFRA,
            host="lab",
            host_class=host.host_class,
            detail="ssh: connection reset",
        ),
    )

    seen: list[tuple[int, bool]] = []

    def committed_when_next_starts(event: Event) -> None:
        # Another connection, as another process would see the database.
        con = sqlite3.connect(f"file:{results / 'orchestrator.db'}?mode=ro", uri=True)
        try:
            rows = con.execute(
                "SELECT id, log_path FROM runs WHERE campaign != ?", (scratch,)
            ).fetchall()
        finally:
            con.close()
        logs_ok = all(lp is None or Path(lp).is_file() for _, lp in rows)
        seen.append((len(rows), logs_ok))

    def listener(event: Event) -> None:
        if isinstance(event, RunStarted):
            committed_when_next_starts(event)

    first = Bisection(
        store, plan, [host], options=BisectOptions(max_runs=3), listener=listener, command="test"
    ).run()
    assert first.status == "incomplete" and "--max-runs 3" in first.message
    runs1 = store.runs(first.campaign_id)
    assert len(runs1) == 3 and all(r.cached_from is None for r in runs1)
    assert runs1[0].label == "good" and runs1[0].verdict is Verdict.PASS  # ran, despite infra
    # At each run's start every earlier run was committed (row and log file).
    assert seen == [(0, True), (1, True), (2, True)]

    # A second campaign of the same pair reuses the three verdicts, then runs on.
    second = Bisection(store, plan, [host], options=BisectOptions(max_runs=1), command="test").run()
    assert second.campaign_id != first.campaign_id
    runs2 = store.runs(second.campaign_id)
    assert [r.cached_from for r in runs2[:3]] == [r.id for r in runs1]
    assert [(r.variant, r.verdict, r.signature) for r in runs2[:3]] == [
        (r.variant, r.verdict, r.signature) for r in runs1
    ]
    assert len(runs2) == 4 and runs2[3].cached_from is None
    assert (second.runs_reused, second.runs_executed) == (3, 1)

    # fresh: nothing reused
    third = Bisection(
        store, plan, [host], options=BisectOptions(max_runs=1, fresh=True), command="test"
    ).run()
    runs3 = store.runs(third.campaign_id)
    assert [r.cached_from for r in runs3] == [None]
    assert (third.runs_reused, third.runs_executed) == (0, 1)

    # Private: the directory tree 0700, every file 0600 (database, WAL, logs, reports).
    from orchestrator.reports.report import write_reports

    write_reports(store, first.campaign_id)
    files = [p for p in results.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {
        "orchestrator.db",
        "orchestrator.db-wal",
        "orchestrator.db-shm",
    }
    assert any(p.suffix == ".log" for p in files) and any(p.suffix == ".html" for p in files)
    assert {str(p.relative_to(results)): oct(mode(p)) for p in files if mode(p) != 0o600} == {}
    dirs = [results, *(p for p in results.rglob("*") if p.is_dir())]
    assert {str(p): oct(mode(p)) for p in dirs if mode(p) != 0o700} == {}
    store.close()
    shutil.rmtree(results)


def test_a_store_opened_beside_another_keeps_the_database_locked_for_other_processes(
    tmp_path: Path,
) -> None:
    """A process's stores share its POSIX locks on the database file, and closing any
    descriptor of the file drops them all: a second store must not open and close the file
    itself. Else another process finds the database unused: its last connection deletes
    the WAL the first store still writes to (seen as "database disk image is malformed"
    and "disk I/O error" with a pool's threads and a bisection writing at once)."""
    first = Store(tmp_path)
    first.create_campaign(kind="bisect", key="k", command="c", spec={})
    second = Store(tmp_path)
    wal = tmp_path / "orchestrator.db-wal"
    assert wal.exists()
    reader = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
        "c.execute('SELECT count(*) FROM runs').fetchone(); c.close()"
    )
    other = subprocess.run(
        [sys.executable, "-c", reader, str(tmp_path / "orchestrator.db")],
        capture_output=True,
        text=True,
    )
    assert other.returncode == 0, other.stderr
    assert wal.exists(), "another process took the database for unused and removed its WAL"
    first.create_campaign(kind="bisect", key="k2", command="c", spec={})
    second.close()
    first.close()
    assert [c.key for c in Store(tmp_path).campaigns(10)] == ["k2", "k"]


def test_two_processes_creating_and_writing_one_database_at_once(tmp_path: Path) -> None:
    """Both processes create the database at the same moment, with two threads each opening
    stores while a third writes: no error, and the database stays whole."""
    code = (
        "import sys, threading, time\n"
        "from orchestrator.store.store import Store\n"
        "root, role = sys.argv[1], sys.argv[2]; errors = []\n"
        "def writer():\n"
        "    try:\n"
        "        s = Store(root)\n"
        "        for i in range(40):\n"
        "            s.update_campaign(s.create_campaign(kind='bisect', key=f'{role}{i}',\n"
        "                              command='c', spec={}), status='done')\n"
        "    except Exception as e: errors.append(repr(e))\n"
        "def opener():\n"
        "    try:\n"
        "        for _ in range(15): Store(root).close()\n"
        "    except Exception as e: errors.append(repr(e))\n"
        "ts = [threading.Thread(target=f) for f in (writer, opener, opener)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "print(errors); sys.exit(1 if errors else 0)\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path), role],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for role in "AB"
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    store = Store(tmp_path)
    assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert len(store.campaigns(200)) == 80


class _InterruptedAt:
    """The store's connection, with a Ctrl-C landing just before one statement runs (a
    signal handler raises between two statements of the store's own code)."""

    def __init__(self, db: sqlite3.Connection, statement: str) -> None:
        self._db, self._statement = db, statement

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        if sql == self._statement:
            self._statement = ""
            raise KeyboardInterrupt
        return self._db.execute(sql, *args)

    def __getattr__(self, name: str) -> object:
        return getattr(self._db, name)


@pytest.mark.parametrize("where", ["COMMIT", "left open"])
def test_a_write_cut_short_by_an_interrupt_leaves_the_store_writable(
    tmp_path: Path, where: str
) -> None:
    # a Ctrl-C between BEGIN and COMMIT left the transaction open: every later write (the
    # campaign's `interrupted`) failed "cannot start a transaction within a transaction"
    store = Store(tmp_path / "results")
    db = store.db
    if where == "COMMIT":
        store.db = _InterruptedAt(db, "COMMIT")  # type: ignore[assignment]
        with pytest.raises(KeyboardInterrupt):
            store.create_campaign(kind="bisect", key="k", command="test", spec={})
        store.db = db
    else:
        db.execute("BEGIN IMMEDIATE")  # what an interrupt just after BEGIN leaves
    assert store.campaigns() == []  # the write cut short is not half kept
    cid = store.create_campaign(kind="bisect", key="k", command="test", spec={})
    assert [c.id for c in store.campaigns()] == [cid] and not db.in_transaction
    store.close()
