"""The executor's answers check on a scripted host and clock (fast tier): the real
`Executor`, process manager and asker command shape; the scripted host answers the asker
(`ScriptedTransport._ask`) as each start's script says. What the asker does over HTTP is
proven on the real servers (test_answers_asker.py, the real answers tier).
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.config.experiment import Experiment
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.store.store import Store
from tests.support.scripted_transport import Server
from tests.test_executor_watch import experiment, rig


def checked(**answers: object) -> Experiment:
    data = experiment().to_dict()
    data["answers"] = answers
    return Experiment.from_dict(data, source="<test>")


def test_a_ready_server_is_asked_on_the_host_and_its_answers_kept() -> None:
    r = rig(Server())
    result = r.run(checked())
    assert result.verdict is Verdict.PASS, result.detail
    assert result.answers is not None and result.answers["ready"] is True
    assert set(result.answers["sets"]) == {"sequential", "batch"}
    first = result.answers["sets"]["sequential"][0]
    assert first["tokens"] and first["top"] and first["text"]
    assert "repeat" not in result.answers
    assert [k for _, k in r.t.log].count("ask") == 1


def test_asked_twice_the_reference_keeps_its_second_pass() -> None:
    r = rig(Server())
    result = r.ex.run(checked(), run_id="g", ask_twice=True)
    assert result.answers is not None and len(result.answers["repeat"]) == len(
        result.answers["sets"]["sequential"]
    )
    assert [k for _, k in r.t.log].count("ask") == 2


def test_health_200_without_a_completion_is_not_ready() -> None:
    # vLLM with rank 0 dead: /health answers 200, every completion fails
    r = rig(Server(answers="silent"))
    result = r.run(checked())
    assert result.verdict is Verdict.FAIL
    assert result.signature is not None and result.signature.error_class == "no_completion"
    assert "no completion returned" in result.detail and "HTTP 500" in result.detail


def test_ready_completion_alone_asks_one_prompt_for_one_token() -> None:
    r = rig(Server())
    result = r.run(checked(enabled=False, ready_completion=True))
    assert result.verdict is Verdict.PASS
    assert result.answers is not None
    assert [len(v) for v in result.answers["sets"].values()] == [1]


def test_ready_completion_can_be_turned_off() -> None:
    r = rig(Server(answers="silent"))
    result = r.run(checked(enabled=False, ready_completion=False))
    assert result.verdict is Verdict.PASS
    assert result.answers is None
    assert "ask" not in [k for _, k in r.t.log]


def test_no_answers_section_sends_no_ask() -> None:
    r = rig(Server(answers="silent"))
    result = r.run(experiment())
    assert result.verdict is Verdict.PASS and result.answers is None
    assert "ask" not in [k for _, k in r.t.log]


def test_the_store_keeps_the_answers_and_an_old_database_reads_without_them(
    tmp_path: Path,
) -> None:
    import sqlite3

    store = Store(tmp_path)
    cid = store.create_campaign(kind="bisect", key="k", command="test", spec={})
    r = rig(Server())
    result = r.run(checked())
    rid = store.add_run(cid, variant=(), purpose="endpoint", result=result)
    row = store.run(rid)
    assert row.answers == json.loads(json.dumps(result.answers))
    store.close()
    # a database from before the column: dropped, then opened again (migrated)
    db = sqlite3.connect(tmp_path / "orchestrator.db")
    db.execute("ALTER TABLE runs DROP COLUMN answers")
    db.commit()
    db.close()
    again = Store(tmp_path)
    assert again.run(rid).answers is None


def _ready_at() -> float:
    from tests.test_executor_watch import READY, expected_polls

    return expected_polls(READY)[-1] + 1.25  # the second 200 (the settle included)


def test_a_server_killed_from_outside_while_asked_is_host_trouble() -> None:
    # SIGKILL from outside a few prompts into the check: the prompts after it get no
    # answer, which says nothing about the config (not `no_completion`, not a wrong answer)
    r = rig(Server(killed_at=_ready_at() + 3.0))
    result = r.run(checked())
    assert result.verdict is Verdict.INFRA, (result.verdict, result.signature, result.detail)
    assert "from outside the campaign" in result.detail


def test_a_server_that_crashes_while_asked_keeps_its_crash() -> None:
    r = rig(Server(dies_at=_ready_at() + 3.0))
    result = r.run(checked())
    assert result.verdict is Verdict.FAIL, (result.detail, result.log_tail[-1500:])
    assert result.signature is not None and result.signature.phase.value == "serving"
    assert "illegal memory access" in result.signature.message, result.signature
