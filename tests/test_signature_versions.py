"""Signature versions: a store holding runs classified the old way keeps working, and its
runs are re-signed from their stored log tails when the classifier's version changes."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from orchestrator.diagnosis.classify.analyze import SIGNATURE_VERSION, analyze_log
from orchestrator.diagnosis.verdicts import Phase, Signature
from orchestrator.store import store as store_mod
from orchestrator.store.signatures import stored_version, upgrade
from orchestrator.store.store import Store

REAL = Path(__file__).parent / "data" / "real_logs"
# How version 1 named these failures (no place, un-normalized layer numbers).
OLD_IMA = Signature(Phase.SERVING, "illegal_address", "an illegal memory access was encountered")
OLD_KEYERROR = Signature(Phase.LOAD_WEIGHTS, "KeyError", "'layers.35.mlp.gate.g_idx'")


def old_store(root: Path) -> dict[str, str]:
    """A results folder as version 1 wrote it: the schema without signature versions."""
    root.mkdir()
    (root / "logs").mkdir()
    db = sqlite3.connect(root / "orchestrator.db")
    db.executescript(store_mod._SCHEMA)
    db.execute("INSERT INTO meta VALUES ('schema', '1')")
    answer = {"target": str(OLD_IMA), "findings": [{"signature": str(OLD_KEYERROR)}]}
    db.execute(
        "INSERT INTO campaigns VALUES ('c0ffee','bisect','k',1,1,'done','bisect','{}',?,?)",
        (OLD_IMA.key(), json.dumps(answer)),
    )
    logs = {
        "c0ffee.1": "sgl_ima_decode_sync.a.log",
        "c0ffee.2": "sgl_ima_decode_sync.b.log",
        "c0ffee.3": "vllm_keyerror_gate_g_idx.a.log",
    }
    sigs = {"c0ffee.1": OLD_IMA, "c0ffee.2": OLD_IMA, "c0ffee.3": OLD_KEYERROR}
    for seq, (run_id, name) in enumerate(logs.items(), start=1):
        path = root / "logs" / f"{run_id}.log"
        path.write_text((REAL / name).read_text())
        verdict = "fail" if sigs[run_id] == OLD_IMA else "other"
        db.execute(
            "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                run_id,
                "c0ffee",
                seq,
                "[]",
                f"v{seq}",
                "probe",
                "lab",
                "lab",
                "fp",
                "{}",
                "[]",
                "{}",
                None,
                verdict,
                sigs[run_id].key(),
                float(seq),
                1.0,
                "{}",
                None,
                None,
                "",
                str(path),
                None,
            ),
        )
    db.commit()
    db.close()
    return logs


def test_old_store_is_resigned_from_log_tails(tmp_path: Path) -> None:
    logs = old_store(tmp_path / "results")
    store = Store(tmp_path / "results")
    try:
        assert stored_version(store.db) == SIGNATURE_VERSION
        runs = {r.id: r for r in store.runs("c0ffee")}
        for run_id, name in logs.items():
            want = analyze_log((REAL / name).read_text()).signature
            assert want is not None
            assert runs[run_id].signature == want  # re-signed from the stored tail
        # the two reruns of one bug still share one signature, now with the place in it
        assert runs["c0ffee.1"].signature is not None
        assert runs["c0ffee.1"].signature == runs["c0ffee.2"].signature
        new_ima = runs["c0ffee.1"].signature
        assert new_ima is not None and "@ sglang/scheduler.py:process_batch_result_decode" in (
            new_ima.message
        )
        assert store.signature_history("c0ffee.1") == [(1, OLD_IMA)]
        # the campaign's target and the signatures its answer quotes follow their runs
        camp = store.campaign("c0ffee")
        assert camp.target == new_ima
        assert camp.answer is not None and camp.answer["target"] == str(new_ima)
        assert camp.answer["findings"][0]["signature"] == str(runs["c0ffee.3"].signature)
        # "have we seen this crash?" finds the old runs under the new signature
        assert [r.id for r in store.runs_with_signature(new_ima)] == ["c0ffee.1", "c0ffee.2"]
        assert store.runs_with_signature(OLD_IMA) == []
    finally:
        store.close()


def test_upgrade_runs_once_and_new_runs_carry_the_version(tmp_path: Path) -> None:
    old_store(tmp_path / "results")
    Store(tmp_path / "results").close()
    store = Store(tmp_path / "results")
    try:
        assert upgrade(store.db) == 0  # already current: nothing re-signed twice
        versions = {r[0] for r in store.db.execute("SELECT signature_version FROM runs")}
        assert versions == {SIGNATURE_VERSION}
    finally:
        store.close()


def test_classify_cli_finds_old_runs_under_the_new_signature(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main

    old_store(tmp_path / "results")
    log = REAL / "sgl_ima_decode_sync.c.log"  # a third rerun, read from a journal
    assert main(["classify", str(log), "--json", "--results", str(tmp_path / "results")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["run"] for r in doc["seen_in_runs"]] == ["c0ffee.1", "c0ffee.2"]
    assert doc["phase"] == "serving" and doc["signature"].startswith("serving|illegal_address|")
    # classify only reads: the old store was matched in memory, not rewritten
    db = sqlite3.connect(tmp_path / "results" / "orchestrator.db")
    try:
        assert stored_version(db) == 1
    finally:
        db.close()


def test_a_stored_silent_hang_is_renamed_by_its_last_milestone() -> None:
    """Version 3 names a silent hang by the last milestone before the silence; a hang
    stored by an older version is renamed from its log tail, so old and new runs of the
    same hang still match."""
    from orchestrator.diagnosis.classify.judge import HANG_MESSAGE, resign

    tail = (
        "[2025-10-06 20:05:22 TP0] Capture cuda graph begin. This can take up to "
        "several minutes. avail mem=3.66 GB\n"
    )
    old = Signature(Phase.CUDA_GRAPH, "hang", HANG_MESSAGE)
    assert resign(old, tail) == Signature(
        Phase.CUDA_GRAPH, "hang", f"{HANG_MESSAGE} after 'Capture cuda graph begin'"
    )
    assert resign(old, "") == old  # no tail kept: nothing to rename it by
