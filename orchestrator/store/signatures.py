"""Signature versions in the results store: old runs re-signed when the classifier changes.

A signature is only comparable with signatures of the same classifier version
(`orchestrator.diagnosis.classify.analyze.SIGNATURE_VERSION`). The store keeps, additively:

- `runs.signature_version` (NULL for runs recorded before versions existed: version 1);
- `signature_history(run, version, signature)`: what a run was called before;
- `meta['signature_version']`: the version every run in the store has been brought to.

On opening a store whose version is older, every run with a signature is re-signed from
its stored log tail (`classify.judge.resign`), its old signature kept in the history, and each
campaign's target (and the signatures quoted in its answer) moved to the new name of the
same runs, so a campaign resumes against targets its new runs can match, and
`orchestrator classify` finds old runs under the new signature. The upgrade runs once,
inside one write transaction (a second process opening the store waits, then sees it done).

Everything here works on the store's sqlite connection alone: the store calls it, never
the other way round.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from orchestrator.diagnosis.classify.analyze import SIGNATURE_VERSION
from orchestrator.diagnosis.classify.judge import resign
from orchestrator.diagnosis.verdicts import Signature

_TABLES = """
CREATE TABLE IF NOT EXISTS signature_history (
    run TEXT NOT NULL,
    version INTEGER NOT NULL,
    signature TEXT,
    PRIMARY KEY (run, version)
);
"""


def _ensure_schema(db: sqlite3.Connection) -> None:
    db.executescript(_TABLES)
    columns = {r[1] for r in db.execute("PRAGMA table_info(runs)").fetchall()}
    if "signature_version" not in columns:
        try:
            db.execute("ALTER TABLE runs ADD COLUMN signature_version INTEGER")
        except sqlite3.OperationalError as exc:
            if "duplicate column" not in str(exc):  # another process added it first
                raise


def stored_version(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT value FROM meta WHERE key='signature_version'").fetchone()
    return int(row[0]) if row is not None else 1


def current(db: sqlite3.Connection) -> bool:
    """Whether every run of the database is signed by this classifier version."""
    return stored_version(db) >= SIGNATURE_VERSION


def stamp(db: sqlite3.Connection, run_id: str) -> None:
    """Mark a run just recorded as signed by this classifier version."""
    db.execute("UPDATE runs SET signature_version=? WHERE id=?", (SIGNATURE_VERSION, run_id))


def _read_tail(path: str | None) -> str:
    if not path:
        return ""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _swap(obj: Any, names: dict[str, str]) -> Any:
    """`obj` (a campaign's answer) with every string naming an old signature renamed."""
    if isinstance(obj, str):
        return names.get(obj, obj)
    if isinstance(obj, list):
        return [_swap(v, names) for v in obj]
    if isinstance(obj, dict):
        return {k: _swap(v, names) for k, v in obj.items()}
    return obj


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def upgrade(
    db: sqlite3.Connection,
    transaction: Callable[[], AbstractContextManager[sqlite3.Connection]] | None = None,
) -> int:
    """Bring every run of `db` to this classifier version; the number re-signed.
    `transaction`: the write transaction to do it in (the store's own, which names the
    database when a write fails); a plain BEGIN IMMEDIATE when none is given."""
    _ensure_schema(db)
    if stored_version(db) >= SIGNATURE_VERSION:
        return 0
    changed = 0
    with (transaction or (lambda: _transaction(db)))():
        if stored_version(db) >= SIGNATURE_VERSION:  # another process did it meanwhile
            return 0
        renamed: dict[str, dict[str, str]] = {}  # campaign -> old key -> new key
        rows = db.execute(
            "SELECT id, campaign, signature, signature_version, log_path FROM runs "
            "WHERE signature_version IS NULL OR signature_version < ?",
            (SIGNATURE_VERSION,),
        ).fetchall()
        for r in rows:
            old = Signature.from_key(r["signature"]) if r["signature"] else None
            new = resign(old, _read_tail(r["log_path"]))
            version = r["signature_version"] or 1
            if old is not None:
                db.execute(
                    "INSERT OR REPLACE INTO signature_history VALUES (?,?,?)",
                    (r["id"], version, old.key()),
                )
                renamed.setdefault(r["campaign"], {}).setdefault(
                    old.key(), new.key() if new else old.key()
                )
            db.execute(
                "UPDATE runs SET signature=?, signature_version=? WHERE id=?",
                (new.key() if new else None, SIGNATURE_VERSION, r["id"]),
            )
            changed += old != new
        for cid, names in renamed.items():
            camp = db.execute("SELECT target, answer FROM campaigns WHERE id=?", (cid,)).fetchone()
            if camp is None:
                continue
            target = names.get(camp["target"], camp["target"]) if camp["target"] else None
            # answers quote signatures in their display form (`phase: class: message`)
            shown = {
                str(Signature.from_key(o)): str(Signature.from_key(n)) for o, n in names.items()
            }
            answer = camp["answer"]
            if answer:
                answer = json.dumps(_swap(json.loads(answer), shown | names))
            db.execute("UPDATE campaigns SET target=?, answer=? WHERE id=?", (target, answer, cid))
        db.execute(
            "INSERT OR REPLACE INTO meta VALUES ('signature_version', ?)", (str(SIGNATURE_VERSION),)
        )
    return changed


def resigned(signature: Signature | None, log_path: str | None) -> Signature | None:
    """What this classifier calls a run recorded as `signature`, from its stored log tail
    (nothing is written: for a store that cannot be upgraded, one opened read-only)."""
    return resign(signature, _read_tail(log_path))


__all__ = ["current", "resigned", "stamp", "stored_version", "upgrade"]
