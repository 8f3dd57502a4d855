"""The store's record of what a run did on its host (the `run_host` table): an older
database gets the table when it is opened, rows written before it have none, and a
cached run never claims a host action of its own."""

from __future__ import annotations

import functools
import sqlite3
from pathlib import Path

from orchestrator.config.loading import load_experiment
from orchestrator.store.store import Store
from tests.support.run_results import run_result

REPO = Path(__file__).resolve().parents[1]
GOOD = REPO / "experiments" / "lab" / "demo" / "good.yaml"

RECORD = {
    "manager": "systemd",
    "unit": "sglang-lab.service",
    "dropin_path": "/etc/systemd/system/sglang-lab.service.d/99-orchestrator.conf",
    "exec_start": ["python3", "-m", "orchestrator.lab.server", "--port", "30000"],
    "exec_path": "python3",
    "invocation": "0123456789abcdef0123456789abcdef",
    "journal_command": "sudo journalctl _SYSTEMD_INVOCATION_ID=0123456789abcdef0123456789abcdef"
    " --no-pager",
    "host": "lab-systemd",
    "ssh": "ssh -p 22 ubuntu@10.213.255.254",
}


#: a run on the systemd lab host, with the drop-in it wrote
Result = functools.partial(
    run_result,
    host="lab-systemd",
    host_class="lab",
    rendered="[Service]\nExecStart=\nExecStart=python3\n",
)


def test_host_record_round_trips_and_older_databases_get_the_table(tmp_path: Path) -> None:
    exp = load_experiment(GOOD)
    store = Store(tmp_path)
    cid = store.create_campaign(kind="bisect", key="k", command="c", spec={})
    old = store.add_run(cid, variant=(), purpose="endpoint", result=Result(exp))
    store.close()
    # A database from before the table: drop it, as an older version never made it.
    db = sqlite3.connect(tmp_path / "orchestrator.db")
    db.execute("DROP TABLE run_host")
    db.commit()
    db.close()

    # Read-only (`show`, `runs`): nothing is created, and nothing is recorded either.
    ro = Store(tmp_path, readonly=True)
    try:
        assert ro.host_record(old) is None
    finally:
        ro.close()
    # Opened for writing, it gets the table.
    store = Store(tmp_path)
    try:
        assert store.host_record(old) is None  # an older row: nothing recorded, no error
        new = store.add_run(
            cid, variant=(0,), purpose="probe", result=Result(exp, host_record=RECORD)
        )
        cached = store.add_run(
            cid,
            variant=(0,),
            purpose="probe",
            cached_from=new,
            result=Result(exp, host_record=RECORD),
        )
        proc = store.add_run(cid, variant=(1,), purpose="probe", result=Result(exp))
        assert store.host_record(new) == RECORD
        assert store.host_record(cached) is None  # it did nothing on the host
        assert store.host_record(proc) is None
        assert store.run(new).rendered == Result(exp).rendered  # the runs row as before
    finally:
        store.close()
