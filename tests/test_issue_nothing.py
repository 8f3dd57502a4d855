"""`report ID --issue` says when a campaign has nothing to report upstream, and why.

A bug report needs a failure, its signature and a run that reproduced it. A bisection
whose failing config never failed (status `endpoints`), a sweep, and a bisection stopped
before anything reproduced get one line saying so and exit 1, never "[Bug] the server:
failure in ?" with "Environment: Not recorded". A campaign with an answer still gets its
report. Campaigns run on the scripted host into a real store; the CLI runs in-process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.campaign.bisect import Bisection
from orchestrator.campaign.planning import make_plan
from orchestrator.cli import main
from orchestrator.store.store import Store
from tests.support.scripted import TARGET_ERROR, Faults, Oracle, Rule, factory, host, write_pair


def _bisect(results: Path, tmp: Path, rules: list[Rule], **kw: object) -> str:
    good, bad = write_pair(tmp, 4)
    store = Store(results)
    try:
        return (
            Bisection(
                store,
                make_plan(good, bad),
                [host("h1")],
                command="test",
                executor_factory=factory(Oracle(rules), Faults()),
                **kw,
            )
            .run()
            .campaign_id
        )  # type: ignore[arg-type]
    finally:
        store.close()


def _issue(capsys: pytest.CaptureFixture[str], results: Path, cid: str) -> tuple[int, str, str]:
    code = main(["report", cid, "--issue", "--results", str(results)])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_bisection_whose_bad_config_never_failed_has_nothing_to_report(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = tmp_path / "results"
    cid = _bisect(results, tmp_path / "exp", [])  # no rule: the bad config passes
    code, out, err = _issue(capsys, results, cid)
    assert code == 1, out + err
    assert out == "" and "[Bug]" not in err and "Not recorded" not in err
    [line] = [x for x in err.splitlines() if x.startswith("error:")]
    assert f"nothing to report upstream: campaign {cid} reproduced no failure (endpoints" in line


def test_a_sweep_has_nothing_to_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    store = Store(results)
    try:
        cid = store.create_campaign(kind="sweep", key="k", command="sweep s.yaml", spec={})
    finally:
        store.close()
    code, out, err = _issue(capsys, results, cid)
    assert code == 1 and out == ""
    assert f"campaign {cid} is a sweep" in err and "Traceback" not in err


def test_a_campaign_with_an_answer_still_gets_its_report(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = tmp_path / "results"
    cid = _bisect(results, tmp_path / "exp", [Rule(frozenset({2}), "cuda_graph", TARGET_ERROR)])
    code, out, err = _issue(capsys, results, cid)
    assert code == 0, err
    assert out.startswith("# [Bug] ") and "failure in ?" not in out
