"""The results store: campaigns and runs in SQLite (WAL) under `results/`, plus each run's
log tail as a plain file beside the database (for grep).

Writes are atomic: a run's log file is written to a temporary name and renamed, then its
row is inserted in one transaction, before the next run starts. The store serves resume
(a campaign's own runs), the cache (every start of the same launch: the config and what
reached its server, `launch_key`; see orchestrator.execution.inputs) and rerun (the exact
recorded config). Files are created private (mode 0600, dir 0700).
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay, wait_random

from orchestrator.config.experiment import Experiment
from orchestrator.config.secrets import Redactor
from orchestrator.diagnosis.verdicts import Signature, Verdict
from orchestrator.errors import StoreError
from orchestrator.execution.contract import RunResultLike
from orchestrator.execution.environment import HostEnvironment
from orchestrator.execution.inputs import LaunchInputs
from orchestrator.store.rows import (
    CampaignRow,
    EnvironmentSeen,
    RunRow,
    campaign_row,
    run_row,
)

#: held while a store of this process creates its database file and connects to it (see
#: Store.__init__)
_CREATING = threading.Lock()

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS campaigns (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    status TEXT NOT NULL,
    command TEXT NOT NULL,
    spec TEXT NOT NULL,
    target TEXT,
    answer TEXT
);
CREATE INDEX IF NOT EXISTS campaigns_key ON campaigns(key, status);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    campaign TEXT NOT NULL REFERENCES campaigns(id),
    seq INTEGER NOT NULL,
    variant TEXT NOT NULL,
    label TEXT NOT NULL,
    purpose TEXT NOT NULL,
    host TEXT NOT NULL,
    host_class TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    config TEXT NOT NULL,
    argv TEXT NOT NULL,
    env TEXT NOT NULL,
    rendered TEXT,
    verdict TEXT NOT NULL,
    signature TEXT,
    started REAL NOT NULL,
    duration REAL NOT NULL,
    phase_times TEXT NOT NULL,
    last_phase TEXT,
    probe_metric REAL,
    detail TEXT NOT NULL,
    log_path TEXT,
    cached_from TEXT,
    UNIQUE (campaign, seq)
);
CREATE INDEX IF NOT EXISTS runs_cache ON runs(fingerprint, host_class, verdict);
CREATE INDEX IF NOT EXISTS runs_signature ON runs(signature);
-- What a run did on its host (systemd: drop-in path, ExecStart read back, InvocationID,
-- journalctl command), as JSON; added later, so created here on open of older databases.
CREATE TABLE IF NOT EXISTS run_host (
    run_id TEXT PRIMARY KEY REFERENCES runs(id),
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS environments (digest TEXT PRIMARY KEY, data TEXT NOT NULL);
"""

#: columns added after the first schema, with the statement that adds each (migrated on open)
_ADDED_COLUMNS = {
    ("runs", "env_digest"): "ALTER TABLE runs ADD COLUMN env_digest TEXT",
    # who runs the campaign (user@machine, pid; the log of a detached one), as JSON
    ("campaigns", "controller"): "ALTER TABLE campaigns ADD COLUMN controller TEXT",
    # what reached the server besides its config, and the cache key made of both
    ("runs", "inputs"): "ALTER TABLE runs ADD COLUMN inputs TEXT",
    ("runs", "launch_key"): "ALTER TABLE runs ADD COLUMN launch_key TEXT",
    # which weights the server loaded: real (the checkpoint; NULL in older rows) or dummy
    ("runs", "weights"): "ALTER TABLE runs ADD COLUMN weights TEXT",
    # the repair move a start carried (a variant started again after a resource failure),
    # as JSON (orchestrator.planner.repair.Applied); NULL: the variant as planned
    ("runs", "repair"): "ALTER TABLE runs ADD COLUMN repair TEXT",
    # what the server answered to the answers check, and how it was judged against the
    # good config's answers (orchestrator.execution.answers), as JSON; NULL: not asked
    ("runs", "answers"): "ALTER TABLE runs ADD COLUMN answers TEXT",
}


def default_root() -> Path:
    return Path(os.environ.get("ORCH_RESULTS", "results"))


class Store:
    def __init__(
        self, root: str | Path | None = None, *, readonly: bool = False, create: bool = True
    ) -> None:
        """`readonly`: for commands that only read; `create=False`: for commands that write
        to recorded campaigns (rerun, report, resume): neither makes a results directory
        that is not there (`created` says whether this one made it)."""
        self.root = Path(root) if root is not None else default_root()
        self.db_path = self.root / "orchestrator.db"
        self.logs = self.root / "logs"
        #: every secret value seen so far is replaced by a marker before anything is written
        self._secrets: dict[str, str] = {}
        self.redact = Redactor()
        #: campaign -> the last run sequence number handed out by reserve_run_id
        self._reserved: dict[str, int] = {}
        #: added to the controller of each campaign this process runs (a detached one's log)
        self.controller_note: dict[str, Any] = {}
        #: the campaigns this process has run (created or resumed), in order
        self.controlled: list[str] = []
        self.readonly = readonly
        self.created = False
        if readonly:
            self._open_readonly()
            return
        if not create and not self.db_path.is_file():
            raise self._missing()
        self.created = not self.db_path.exists()
        self._check_writable()
        try:
            self._connect()
        except sqlite3.DatabaseError as exc:
            # Closed, or the half-open connection keeps a lock and the next Store of this
            # process (the user moved the broken file aside) reports "database is locked".
            db = getattr(self, "db", None)
            if db is not None:
                db.close()
            if isinstance(exc, sqlite3.OperationalError) and (
                "full" in str(exc) or "readonly" in str(exc)
            ):
                # Past the write probe, yet no room (or no right) for the database: the
                # directory is the problem, not a damaged file to move aside.
                raise StoreError(
                    f"cannot write results to {self.root}: {exc}",
                    hint="free some space or make the directory writable, or choose another "
                    "with --results DIR (or ORCH_RESULTS)",
                ) from exc
            raise self._unreadable(exc) from exc
        try:
            os.chmod(self.db_path, 0o600)
        except OSError:
            pass

    def _connect(self) -> None:
        """Connect, and make or bring up to date the schema. Two processes opening a new
        database at once can be told "database is locked" at once (SQLite waits for no
        lock while a database turns to WAL): the opening is tried again, for up to 30 s."""

        def busy(exc: BaseException) -> bool:
            return isinstance(exc, sqlite3.OperationalError) and (
                "locked" in str(exc) or "busy" in str(exc)
            )

        def close(_state: RetryCallState) -> None:
            db = getattr(self, "db", None)
            if db is not None:
                db.close()

        Retrying(
            retry=retry_if_exception(busy),
            stop=stop_after_delay(30),
            wait=wait_random(0.05, 0.15),
            before_sleep=close,
            reraise=True,
        )(self._open_and_set_up)

    def _open_and_set_up(self) -> None:
        with _CREATING:
            # Created private before SQLite opens it: SQLite gives the -wal and -shm files it
            # creates the database file's mode, so a database created by connect() (umask
            # mode, chmod-ed later) would leave a world-readable WAL holding every new row.
            # Only when it does not exist yet (O_EXCL), and with no other store of this
            # process connecting meanwhile: closing a descriptor of the file drops every
            # POSIX lock this process holds on it, the locks other stores' connections (a
            # pool's threads) keep their transactions safe from other processes with (the
            # database was seen damaged that way).
            try:
                os.close(os.open(self.db_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except OSError:
                pass  # it exists, or connect() reports why it cannot be made
            self.db = sqlite3.connect(self.db_path, timeout=30, isolation_level=None)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.executescript(_SCHEMA)
        self._migrate()
        self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        self._upgrade_signatures()
        self.db.execute("SELECT count(*) FROM runs").fetchone()

    def _migrate(self) -> None:
        """Add the columns a database created by an older version lacks."""
        for (table, column), statement in _ADDED_COLUMNS.items():
            have = {r["name"] for r in self.db.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                try:
                    self.db.execute(statement)
                except sqlite3.OperationalError as exc:
                    if "duplicate column" not in str(exc):  # another process added it first
                        raise
        self.db.execute("CREATE INDEX IF NOT EXISTS runs_launch ON runs(launch_key)")

    def _unreadable(self, exc: Exception | None) -> StoreError:
        return StoreError(
            f"the results database {self.db_path} is unreadable: {exc}",
            hint=f"move it aside (mv {self.db_path} {self.db_path}.broken) to start a new "
            "one; the plain log files under logs/ are kept",
        )

    def _missing(self) -> StoreError:
        return StoreError(
            f"no results in {self.root} (no {self.db_path.name} there)",
            hint="pass the results directory of your campaigns with "
            "--results DIR (or ORCH_RESULTS)",
        )

    def _open_readonly(self) -> None:
        """For commands that only read (runs, show, classify): nothing is created, and a
        results directory on a read-only mount works."""
        if not self.db_path.is_file():
            raise self._missing()
        uri = self.db_path.resolve().as_uri()
        last: Exception | None = None
        # mode=ro needs the WAL's -shm file to exist or be creatable; on a read-only mount
        # nobody writes the database, so it can be read as immutable instead.
        for query in ("mode=ro", "immutable=1"):
            try:
                self.db = sqlite3.connect(
                    f"{uri}?{query}", uri=True, timeout=30, isolation_level=None
                )
                self.db.row_factory = sqlite3.Row
                self.db.execute("SELECT count(*) FROM runs").fetchone()
                return
            except sqlite3.DatabaseError as exc:
                last = exc
                self.db.close()
        raise self._unreadable(last)

    def _check_writable(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.logs.mkdir(exist_ok=True, mode=0o700)
            # named by process and thread: two stores opened at once in one process (a
            # pool's threads) must not remove each other's probe
            probe = self.root / f".write-test-{os.getpid()}-{threading.get_ident()}"
            with open(probe, "wb") as fh:
                fh.write(b"x" * 65536)  # a full disk shows here, before any host is touched
                fh.flush()
                os.fsync(fh.fileno())
            probe.unlink()
        except OSError as exc:
            raise StoreError(
                f"cannot write results to {self.root}: {exc.strerror or exc}",
                hint="free some space or make the directory writable, or choose another "
                "with --results DIR (or ORCH_RESULTS)",
            ) from exc

    def add_secrets(self, secrets: dict[str, str]) -> None:
        if any(self._secrets.get(k) != v for k, v in secrets.items()):
            self._secrets.update(secrets)
            self.redact = Redactor(self._secrets)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        try:
            if self.db.in_transaction:
                # one a Ctrl-C cut short between its BEGIN and its COMMIT: never committed,
                # and the record of the interrupt must still be written
                self.db.execute("ROLLBACK")
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:  # an interrupt just before COMMIT too
                    self.db.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:
            raise StoreError(
                f"cannot write to {self.db_path}: {exc}",
                hint="is the disk full or the directory read-only?",
            ) from exc

    def close(self) -> None:
        self.db.close()

    # ---- campaigns
    def create_campaign(self, *, kind: str, key: str, command: str, spec: dict[str, Any]) -> str:
        for _ in range(20):
            cid = secrets.token_hex(3)
            if self.db.execute("SELECT 1 FROM campaigns WHERE id=?", (cid,)).fetchone() is None:
                break
        now = time.time()
        with self._tx() as db:
            db.execute(
                "INSERT INTO campaigns (id, kind, key, created, updated, status, command, spec)"
                " VALUES (?,?,?,?,?,?,?,?)",
                (
                    cid,
                    kind,
                    key,
                    now,
                    now,
                    "running",
                    self.redact.text(command),
                    json.dumps(self.redact.obj(spec)),
                ),
            )
        return cid

    def find_resumable(self, key: str) -> str | None:
        """The newest campaign of `key` that the same command goes on with: one running
        (its controller died), interrupted, or stopped on an error (host trouble, fixed)."""
        row = self.db.execute(
            "SELECT id FROM campaigns WHERE key=? AND status IN ('running','interrupted',"
            "'error') "
            "ORDER BY created DESC LIMIT 1",
            (key,),
        ).fetchone()
        return row["id"] if row else None

    def latest_campaign(self, key: str, before: float | None = None) -> CampaignRow | None:
        """The newest campaign with this key (created before `before`), whatever its status."""
        row = self.db.execute(
            "SELECT * FROM campaigns WHERE key=? AND created < ? ORDER BY created DESC LIMIT 1",
            (key, float("inf") if before is None else before),
        ).fetchone()
        return campaign_row(row) if row else None

    def update_campaign(self, cid: str, **fields: Any) -> None:
        cols, vals = [], []
        for k, v in fields.items():
            if k in ("spec", "answer", "controller") and v is not None:
                v = json.dumps(self.redact.obj(v))
            if k == "target" and isinstance(v, Signature):
                v = v.key()
            cols.append(f"{k}=?")
            vals.append(v)
        cols.append("updated=?")
        vals.append(time.time())
        with self._tx() as db:
            db.execute(f"UPDATE campaigns SET {', '.join(cols)} WHERE id=?", (*vals, cid))

    def campaign(self, cid: str) -> CampaignRow:
        """A campaign by id, or by a prefix of its id that names only one."""
        from orchestrator.errors import UsageError

        row = self.db.execute("SELECT * FROM campaigns WHERE id=?", (cid,)).fetchone()
        if row is None and cid:
            # literal prefix: substr, not LIKE (where % and _ match anything)
            rows = self.db.execute(
                "SELECT * FROM campaigns WHERE substr(id, 1, ?) = ? ORDER BY created DESC",
                (len(cid), cid),
            ).fetchall()
            if len(rows) > 1:
                raise UsageError(
                    f"ambiguous prefix '{cid}': " + ", ".join(r["id"] for r in rows[:10]),
                    hint="give more of the campaign id",
                )
            row = rows[0] if rows else None
        if row is None:
            raise UsageError(
                f"no campaign '{cid}' in {self.db_path}",
                hint="`orchestrator runs --campaigns` lists them",
            )
        return campaign_row(row)

    def campaigns(self, limit: int = 50) -> list[CampaignRow]:
        rows = self.db.execute(
            "SELECT * FROM campaigns ORDER BY created DESC LIMIT ?", (limit,)
        ).fetchall()
        return [campaign_row(r) for r in rows]

    # ---- runs
    def next_seq(self, cid: str) -> int:
        row = self.db.execute("SELECT max(seq) AS m FROM runs WHERE campaign=?", (cid,)).fetchone()
        return (row["m"] or 0) + 1

    def reserve_run_id(self, cid: str) -> str:
        """The id the next run of this campaign is stored under, handed out when the run
        starts: runs on a pool finish in any order, and the id announced live must be the
        stored one. A run that never records (cancelled) leaves its number unused."""
        seq = max(self.next_seq(cid), self._reserved.get(cid, 0) + 1)
        self._reserved[cid] = seq
        return f"{cid}.{seq}"

    def add_run(
        self,
        cid: str,
        *,
        variant: tuple[int, ...],
        purpose: str,
        result: RunResultLike,
        cached_from: str | None = None,
        run_id: str | None = None,  # reserved with reserve_run_id when the run started
        repair: dict[str, Any] | None = None,  # the repair move the start carried
    ) -> str:
        exp: Experiment = result.experiment
        self.add_secrets(exp.secrets())
        red = self.redact
        run_id = run_id or self.reserve_run_id(cid)
        seq = int(run_id.rsplit(".", 1)[1])
        log_path = None
        if result.log_tail:
            log_path = self.logs / f"{run_id}.log"
            tmp = log_path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(red.text(result.log_tail) or "")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, log_path)
        with self._tx() as db:
            db.execute(
                "INSERT INTO runs (id, campaign, seq, variant, label, purpose, host, host_class,"
                " fingerprint, config, argv, env, rendered, verdict, signature, started, duration,"
                " phase_times, last_phase, probe_metric, detail, log_path, cached_from)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    cid,
                    seq,
                    json.dumps(sorted(variant)),
                    red.text(result.label),
                    purpose,
                    result.host,
                    result.host_class,
                    exp.fingerprint(),
                    json.dumps(red.obj(exp.to_dict())),
                    json.dumps(red.obj(exp.argv())),
                    json.dumps(red.obj(exp.env_map())),
                    red.text(result.rendered),
                    result.verdict.value,
                    result.signature.key() if result.signature else None,
                    result.started_at,
                    result.duration_s,
                    json.dumps(dict(result.phase_times)),
                    result.last_phase.value if result.last_phase else None,
                    result.probe_metric,
                    red.text(result.detail),
                    str(log_path) if log_path else None,
                    cached_from,
                ),
            )
            record = result.host_record
            if record and cached_from is None:
                db.execute(
                    "INSERT INTO run_host (run_id, record) VALUES (?, ?)",
                    (run_id, json.dumps(red.obj(record))),
                )
            self._record_environment(db, run_id, result.environment, cached_from)
            inputs = result.inputs
            if inputs is not None:
                db.execute(
                    "UPDATE runs SET inputs=?, launch_key=? WHERE id=?",
                    (
                        json.dumps(inputs.to_dict(), sort_keys=True),
                        inputs.key(exp.fingerprint()),
                        run_id,
                    ),
                )
            db.execute("UPDATE runs SET weights=? WHERE id=?", (exp.weights, run_id))
            if repair is not None:
                db.execute(
                    "UPDATE runs SET repair=? WHERE id=?",
                    (json.dumps(repair, sort_keys=True), run_id),
                )
            answers = getattr(result, "answers", None)
            if answers is not None:
                db.execute(
                    "UPDATE runs SET answers=? WHERE id=?",
                    (json.dumps(red.obj(answers), sort_keys=True), run_id),
                )
            self._stamp_signature_version(db, run_id)
        return run_id

    def host_record(self, run_id: str) -> dict[str, Any] | None:
        """What the run did on its host (see executor.RunResult.host_record), or None."""
        try:
            row = self.db.execute(
                "SELECT record FROM run_host WHERE run_id=?", (run_id,)
            ).fetchone()
        except sqlite3.OperationalError:
            # An older database opened read-only (`show`): nobody created the table yet.
            return None
        return json.loads(row["record"]) if row else None

    # ---- environments
    def _record_environment(
        self, db: sqlite3.Connection, run_id: str, env: Any, cached_from: str | None
    ) -> None:
        """The run's environment (deduplicated by digest); a cache hit keeps its source's."""
        if env is not None:
            digest = env.digest()
            db.execute(
                "INSERT OR IGNORE INTO environments VALUES (?, ?)",
                (digest, json.dumps(self.redact.obj(env.to_dict()), sort_keys=True)),
            )
            db.execute("UPDATE runs SET env_digest=? WHERE id=?", (digest, run_id))
        elif cached_from is not None:
            db.execute(
                "UPDATE runs SET env_digest=(SELECT env_digest FROM runs WHERE id=?) WHERE id=?",
                (cached_from, run_id),
            )

    def environment(self, digest: str | None) -> HostEnvironment | None:
        if not digest:
            return None
        try:
            row = self.db.execute(
                "SELECT data FROM environments WHERE digest=?", (digest,)
            ).fetchone()
        except sqlite3.OperationalError:  # an older database opened read-only: no such table
            return None
        return HostEnvironment.from_dict(json.loads(row["data"])) if row else None

    def campaign_environments(self, cid: str) -> list[EnvironmentSeen]:
        """Each host's environments in the order the campaign's runs saw them: one entry per
        host unless the environment changed during the campaign."""
        seen: list[EnvironmentSeen] = []
        for r in self.runs(cid):
            if not r.env_digest:
                continue
            mine = [s for s in seen if s.host == r.host]
            if mine and mine[-1].digest == r.env_digest:
                mine[-1].runs.append(r.id)
                continue
            env = self.environment(r.env_digest)
            if env is not None:
                seen.append(EnvironmentSeen(r.host, r.env_digest, env, [r.id]))
        return seen

    def first_environment(self, cid: str, host: str) -> tuple[str, HostEnvironment] | None:
        """The environment (digest, environment) this campaign's first run on `host` that
        recorded one saw: the first entry of `campaign_environments` for that host, read
        without decoding the campaign's other runs (it is asked at every run recorded)."""
        rows = self.db.execute(
            "SELECT env_digest FROM runs WHERE campaign=? AND host=? AND env_digest IS NOT NULL"
            " AND env_digest != '' ORDER BY seq",
            (cid, host),
        )
        for r in rows:
            env = self.environment(r["env_digest"])
            if env is not None:
                return r["env_digest"], env
        return None

    def first_inputs(self, cid: str, host: str) -> LaunchInputs | None:
        """What reached the server of this campaign's first run on `host` that recorded it."""
        row = self.db.execute(
            "SELECT inputs FROM runs WHERE campaign=? AND host=? AND inputs IS NOT NULL"
            " AND inputs != '' ORDER BY seq LIMIT 1",
            (cid, host),
        ).fetchone()
        return LaunchInputs.from_dict(json.loads(row["inputs"])) if row else None

    def first_file_digests(self, cid: str, host: str, paths: list[str]) -> dict[str, str]:
        """path -> the digest this campaign's first run on `host` that read the file at
        `path` saw (`LaunchInputs.named`), for those of `paths` some run read: the
        campaign's other runs are not decoded (it is asked at every run recorded)."""
        if not paths:
            return {}
        marks = ",".join("?" * len(paths))
        # SQLite takes the row of MIN(seq) for the bare column of an aggregate query
        rows = self.db.execute(
            "SELECT f.key AS path, f.value AS digest, MIN(runs.seq) FROM runs, json_each("
            "CASE WHEN json_valid(runs.inputs) THEN runs.inputs ELSE '{}' END, '$.named') AS f "
            f"WHERE runs.campaign=? AND runs.host=? AND f.key IN ({marks}) GROUP BY f.key",
            (cid, host, *paths),
        )
        return {r["path"]: r["digest"] for r in rows}

    def latest_env_digest(self, host: str) -> str | None:
        """The environment the newest run on this host (any campaign) saw."""
        row = self.db.execute(
            "SELECT env_digest FROM runs WHERE host=? AND env_digest IS NOT NULL AND "
            "cached_from IS NULL ORDER BY started DESC LIMIT 1",
            (host,),
        ).fetchone()
        return row["env_digest"] if row else None

    def runs(self, cid: str | None = None, limit: int = 1000) -> list[RunRow]:
        if cid:
            rows = self.db.execute("SELECT * FROM runs WHERE campaign=? ORDER BY seq", (cid,))
        else:
            rows = self.db.execute("SELECT * FROM runs ORDER BY started DESC LIMIT ?", (limit,))
        return [run_row(r) for r in rows.fetchall()]

    def judged_count(self, cid: str) -> int:
        """How many of this campaign's runs have a verdict (are not `infra`), counted
        without decoding them (it is told at every run recorded)."""
        row = self.db.execute(
            "SELECT count(*) AS n FROM runs WHERE campaign=? AND verdict!=?",
            (cid, Verdict.INFRA.value),
        ).fetchone()
        return int(row["n"])

    def run(self, run_id: str) -> RunRow:
        row = self.db.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        if row is None:
            from orchestrator.errors import UsageError

            raise UsageError(
                f"no run '{run_id}' in {self.db_path}", hint="`orchestrator runs` lists the runs"
            )
        return run_row(row)

    def cached(
        self, fingerprint: str, host_class: str, env_digest: str | None = None
    ) -> RunRow | None:
        """The newest real (not itself cached) run of this config on this host class,
        infra verdicts excluded: they say nothing about the config. With `env_digest`,
        only a run in that environment. For looking at the store: campaigns reuse only
        through `reusable` (the whole key, read on the host)."""
        env_clause = " AND env_digest=?" if env_digest else ""
        row = self.db.execute(
            "SELECT * FROM runs WHERE fingerprint=? AND host_class=? AND verdict != 'infra'"
            f" AND cached_from IS NULL{env_clause} ORDER BY started DESC LIMIT 1",
            (fingerprint, host_class, *([env_digest] if env_digest else [])),
        ).fetchone()
        return run_row(row) if row else None

    def reuse_candidates(
        self, fingerprint: str, host_class: str, *, exclude_campaign: str | None = None
    ) -> set[str]:
        """The runs of this config on this host class that some inputs could reuse (cheap:
        asked before the host is asked for the inputs it has now)."""
        rows = self.db.execute(
            "SELECT id FROM runs WHERE fingerprint=? AND host_class=? AND launch_key IS NOT NULL"
            " AND verdict != 'infra' AND cached_from IS NULL AND campaign != ?",
            (fingerprint, host_class, exclude_campaign or ""),
        ).fetchall()
        return {r["id"] for r in rows}

    def recorded_launches(
        self, host_class: str, *, exclude_campaign: str | None = None
    ) -> list[tuple[tuple[int, ...], str]]:
        """(variant, fingerprint) of every launch on this host class that some inputs could
        reuse: what earlier campaigns recorded."""
        rows = self.db.execute(
            "SELECT DISTINCT variant, fingerprint FROM runs WHERE host_class=? AND launch_key IS"
            " NOT NULL AND verdict != 'infra' AND cached_from IS NULL AND campaign != ?",
            (host_class, exclude_campaign or ""),
        ).fetchall()
        return [(tuple(json.loads(r["variant"])), r["fingerprint"]) for r in rows]

    def runs_of(self, fingerprint: str, host_class: str, ids: set[str]) -> list[RunRow]:
        """The runs named by `ids` (from `reuse_candidates`), oldest first."""
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        rows = self.db.execute(
            f"SELECT * FROM runs WHERE id IN ({marks}) AND fingerprint=? AND host_class=?"
            " ORDER BY started, seq",
            (*sorted(ids), fingerprint, host_class),
        ).fetchall()
        return [run_row(r) for r in rows]

    def reusable(
        self,
        launch_key: str | None,
        *,
        exclude_campaign: str | None = None,
    ) -> list[RunRow]:
        """Every executed run (not itself reused) of the launch `launch_key` names, oldest
        first, infra verdicts excluded (they say nothing about the config): each start of
        a flaky config counts. Runs recorded without a key (before keys covered what
        reaches the server, or with a part unknown) are never reused."""
        if not launch_key:
            return []
        rows = self.db.execute(
            "SELECT * FROM runs WHERE launch_key=? AND verdict != 'infra' AND cached_from IS NULL"
            " AND campaign != ? ORDER BY started, seq",
            (launch_key, exclude_campaign or ""),
        ).fetchall()
        return [run_row(r) for r in rows]

    def runs_with_signature(self, signature: Signature) -> list[RunRow]:
        """Runs whose signature equals `signature` (`Signature.__eq__`: one phase and
        message; the exception's type is compared only where the message does not name
        the failure), as this classifier names them.

        A store opened read-only cannot be upgraded; when it is older, its runs are re-signed
        in memory from their log tails (nothing is written), so old runs are still found.
        """
        from orchestrator.store.signatures import current, resigned

        if not current(self.db):
            rows = self.db.execute(
                "SELECT * FROM runs WHERE signature IS NOT NULL AND cached_from IS NULL "
                "ORDER BY started"
            ).fetchall()
            return [
                run
                for run in map(run_row, rows)
                if resigned(run.signature, run.log_path) == signature
            ]
        phase = signature.phase.value
        rows = self.db.execute(
            "SELECT * FROM runs WHERE signature >= ? AND signature < ? AND cached_from IS NULL"
            " ORDER BY started",
            (phase + "|", phase + "}"),
        ).fetchall()
        return [run for run in map(run_row, rows) if run.signature == signature]

    # ---- signature versions (see orchestrator.store.signatures)
    def _upgrade_signatures(self) -> None:
        from orchestrator.store.signatures import upgrade

        upgrade(self.db, self._tx)

    def _stamp_signature_version(self, db: sqlite3.Connection, run_id: str) -> None:
        from orchestrator.store.signatures import stamp

        stamp(db, run_id)

    def signature_history(self, run_id: str) -> list[tuple[int, Signature | None]]:
        """The signatures a run had under older classifier versions, oldest first."""
        rows = self.db.execute(
            "SELECT version, signature FROM signature_history WHERE run=? ORDER BY version",
            (run_id,),
        ).fetchall()
        return [
            (r["version"], Signature.from_key(r["signature"]) if r["signature"] else None)
            for r in rows
        ]
