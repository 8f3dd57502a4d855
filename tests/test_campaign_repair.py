"""A variant that dies of a resource is started again with a repair move (fast tier).

Scripted hosts: the oracle's resource rule fires while `--mem-fraction-static` is below a
limit, so the campaign, planner, store and classifier are the real ones deciding when a
move is made, which start gives the variant's verdict, and what the answer says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.campaign.bisect import Bisection
from orchestrator.campaign.planning import make_plan
from orchestrator.campaign.records import BisectOptions
from orchestrator.store.store import Store
from tests.support.scripted import TARGET_ERROR, Faults, Oracle, Rule, factory, flag, host

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
MEM = "mem-fraction-static"


def pair(
    root: Path,
    n: int,
    *,
    good_flags: dict[str, Any] | None = None,
    bad_flags: dict[str, Any] | None = None,
    repair: dict[str, Any] | None = None,
) -> tuple[Path, Path]:
    root.mkdir(parents=True, exist_ok=True)
    good: dict[str, Any] = {
        "name": "good",
        "service": {
            "unit": "scripted.service",
            "exec": "python3 -m sglang.launch_server",
            "flags": {"model-path": "/models/m", "tp-size": 8, MEM: 0.85, "port": 30000}
            | (good_flags or {}),
        },
        "health": {"path": "/health", "timeout": "60s", "ready_after": 2},
    }
    if repair is not None:
        good["repair"] = repair
    bad = {
        "name": "bad",
        "extends": "good.yaml",
        "service": {"flags": {flag(i): True for i in range(n)} | (bad_flags or {})},
    }
    (root / "good.yaml").write_text(yaml.safe_dump(good))
    (root / "bad.yaml").write_text(yaml.safe_dump(bad))
    return root / "good.yaml", root / "bad.yaml"


#: EP (feature-0) runs out of memory below 0.92; EP + flashinfer (feature-1) then fails in
#: graph capture with the target; feature-2 is harmless
INCIDENT = [
    Rule(frozenset({0}), "load_weights", OOM, below=((MEM, 0.92),)),
    Rule(frozenset({0, 1}), "cuda_graph", TARGET_ERROR),
]


def bisect(
    good: Path, bad: Path, results: Path, rules: list[Rule], *, options: BisectOptions | None = None
) -> tuple[dict, list]:
    store = Store(results)
    try:
        b = Bisection(
            store,
            make_plan(good, bad),
            [host()],
            command="t",
            options=options or BisectOptions(),
            executor_factory=factory(Oracle(rules), Faults()),
        )
        outcome = b.run()
        return outcome.to_dict(), store.runs(b.cid)
    finally:
        store.close()


def culprit_flags(answer: dict) -> list[list[str]]:
    return [sorted(c["flags"]) for c in answer["culprits"]]


def test_the_incident_is_repaired_and_the_real_culprit_named(tmp_path: Path) -> None:
    good, bad = pair(tmp_path / "exp", 3)
    answer, runs = bisect(good, bad, tmp_path / "results", INCIDENT)
    assert answer["status"] == "found", answer
    assert answer["target"].startswith("cuda_graph: cublas")
    assert culprit_flags(answer) == [["--feature-0", "--feature-1"]]
    # the built-in ladder: 0.85 -> 0.89 (still out of memory) -> 0.93
    repaired = [r for r in runs if r.repair]
    assert repaired and all(r.purpose in ("repair", "cache") for r in repaired)
    assert {r.repair["value"] for r in repaired} == {0.89, 0.93}
    bad_runs = [r for r in runs if r.variant == (0, 1, 2)]
    assert bad_runs[0].signature is not None  # the OOM first, then repaired
    assert bad_runs[0].signature.error_class == "cuda_oom" and not bad_runs[0].repair
    assert bad_runs[-1].repair and bad_runs[-1].repair["value"] == 0.93
    assert f"--{MEM} 0.93" in " ".join(bad_runs[-1].argv)
    notes = {n["variant"]: n for n in answer["repairs"]}
    assert notes["bad"]["state"] == "repaired"
    assert notes["bad"]["moves"] == [f"--{MEM} 0.85 -> 0.89", f"--{MEM} 0.89 -> 0.93"]
    assert notes["bad"]["after"].startswith("failed with the target")
    assert "--mem-fraction-static 0.93" in notes["bad"]["command"]
    # the OOM is no finding of its own: it was repaired wherever it showed
    assert answer["findings"] == []
    # no move touched a delta, no answer names a move
    assert all(r.repair["knob"] == MEM for r in repaired)


def test_without_repair_the_pair_ends_as_before(tmp_path: Path) -> None:
    good, bad = pair(tmp_path / "exp", 3)
    answer, runs = bisect(
        good, bad, tmp_path / "results", INCIDENT, options=BisectOptions(repair=False)
    )
    assert answer["target"].startswith("load_weights: cuda_oom")
    assert culprit_flags(answer) == [["--feature-0"]]
    assert "repairs" not in answer and not any(r.repair for r in runs)


def test_a_declared_move_reaches_the_working_value_in_one_step(tmp_path: Path) -> None:
    good, bad = pair(
        tmp_path / "exp",
        3,
        repair={
            "moves": [
                {
                    "flag": MEM,
                    "step": 0.07,
                    "max": 0.95,
                    "when": [{"class": "cuda_oom", "way": "up"}],
                }
            ]
        },
    )
    answer, runs = bisect(good, bad, tmp_path / "results", INCIDENT)
    assert culprit_flags(answer) == [["--feature-0", "--feature-1"]]
    assert {r.repair["value"] for r in runs if r.repair} == {0.92}
    # every start of an EP variant took exactly one repaired start after it
    by_id = {r.id: r for r in runs}
    for r in runs:
        if 0 in r.variant and not r.repair:
            assert sum(1 for x in runs if x.repair and x.repair["after"] == r.id) == 1
        if r.repair:
            assert by_id[r.repair["after"]].repair is None


def test_a_move_on_a_delta_under_test_is_not_made_and_the_answer_says_why(tmp_path: Path) -> None:
    """The memory fraction is itself a delta (0.85 -> 0.92): nothing turns it, the
    variants that run out of memory stay `other` and the answer says they could not be
    repaired, naming the delta."""
    good, bad = pair(tmp_path / "exp", 2, bad_flags={MEM: 0.92})
    answer, runs = bisect(good, bad, tmp_path / "results", INCIDENT)
    assert not any(r.repair for r in runs)
    assert culprit_flags(answer) == [["--feature-0", "--feature-1", f"--{MEM} 0.92"]]
    unrepaired = [n for n in answer["repairs"] if n["state"] == "unrepaired"]
    assert unrepaired and all(n["why"] == f"--{MEM} is a delta under test" for n in unrepaired)
    assert any(f["signature"].startswith("load_weights: cuda_oom") for f in answer["findings"])


def test_no_working_window_stops_the_ladder(tmp_path: Path) -> None:
    """Out of memory at load below 0.88, out of memory while serving above it: the ladder
    stops after one move and says the variant has no working window."""
    good, bad = pair(tmp_path / "exp", 2)
    rules = [
        Rule(frozenset({0}), "load_weights", OOM, below=((MEM, 0.88),)),
        Rule(frozenset({0}), "warmup", OOM, above=((MEM, 0.88),)),
        Rule(frozenset({1}), "cuda_graph", TARGET_ERROR),
    ]
    answer, runs = bisect(good, bad, tmp_path / "results", rules)
    [note] = [n for n in answer["repairs"] if n["variant"] == "bad"]
    assert note["state"] == "unrepaired" and note["why"].startswith(
        f"no working window for --{MEM}: at 0.85 it failed wanting more"
    )
    assert sum(1 for r in runs if r.variant == (0, 1) and r.repair) == 1


def test_a_repaired_run_is_reused_under_its_variant_and_move(tmp_path: Path) -> None:
    """A second campaign of the pair runs nothing: each variant's first start and each
    repaired start come from the cache (the repaired one under its own launch, the
    variant plus its move), and the answer names the same repairs."""
    good, bad = pair(tmp_path / "exp", 3)
    first, _ = bisect(good, bad, tmp_path / "results", INCIDENT)
    again, runs = bisect(good, bad, tmp_path / "results", INCIDENT)
    assert again["campaign"] != first["campaign"] and again["runs_executed"] == 0
    assert culprit_flags(again) == culprit_flags(first)
    reused = [r for r in runs if r.repair]
    assert reused and all(r.cached_from for r in reused)
    ids = {r.id for r in runs}
    assert all(r.repair["after"] in ids for r in reused)  # this campaign's own ladders
    assert {n["variant"] for n in again["repairs"]} == {n["variant"] for n in first["repairs"]}


def test_resume_continues_a_ladder_where_it_stopped(tmp_path: Path) -> None:
    """The controller dies as the first repaired start of the bad config begins: the
    resumed campaign goes on with that repaired start, not with a new first start."""
    import shutil
    import sqlite3

    from tests.support.scripted import ScriptedExecutor

    good, bad = pair(tmp_path / "exp", 3)
    results, killed = tmp_path / "results", tmp_path / "killed"
    oracle = Oracle(INCIDENT)

    class KilledAtTheRepair(ScriptedExecutor):
        def run(self, exp, **kw):  # noqa: ANN001, ANN003, ANN201
            if exp.flag_map().get(MEM) != 0.85 and not killed.exists():
                killed.mkdir()
                for p in results.iterdir():
                    if p.is_dir():
                        shutil.copytree(p, killed / p.name)
                src = sqlite3.connect(results / "orchestrator.db")
                dst = sqlite3.connect(killed / "orchestrator.db")
                try:
                    src.backup(dst)
                finally:
                    src.close()
                    dst.close()
            return super().run(exp, **kw)

    store = Store(results)
    try:
        Bisection(
            store,
            make_plan(good, bad),
            [host()],
            command="t",
            executor_factory=lambda h, *_: KilledAtTheRepair(h, oracle, Faults()),
        ).run()
    finally:
        store.close()
    store = Store(killed)
    try:
        [camp] = store.campaigns()
        before = store.runs(camp.id)
        assert [(r.variant, r.repair) for r in before][-1] == ((0, 1, 2), None)
        store.update_campaign(camp.id, status="interrupted")
        b = Bisection(
            store,
            make_plan(good, bad),
            [host()],
            command="t",
            executor_factory=factory(oracle, Faults()),
        )
        outcome = b.run()
        after = store.runs(camp.id)
    finally:
        store.close()
    assert outcome.campaign_id == camp.id
    new = after[len(before) :]
    assert new[0].variant == (0, 1, 2) and new[0].repair is not None
    assert new[0].repair["after"] == before[-1].id and new[0].repair["value"] == 0.89
    assert culprit_flags(outcome.to_dict()) == [["--feature-0", "--feature-1"]]


def test_every_view_names_the_repair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The answer printed, `show`, both reports, `--issue`, the notification and `plan`
    name the repaired variant, the move and the runs before and after."""
    from orchestrator.campaign.records import Outcome
    from orchestrator.cli import main
    from orchestrator.cli.bisect import print_outcome
    from orchestrator.reports.notify import Message, repairs_of
    from orchestrator.reports.report import html_page, markdown

    good, bad = pair(tmp_path / "exp", 3)
    results = tmp_path / "results"
    answer, runs = bisect(good, bad, results, INCIDENT)
    outcome = Outcome.from_dict(answer)
    [cul] = outcome.culprits
    assert cul.repaired_with == [f"--{MEM} 0.85 -> 0.89", f"--{MEM} 0.89 -> 0.93"]
    bad_note = next(n for n in outcome.repairs if n.variant == "bad")
    sentence = bad_note.sentence()
    assert sentence.startswith("bad: failed on a resource (load_weights: cuda_oom: ")
    assert (
        f"[run {bad_note.before_run}]; with --{MEM} 0.85 -> 0.89, --{MEM} 0.89 -> 0.93 "
        f"it failed with the target (cuda_graph: cublas: " in sentence
    )
    assert sentence.endswith(f"[run {bad_note.after_run}]")

    print_outcome(outcome, make_plan(good, bad), [])
    said = capsys.readouterr().out
    assert "repair: bad: failed on a resource (load_weights: cuda_oom" in said
    assert f"(repaired with --{MEM} 0.85 -> 0.89, --{MEM} 0.89 -> 0.93)" in said

    store = Store(results)
    try:
        camp = store.campaign(answer["campaign"])
        md, page = markdown(camp, runs), html_page(camp, runs)
    finally:
        store.close()
    assert f"- repair: {sentence}" in md
    assert "with the repair `--mem-fraction-static 0.85 -> 0.89`" in md
    assert "<p class=repair>Repair: bad: failed on a resource" in page

    assert main(["show", bad_note.after_run, "--results", str(results)]) == 0
    shown = capsys.readouterr().out
    assert f"repair: --{MEM} 0.89 -> 0.93 (step 2), after run" in shown
    assert main(["show", bad_note.before_run, "--results", str(results)]) == 0
    assert f"started again with --{MEM} 0.85 -> 0.89: run" in capsys.readouterr().out

    assert main(["report", answer["campaign"], "--issue", "--results", str(results)]) == 0
    issue = capsys.readouterr().out
    assert f"--{MEM} 0.93" in issue  # the repaired command line reproduces it
    assert (
        "This command line is the repaired one: as first launched it failed on a "
        "resource (load_weights: cuda_oom" in issue
    )
    assert "reproducing launch failed in 1 of 1 starts" in issue

    text = Message(answer["campaign"], "bisect", "found", repairs=repairs_of(answer)).payload()
    assert f"repaired: {sentence}" in text["text"] and text["repairs"][0] == sentence

    assert main(["plan", "--good", str(good), "--bad", str(bad)]) == 0
    plan_text = capsys.readouterr().out
    assert (
        "repair moves (a variant that dies of a resource starts again, at most 2 times)"
        in plan_text
    )
    assert f"--{MEM} +/-0.04 per step" in plan_text and "may run, from 0.85" in plan_text
    assert main(["plan", "--good", str(good), "--bad", str(bad), "--no-repair"]) == 0
    assert "repair moves: none may run (--no-repair)" in capsys.readouterr().out


def test_a_repair_costs_at_most_its_own_extra_starts(tmp_path: Path) -> None:
    """bench/repair.py's claim on two of its incidents: beyond the search the target alone
    needs (the same pair without its resource failure), the repaired campaign takes no
    more runs than its repaired starts."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(
        "bench_repair", Path(__file__).resolve().parents[1] / "bench" / "repair.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_repair"] = bench  # (its dataclasses look their module up)
    spec.loader.exec_module(bench)
    for inc in (bench.INCIDENTS[0], bench.INCIDENTS[3]):
        fixed, said, starts = bench.campaign(tmp_path / inc.name[:10], inc, True, judge=True)
        alone, _, _ = bench.campaign(tmp_path / inc.name[:10], inc, True, resource=False)
        assert said.endswith("(right)"), said
        assert 0 < starts and fixed - alone <= starts, (inc.name, fixed, alone, starts)


def test_repeats_of_a_repaired_variant_count_their_repaired_starts(tmp_path: Path) -> None:
    """`--repeat 2` starts each deciding variant once more; a repeat that runs out of
    memory is repaired, and its repaired start is that repeat's verdict (the campaign
    neither loops on it nor reports it disagreeing)."""
    good, bad = pair(tmp_path / "exp", 2)
    answer, runs = bisect(
        good, bad, tmp_path / "results", INCIDENT, options=BisectOptions(repeat=2, max_runs=40)
    )
    assert culprit_flags(answer) == [["--feature-0", "--feature-1"]]
    assert answer["flaky"] == []
    repeats = [r for r in runs if r.purpose == "repeat"]
    assert repeats and any(r.signature and r.signature.error_class == "cuda_oom" for r in repeats)
    by_after = {r.repair["after"]: r for r in runs if r.repair}
    for r in repeats:  # each repeat that ran out of memory was repaired, once
        if r.signature and r.signature.error_class == "cuda_oom":
            assert r.id in by_after
    assert len(runs) < 40


def test_a_value_the_server_refuses_is_not_tried_again(tmp_path: Path) -> None:
    """The server's parser refuses the moved value (`invalid`): the variant keeps its
    out-of-memory start as its verdict, says why, and no other variant tries the move."""
    from orchestrator.diagnosis.verdicts import Verdict
    from orchestrator.execution.contract import RunResult
    from tests.support.scripted import ScriptedExecutor

    class Refusing(ScriptedExecutor):
        def run(self, exp, *, run_id, label="", **kw):  # noqa: ANN001, ANN003, ANN201
            if exp.flag_map().get(MEM) != 0.85:
                return RunResult(
                    run_id=run_id,
                    host=self.host.name,
                    host_class=self.host.host_class,
                    experiment=exp,
                    label=label,
                    verdict=Verdict.INVALID,
                    signature=None,
                    started_at=0.0,
                    duration_s=0.0,
                    log_tail="",
                    detail="argument --mem-fraction-static: must be below 0.88",
                    inputs=self.inputs(exp),
                )
            return super().run(exp, run_id=run_id, label=label, **kw)

    good, bad = pair(tmp_path / "exp", 3)
    # the target needs features 0 and 2; feature 1 runs out of memory below 0.92
    oracle = Oracle(
        [
            Rule(frozenset({0, 2}), "cuda_graph", TARGET_ERROR),
            Rule(frozenset({1}), "load_weights", OOM, below=((MEM, 0.92),)),
        ]
    )
    store = Store(tmp_path / "results")
    try:
        b = Bisection(
            store,
            make_plan(good, bad),
            [host()],
            command="t",
            executor_factory=lambda h, *_: Refusing(h, oracle, Faults()),
        )
        answer = b.run().to_dict()
        runs = store.runs(b.cid)
    finally:
        store.close()
    assert culprit_flags(answer) == [["--feature-0", "--feature-2"]]
    tried = [r for r in runs if r.repair]
    assert len(tried) == 1 and tried[0].verdict is Verdict.INVALID  # once, never again
    notes = answer["repairs"]
    assert notes[0]["why"].startswith(f"the server refused --{MEM} 0.89 (argument")
    assert all(n["state"] == "unrepaired" for n in notes)
    later = [n for n in notes[1:] if n["why"] == f"the server refused a value of --{MEM} before"]
    assert later, notes
    # the refused start is no invalid variant of the search; the out-of-memory failure
    # stays a finding of its own
    assert answer["invalid"] == []
    assert any(f["signature"].startswith("load_weights: cuda_oom") for f in answer["findings"])


def test_an_older_database_gains_the_repair_column_and_its_runs_read_none(tmp_path: Path) -> None:
    """A results store made before repairs: opening it adds `runs.repair`; its runs carry
    no move and a campaign on it runs (and repairs) as on a new one."""
    import sqlite3

    good, bad = pair(tmp_path / "exp", 3)
    results = tmp_path / "results"
    bisect(good, bad, results, INCIDENT, options=BisectOptions(repair=False))
    db = sqlite3.connect(results / "orchestrator.db")
    db.execute("ALTER TABLE runs DROP COLUMN repair")
    db.commit()
    db.close()
    store = Store(results)
    try:
        cols = {r["name"] for r in store.db.execute("PRAGMA table_info(runs)")}
        assert "repair" in cols
        assert all(r.repair is None for r in store.runs())
    finally:
        store.close()
    answer, _ = bisect(good, bad, results, INCIDENT)
    assert culprit_flags(answer) == [["--feature-0", "--feature-1"]]
