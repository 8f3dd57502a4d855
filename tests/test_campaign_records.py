"""The campaign's typed records and its shared core: dict round trips, answers and specs
stored by earlier versions, and interrupts that carry the outcome so far.

Campaigns run through the real `Bisection`/`SweepCampaign`, core, store, planner and
classifier; only the host is scripted (`tests/support/scripted.py`). Fast tier: no real host.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
from pathlib import Path

import pytest

from orchestrator.campaign.bisect import Bisection
from orchestrator.campaign.core import CampaignCore
from orchestrator.campaign.planning import make_plan
from orchestrator.campaign.records import (
    BisectOptions,
    BisectSpec,
    Culprit,
    Finding,
    Outcome,
    Status,
    SweepAnswer,
    SweepSpec,
    signature_from_text,
)
from orchestrator.campaign.sweep import SweepCampaign
from orchestrator.cli import common
from orchestrator.config.sweep import load_sweep
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict
from orchestrator.errors import CampaignRef, InfraError, Interrupted
from orchestrator.events import CampaignFinished, Event, RunRecorded
from orchestrator.reports.notify import culprits_of
from orchestrator.reports.report import html_page, markdown
from orchestrator.store.store import Store
from tests.support.scripted import OTHER_ERROR, TARGET_ERROR, Faults, Oracle, Rule, factory, host
from tests.support.scripted import write_pair as scripted_pair

# A bisection's spec and answer exactly as the version before the typed records stored
# them (the lab demo's campaign: `--ep-size 8 + --enable-nccl-nvls`, one other failure).
OLD_SPEC = json.loads("""{"good": {"name": "lab-b300-tp8", "service": {"unit":
"sglang-lab.service", "exec": "python3 -m orchestrator.lab.server --scenario b300", "flags":
{"model-path": "/models/Kimi-K2.6", "tp-size": 8, "max-running-requests": 128, "port": 30000},
"env": {"NCCL_DEBUG": "WARN"}}, "health": {"path": "/health", "port": 30000, "timeout": 60.0,
"ready_after": 2}}, "bad": {"name": "lab-b300-ep8-nvls", "service": {"unit":
"sglang-lab.service", "exec": "python3 -m orchestrator.lab.server --scenario b300", "flags":
{"model-path": "/models/Kimi-K2.6", "tp-size": 8, "max-running-requests": 256, "port": 30000,
"ep-size": 8, "enable-nccl-nvls": true}, "env": {"NCCL_DEBUG": "WARN"}}, "health": {"path":
"/health", "port": 30000, "timeout": 60.0, "ready_after": 2}}, "good_source":
"experiments/lab/demo/good.yaml", "bad_source": "experiments/lab/demo/bad.yaml", "deltas":
[{"kind": "flag", "key": "max-running-requests", "old": 128, "new": 256}, {"kind": "flag",
"key": "ep-size", "old": null, "new": 8}, {"kind": "flag", "key": "enable-nccl-nvls", "old":
null, "new": true}], "strategy": "auto", "hosts": ["lab"], "options": {"repeat": 1,
"max_runs": null, "deadline_s": null, "fresh": true, "confidence": 0.95}}""")

OLD_ANSWER = json.loads(
    """{"campaign": "dd2937", "status": "found", "message": "", "target":
"cuda_graph: cublas: CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmStridedBatchedEx @
sglang/deepseek_v2.py:forward_absorb_prepare", "culprits": [{"deltas": ["+ --ep-size 8",
"+ --enable-nccl-nvls"], "flags": ["--ep-size 8", "--enable-nccl-nvls"], "indices": [1, 2],
"interacting": true, "reproduced_by": "dd2937.7", "cleared_by": {"--ep-size 8": "dd2937.6",
"--enable-nccl-nvls": "dd2937.4"}, "clearing": {"--ep-size 8": "bad without --ep-size 8 does
not fail", "--enable-nccl-nvls": "bad without --enable-nccl-nvls does not show the target
failure (other: init: AttributeError: 'NoneType' object has no attribute 'dtype' @
sglang/pynccl.py:__init__)"}, "confirmed": true, "reproduced_counts": "fail 1 of 1",
"cleared_counts": {"--ep-size 8": "fail 0 of 1", "--enable-nccl-nvls": null}}], "findings":
[{"signature": "init: AttributeError: 'NoneType' object has no attribute 'dtype' @
sglang/pynccl.py:__init__", "variant": "good + --ep-size 8", "deltas": [1], "run": "dd2937.8",
"count": 2}], "invalid": [], "runs_executed": 8, "runs_reused": 0, "narrowed": null, "flaky":
[], "removed_hosts": [], "confidence": null, "reproduction_rate": 1.0, "noise": {"switched":
null, "confidence": null, "reproduction_rate": 1.0, "reproduction_counts": "fail 2 of 2"},
"deltas": ["~ --max-running-requests 128 -> 256", "+ --ep-size 8", "+ --enable-nccl-nvls"]}
""".replace("\n", " ")
)  # wrapped at spaces for line length: each newline was a space


def _old_answer() -> dict:
    return copy.deepcopy(OLD_ANSWER)


# ------------------------------------------------------------------ records and stored JSON


def test_an_answer_stored_the_old_way_loads_into_the_types_and_writes_back_the_same() -> None:
    old = _old_answer()
    outcome = Outcome.from_dict(old)
    assert outcome.status is Status.FOUND and outcome.found
    assert outcome.target == Signature(
        Phase.CUDA_GRAPH,
        "cublas",
        "CUBLAS_STATUS_EXECUTION_FAILED when calling "
        "cublasGemmStridedBatchedEx @ sglang/deepseek_v2.py:forward_absorb_prepare",
    )
    [cul] = outcome.culprits
    assert cul.flags == ["--ep-size 8", "--enable-nccl-nvls"] and cul.indices == [1, 2]
    assert cul.interacting and cul.confirmed and cul.reproduced_by == "dd2937.7"
    assert cul.cleared_count("--ep-size 8") == "fail 0 of 1"
    assert cul.claim("--ep-size 8") == "bad without --ep-size 8 does not fail"
    [finding] = outcome.findings
    assert (finding.signature.phase, finding.signature.error_class) == (
        Phase.INIT,
        "AttributeError",
    )
    assert (finding.variant, finding.run_id, finding.count) == ((1,), "dd2937.8", 2)
    assert outcome.to_dict() == old  # every key, every value, in the order it had
    assert list(outcome.to_dict()) == list(old)


def test_an_answer_from_before_the_evidence_wording_and_counts_loads_with_defaults() -> None:
    old = _old_answer()
    for key in ("confidence", "reproduction_rate", "noise"):
        del old[key]
    for key in ("clearing", "reproduced_counts", "cleared_counts", "confirmed", "indices"):
        del old["culprits"][0][key]
    outcome = Outcome.from_dict(old)
    [cul] = outcome.culprits
    assert cul.claim("--enable-nccl-nvls") == "bad without --enable-nccl-nvls does not fail"
    assert cul.cleared_count("--ep-size 8") is None and cul.reproduced_counts is None
    assert outcome.noise is None and outcome.to_dict()["confidence"] is None
    assert culprits_of(old) == ("--ep-size 8 + --enable-nccl-nvls",)


def test_a_spec_stored_the_old_way_loads_and_writes_back_the_same() -> None:
    spec = BisectSpec.from_dict(OLD_SPEC)
    assert spec.options == BisectOptions(strategy="auto", fresh=True)
    assert spec.hosts == ["lab"] and spec.good_source == "experiments/lab/demo/good.yaml"
    assert spec.to_dict() == OLD_SPEC
    # a spec from before the options were recorded: the defaults
    bare = {k: v for k, v in OLD_SPEC.items() if k != "options"}
    assert BisectSpec.from_dict(bare).options == BisectOptions()


def test_signatures_survive_their_printed_form_with_colons_and_places() -> None:
    sig = Signature(
        Phase.SERVING, "RuntimeError", "CUDA error: an illegal memory access @ sglang/a.py:f"
    )
    assert signature_from_text(str(sig)) == sig
    f = Finding(sig, (0, 3), "c.4", "good + --a, --b", 3)
    assert Finding.from_dict(json.loads(json.dumps(f.to_dict()))) == f


def test_the_status_is_an_enum_that_still_reads_as_its_stored_word() -> None:
    assert Status("found") is Status.FOUND and Status.INTERRUPTED == "interrupted"
    assert json.dumps({"s": Status.DONE}) == '{"s": "done"}'
    with pytest.raises(ValueError):
        Status("finished")


def test_reports_read_an_answer_stored_the_old_way(tmp_path: Path) -> None:
    store = Store(tmp_path / "results")
    cid = store.create_campaign(
        kind="bisect", key="k", command="orchestrator bisect", spec=OLD_SPEC
    )
    target = Outcome.from_dict(_old_answer()).target
    store.update_campaign(cid, status="done", answer=_old_answer(), target=target)
    camp = store.campaign(cid)
    md = markdown(camp, [])
    assert (
        "- **`--ep-size 8` + `--enable-nccl-nvls`** (interacting set); good + set "
        "reproduces the failure: run dd2937.7 (fail 1 of 1)"
    ) in md
    assert "  - bad without `--ep-size 8` does not fail: run dd2937.6 (fail 0 of 1)" in md
    assert "- cleared: `~ --max-running-requests 128 -> 256`" in md
    assert (
        "- other failure `init: AttributeError: 'NoneType' object has no attribute 'dtype'"
        " @ sglang/pynccl.py:__init__`: smallest variant good + --ep-size 8 (run dd2937.8, "
        "seen 2x)"
    ) in md
    assert "- reproduction rate 1.00 (fail 2 of 2 runs with the culprit set)" in md
    page = html_page(camp, [])
    assert "reproduces the failure (run dd2937.7; fail 1 of 1)" in page
    store.close()


# a sweep's answer as the version before stored it (two of its rows), once resumed
OLD_SWEEP_ANSWER = json.loads(
    """{"campaign": "99842d", "status": "done", "message": "",
"resume": null, "resumable": false, "executed": 4, "reused": 0, "total_executed": 6,
"total_reused": 0, "removed_hosts": [], "reference": "cuda-graph-max-bs=128
mem-fraction-static=0.85", "notes": [], "rows": [{"config": "cuda-graph-max-bs=128
mem-fraction-static=0.85", "repeat": 0, "run": "99842d.1", "verdict": "pass", "signature":
null, "metric": 2371.06, "duration": 7.26972823899996, "reused_from": null, "reference": true,
"bar": ">= 0.95 * good"}, {"config": "cuda-graph-max-bs=128 mem-fraction-static=0.92",
"repeat": 0, "run": "99842d.2", "verdict": "pass", "signature": null, "metric": 2374.74,
"duration": 7.091455509000298, "reused_from": null, "reference": false, "bar":
">= 0.95 * good"}]}""".replace("\n", " ")
)


def test_a_sweep_answer_stored_the_old_way_loads_and_writes_back_the_same() -> None:
    answer = SweepAnswer.from_dict(OLD_SWEEP_ANSWER)
    assert answer.status is Status.DONE and not answer.resumable
    assert answer.reference == "cuda-graph-max-bs=128 mem-fraction-static=0.85"
    assert [(r.run, r.reference, r.metric) for r in answer.rows] == [
        ("99842d.1", True, 2371.06),
        ("99842d.2", False, 2374.74),
    ]
    assert answer.to_dict() == OLD_SWEEP_ANSWER
    assert list(answer.to_dict()) == list(OLD_SWEEP_ANSWER)
    # an answer from before the totals: that invocation's counts were the campaign's
    older = {
        k: v
        for k, v in OLD_SWEEP_ANSWER.items()
        if k not in ("total_executed", "total_reused", "resumable")
    }
    read = SweepAnswer.from_dict(older)
    assert (read.total_executed, read.total_reused, read.resumable) == (4, 0, False)


def test_a_sweep_spec_stored_the_old_way_loads_and_writes_back_the_same() -> None:
    old = {
        "sweep": "experiments/sweeps/rtx6000_cuda_graph.yaml",
        "name": "rtx6000-cuda-graph",
        "hosts": ["lab"],
        "repeat": 1,
        "axes": ["cuda-graph-max-bs"],
        "reference": 0,
        "reuse": False,
        "items": [
            {
                "label": "cuda-graph-max-bs=128",
                "values": [["cuda-graph-max-bs", 128]],
                "config": OLD_SPEC["good"],
            },
            {
                "label": "cuda-graph-max-bs=(absent)",
                "values": [["cuda-graph-max-bs", None]],
                "config": OLD_SPEC["bad"],
            },
        ],
    }
    spec = SweepSpec.from_dict(json.loads(json.dumps(old)))
    assert spec.reference == 0 and spec.hosts == ["lab"] and not spec.reuse
    assert [it.values for it in spec.items] == [
        [("cuda-graph-max-bs", 128)],
        [("cuda-graph-max-bs", None)],
    ]
    assert spec.to_dict() == old


# ------------------------------------------------------------------ campaigns on a scripted host


def _bisection(tmp_path: Path, store: Store, fresh: bool = True, **kw: object) -> Bisection:
    good, bad = scripted_pair(tmp_path / "exp", 4)
    plan = make_plan(good, bad, "auto")
    # the target needs deltas 1 and 2 together; delta 1 alone fails differently, earlier
    oracle = Oracle(
        [
            Rule(frozenset({1, 2}), "cuda_graph", TARGET_ERROR),
            Rule(frozenset({1}), "init", OTHER_ERROR),
        ]
    )
    return Bisection(
        store,
        plan,
        [host("h1")],
        options=BisectOptions(fresh=fresh),
        command="test",
        executor_factory=factory(oracle, Faults()),
        **kw,
    )  # type: ignore[arg-type]


def test_a_finished_bisection_stores_its_answer_as_the_typed_record_writes_it(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "results")
    events: list[Event] = []
    outcome = _bisection(tmp_path, store, listener=events.append).run()
    assert outcome.status is Status.FOUND
    [done] = [e for e in events if isinstance(e, CampaignFinished)]
    assert (done.campaign_id, done.status) == (outcome.campaign_id, "found")
    assert [c.indices for c in outcome.culprits] == [[1, 2]]
    assert [f.variant for f in outcome.findings] == [(1,)]
    stored = store.campaign(outcome.campaign_id)
    assert stored.status == "done"
    assert stored.answer == json.loads(json.dumps(outcome.to_dict()))
    assert Outcome.from_dict(stored.answer).to_dict() == stored.answer
    assert BisectSpec.from_dict(stored.spec).to_dict() == stored.spec
    store.close()


class _CtrlCAfter:
    """A listener that presses Ctrl-C once `n` runs are recorded (the main thread's view)."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def __call__(self, event: Event) -> None:
        if isinstance(event, RunRecorded):
            self.seen += 1
            if self.seen == self.n:
                raise KeyboardInterrupt


def test_an_interrupted_bisection_carries_its_partial_outcome_and_resumes(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "results")
    with pytest.raises(Interrupted) as caught:
        _bisection(tmp_path, store, listener=_CtrlCAfter(4)).run()
    exc = caught.value
    cid = exc.campaign_id
    assert exc.campaign == CampaignRef("bisect", cid) and exc.exit_code == 130
    partial = exc.partial
    assert isinstance(partial, Outcome) and partial.status is Status.INTERRUPTED
    assert partial.runs_executed == len(store.runs(cid)) == 4
    assert not partial.culprits  # nothing is claimed before the search ends
    met = {r.signature for r in store.runs(cid) if r.verdict is Verdict.OTHER}
    assert {f.signature for f in partial.findings} == met
    assert store.campaign(cid).status == "interrupted"
    # the same command continues it (without --fresh, which starts anew): the four runs
    # are kept, the answer comes
    resumed = _bisection(tmp_path, store, fresh=False)
    assert resumed.cid == cid and resumed.resumed
    outcome = resumed.run()
    assert outcome.status is Status.FOUND and outcome.runs_executed + 4 == len(store.runs(cid))
    store.close()


def _sweep_file(tmp_path: Path) -> Path:
    scripted_pair(tmp_path / "exp", 2)
    path = tmp_path / "exp" / "sweep.yaml"
    path.write_text("name: s\nconfigs: [good.yaml, bad.yaml]\nrepeat: 2\n")
    return path


def test_a_sweep_stopped_by_its_budget_is_resumable_and_the_cli_words_the_command(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "results")
    sweep = load_sweep(_sweep_file(tmp_path))
    oracle = Oracle([Rule(frozenset({0}), "cuda_graph", TARGET_ERROR)])
    args = argparse.Namespace(hosts="my hosts.yaml", results="res", json=False)

    def camp() -> SweepCampaign:
        return SweepCampaign(
            store,
            sweep,
            [host("s1")],
            max_runs=1,
            executor_factory=factory(oracle, Faults()),
            resume_text=lambda ref: common.resume_command(args, ref),
        )

    first = camp().run()
    assert first.status is Status.INCOMPLETE and first.resumable
    # absolute paths: the command works from any directory
    cmd = (
        f"orchestrator sweep --resume {first.campaign_id} "
        f"--hosts '{os.path.abspath('my hosts.yaml')}' --results {os.path.abspath('res')}"
    )
    assert first.resume == cmd
    stored = store.campaign(first.campaign_id).answer
    assert stored["resumable"] is True and stored["resume"] == cmd
    assert SweepAnswer.from_dict(stored).to_dict() == stored == first.answer().to_dict()
    spec = store.campaign(first.campaign_id).spec
    assert SweepSpec.from_dict(spec).to_dict() == spec
    second = camp()
    assert second.cid == first.campaign_id and second.resumed  # budget-stopped: it goes on
    assert second.run().total_executed == 2
    store.close()


def test_an_interrupted_sweep_carries_the_rows_recorded_so_far(tmp_path: Path) -> None:
    store = Store(tmp_path / "results")
    sweep = load_sweep(_sweep_file(tmp_path))
    oracle = Oracle([Rule(frozenset({0}), "cuda_graph", TARGET_ERROR)])
    with pytest.raises(Interrupted) as caught:
        SweepCampaign(
            store,
            sweep,
            [host("s2")],
            listener=_CtrlCAfter(3),
            executor_factory=factory(oracle, Faults()),
        ).run()
    partial = caught.value.partial
    assert caught.value.campaign.kind == "sweep"
    assert partial.status is Status.INTERRUPTED and len(partial.rows) == 4
    assert sum(1 for r in partial.rows if r.run is not None) == 3 == partial.total_executed
    assert store.campaign(partial.campaign_id).status == "interrupted"
    store.close()


# ------------------------------------------------------------------ the CLI words the resume


def test_the_cli_renders_the_resume_command_from_the_interrupt(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ref = CampaignRef("bisect", "abc123")

    left: dict[str, list[str] | None] = {"lab": []}

    def interrupted() -> None:
        raise Interrupted(ref, Outcome("abc123", Status.INTERRUPTED), left)

    args = argparse.Namespace(hosts="lab.yaml", results="results", json=False, verbose=False)
    assert common.run_campaign(interrupted, lambda e: None, "campaign", args) is None
    out = capsys.readouterr().out
    hosts, results = os.path.abspath("lab.yaml"), os.path.abspath("results")
    abs_opts = f"--hosts {hosts} --results {results}"
    assert f"resume with: orchestrator bisect --resume abc123 {abs_opts}" in out
    assert "the host was restored (read back: as found): lab" in out
    args.json = True
    assert common.run_campaign(interrupted, lambda e: None, "campaign", args) is None
    data = json.loads(capsys.readouterr().out)
    assert data == {
        "campaign": "abc123",
        "status": "interrupted",
        "restored": True,
        "error": "campaign abc123 interrupted; the host was restored (read back: as found): lab",
        "left": {"lab": []},
        "resume": f"orchestrator bisect --resume abc123 {abs_opts}",
    }
    # What the host read back shows is said, with the command that finishes the restore;
    # never "restored".
    left = {
        "lab": ["sglang.service is failed (it was active when the campaign found it)"],
        "other": None,
    }
    args.json = False
    assert common.run_campaign(interrupted, lambda e: None, "campaign", args) is None
    out = capsys.readouterr().out
    assert "restored" not in out.replace("NOT restored", "")
    assert (
        "lab: NOT restored: sglang.service is failed (it was active when the campaign "
        f"found it); finish it with: orchestrator restore --host lab --hosts {hosts}"
    ) in out
    assert "other: NOT restored: the restore was abandoned" in out


def test_host_trouble_stops_the_campaign_and_the_cli_adds_how_to_resume(tmp_path: Path) -> None:
    store = Store(tmp_path / "results")
    core = CampaignCore(store, kind="sweep", key="k1", spec=dict, secrets={})

    def troubled() -> None:
        with core.guard(lambda: None):
            for _ in range(3):  # three in a row on the only host
                core.note_infra(Verdict.INFRA, "h", "connection refused", healthy=1)

    args = argparse.Namespace(hosts=None, results="results", json=False)
    with pytest.raises(InfraError) as caught:
        common.run_campaign(troubled, lambda e: None, "sweep", args)
    assert caught.value.resumable == core.ref
    assert caught.value.hint == (
        "check h with: orchestrator hosts check h; then resume "
        f"with: orchestrator sweep --resume {core.cid} --results {os.path.abspath('results')}"
    )
    assert store.campaign(core.cid).status == "error"
    # one run that is not host trouble breaks the streak
    core.infra_streak = 0
    core.note_infra(Verdict.INFRA, "h", "x", healthy=1)
    core.note_infra(Verdict.PASS, "h", "", healthy=1)
    assert core.infra_streak == 0
    store.close()


def test_the_budget_counts_what_it_is_given(tmp_path: Path) -> None:
    store = Store(tmp_path / "results")
    core = CampaignCore(
        store, kind="bisect", key="k2", spec=dict, secrets={}, max_runs=2, deadline_s=0.0
    )
    assert core.budget_spent(1, deadline_reason="") == f"--deadline {0:g}s reached"
    assert core.budget_spent(2) == "--max-runs 2 reached"
    assert core.budget_spent(0, deadline_reason="time is up") == "time is up"
    loose = CampaignCore(store, kind="bisect", key="k3", spec=dict, secrets={})
    assert loose.budget_spent(10_000) == ""
    store.close()


def test_culprit_dicts_round_trip() -> None:
    cul = Culprit(
        deltas=["+ --a"],
        flags=["--a"],
        indices=[0],
        interacting=False,
        reproduced_by="c.3",
        cleared_by={"--a": None},
        confirmed=False,
    )
    assert Culprit.from_dict(cul.to_dict()) == cul
    assert "cleared_counts" not in cul.to_dict()  # not counted: not written


# ------------------------------------------------------------------ a single run, same core


def test_a_single_run_is_a_campaign_of_one_recorded_by_the_core(tmp_path: Path) -> None:
    from orchestrator.campaign.single import single_run
    from orchestrator.config.loading import load_experiment

    store = Store(tmp_path / "results")
    good, _ = scripted_pair(tmp_path / "exp", 1)
    oracle = Oracle([Rule(frozenset({0}), "cuda_graph", TARGET_ERROR)])
    events: list[Event] = []
    row = single_run(
        store,
        load_experiment(good),
        host("r1"),
        kind="run",
        command="test",
        label="good",
        listener=events.append,
        executor_factory=factory(oracle, Faults()),
    )
    assert row.verdict is Verdict.PASS and row.id.endswith(".1")
    camp = store.campaign(row.campaign)
    assert (camp.kind, camp.status, camp.spec["hosts"]) == ("run", "done", ["r1"])
    assert [e.run_id for e in events if isinstance(e, RunRecorded)] == [row.id]
    store.close()


def test_ctrl_c_during_a_single_run_marks_it_interrupted(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator.campaign.single import single_run
    from orchestrator.config.loading import load_experiment
    from tests.support.scripted import ScriptedExecutor

    class CtrlCInRun(ScriptedExecutor):  # Ctrl-C arrives while the server starts
        def run(self, *a: object, **kw: object) -> object:
            raise KeyboardInterrupt

    def make(h, service, campaign, listener):  # noqa: ANN001, ANN202
        return CtrlCInRun(h, Oracle([]), Faults(), listener)

    store = Store(tmp_path / "results")
    good, _ = scripted_pair(tmp_path / "exp", 1)

    def run() -> object:
        return single_run(
            store,
            load_experiment(good),
            host("r2"),
            kind="run",
            command="t",
            label="good",
            executor_factory=make,
        )

    with pytest.raises(Interrupted) as caught:
        run()
    assert caught.value.campaign.kind == "run" and caught.value.partial is None
    assert store.campaign(caught.value.campaign_id).status == "interrupted"
    assert common.run_single(run, lambda e: None) is None  # the CLI says so, exit 130
    assert "interrupted" in capsys.readouterr().out
    store.close()
