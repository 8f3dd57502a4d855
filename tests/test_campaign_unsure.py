"""An answer below the confidence asked is `unsure`, in every place it is shown (fast tier).

A flaky pair on a scripted host (tests/support/scripted.py; the campaign, planner, store, reports
and classifier are the real ones), stopped by `--max-runs` while the noise-aware search is
under way: the outcome is `unsure` (exit code 4), never `found`; it carries the best answer,
its confidence below the one asked, the reproduction counts, the runs the search wants
next and the command that goes on. The text, `--json`, both reports, the issue report and
the notification say so. Resumed with a budget to spare, the campaign first runs what the
outcome said it would, and ends `found` at the confidence asked.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.campaign.bisect import Bisection
from orchestrator.campaign.planning import make_plan
from orchestrator.campaign.records import BisectOptions, Outcome, Status
from orchestrator.errors import EXIT_UNSURE
from orchestrator.reports.issue_report import issue_markdown
from orchestrator.reports.notify import Message
from orchestrator.reports.report import write_reports
from orchestrator.store.store import Store
from tests.support.scripted import (
    TARGET_ERROR,
    Faults,
    Oracle,
    Rule,
    ScriptedExecutor,
    first_draw_passes,
    host,
    write_pair,
)

N = 6
PAIR = frozenset({1, 4})


def campaign(
    tmp: Path,
    store: Store,
    max_runs: int | None,
    resume: str | None = None,
) -> Outcome:
    good, bad = write_pair(tmp / "exp", N)
    plan = make_plan(good, bad, "auto")
    oracle = Oracle(
        [Rule(PAIR, "cuda_graph", TARGET_ERROR, probability=0.5)],
        seed=first_draw_passes() + (100 if resume else 0),
    )
    return Bisection(
        store,
        plan,
        [host()],
        options=BisectOptions(max_runs=max_runs),
        command="test",
        resume_id=resume,
        executor_factory=lambda h, *_: ScriptedExecutor(h, oracle, Faults()),
    ).run()


def test_a_stopped_flaky_search_is_unsure_everywhere_and_its_resume_goes_on(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = Store(tmp_path / "results")
    try:
        out = campaign(tmp_path, store, max_runs=8)
        assert out.status is Status.UNSURE and not out.found, out
        assert EXIT_UNSURE == 4
        noise = out.noise or {}
        assert noise["confidence"] < 0.95 == noise["asked_confidence"]
        assert out.culprits and all(not c.confirmed for c in out.culprits)
        assert noise["next_runs"] and all(isinstance(v, str) for v in noise["next_runs"])
        assert noise["resume"] == f"orchestrator bisect --resume {out.campaign_id}"
        assert noise["reproduction_counts"].startswith("fail ")
        data = out.to_dict()
        assert data["status"] == "unsure" and data["confidence"] == noise["confidence"]
        assert store.campaign(out.campaign_id).status == "unsure"

        # the text: no "culprit", no evidence called conclusive; how to go on
        from orchestrator.cli.bisect import print_outcome

        good, bad = write_pair(tmp_path / "exp", N)
        print_outcome(
            out,
            make_plan(good, bad, "auto"),
            [],
            resume=f"orchestrator bisect --resume {out.campaign_id} --results R",
        )
        text = capsys.readouterr().out
        assert "unsure:" in text and "best answer" in text and "culprit (" not in text
        assert f"below the {0.95:g} asked" in text
        assert "next runs: " + noise["next_runs"][0] in text
        assert f"continue with: orchestrator bisect --resume {out.campaign_id} --results R" in text

        # both reports, the issue report and the notification
        md, html = (p.read_text() for p in sorted(write_reports(store, out.campaign_id)))
        md, html = (md, html) if "<html" in html else (html, md)
        assert "## Best answer (unsure)" in md and "## Answer\n" not in md
        assert "continue with: orchestrator bisect --resume" in md and "next runs:" in md
        assert 'class="answer unsure"' in html and "Best answer (unsure)" in html
        camp = store.campaign(out.campaign_id)
        issue = issue_markdown(
            camp, store.runs(camp.id), log_of=lambda r: r.log_tail(), env_of=lambda r: None
        )
        assert "**Not yet conclusive:**" in issue and "below the 95%" in issue
        payload = Message(
            out.campaign_id,
            "bisect",
            "unsure",
            culprits=("--feature-1",),
            confidence=noise["confidence"],
        ).payload()
        assert "is not sure yet" in payload["text"] and "best so far" in payload["text"]
        assert payload["confidence"] == noise["confidence"]

        # resumed with runs to spare: it runs what it said first, and ends found
        before = len(store.runs(out.campaign_id))
        again = campaign(tmp_path, store, max_runs=None, resume=out.campaign_id)
        runs = store.runs(out.campaign_id)
        assert runs[before].label == noise["next_runs"][0]
        assert again.status is Status.FOUND, again.message
        [cul] = again.culprits
        assert frozenset(cul.indices) == PAIR and cul.confirmed
        assert again.noise["confidence"] >= 0.95
    finally:
        store.close()
