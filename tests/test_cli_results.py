"""Looking at recorded results from the command line, and running a recorded run again.

Every test works on its own copy of the results of a real b300 bisection on the sshd
host (made once per session): `runs`, `runs --campaigns`, `show`, `report`, `classify`
and their error paths run in-process through `orchestrator.cli.main`; `rerun` runs the
recorded variant on the host again and must reproduce its verdict and signature.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.store.store import RunRow, Store
from tests.support.campaign_lab import Recorded, cli, lab_servers, recorded_b300

FINDING = (
    "init: AttributeError: 'NoneType' object has no attribute 'dtype' @ sglang/pynccl.py:__init__"
)


@dataclass
class Results:
    rec: Recorded
    dir: Path
    runs: list[RunRow]

    def run_of(self, label: str) -> RunRow:
        return next(r for r in self.runs if r.label == label)

    def finding_run(self) -> RunRow:
        """The smallest variant that showed the separate finding (good + --ep-size 8)."""
        [finding] = self.rec.outcome["findings"]
        return next(r for r in self.runs if r.id == finding["run"])


@pytest.fixture
def results(
    sshd: SshdEndpoint,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> Results:
    rec = recorded_b300(sshd, tmp_path_factory.getbasetemp())
    assert rec.exit_code == 0, rec.outcome
    path = rec.copy_results(tmp_path / "results")
    monkeypatch.setenv("COLUMNS", "250")  # tables unclipped
    store = Store(path)
    try:
        runs = store.runs(rec.campaign)
    finally:
        store.close()
    return Results(rec, path, runs)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    """`orchestrator ARGS` in-process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_runs_lists_every_run_and_campaign(
    results: Results, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "runs", "--results", results.dir)
    assert code == 0, err
    for r in results.runs:
        assert r.id in out
    assert "good" in out and "bad" in out and "other" in out

    code, out, _ = run_cli(
        capsys, "runs", "--campaign", results.rec.campaign, "--results", results.dir, "--json"
    )
    assert code == 0
    listed = json.loads(out)
    assert [x["id"] for x in listed] == [r.id for r in results.runs]
    assert [x["verdict"] for x in listed] == [r.verdict.value for r in results.runs]

    code, out, _ = run_cli(capsys, "runs", "--campaigns", "--results", results.dir)
    assert code == 0
    [line] = [ln for ln in out.splitlines() if results.rec.campaign in ln]
    assert "bisect" in line and "done" in line and str(len(results.runs)) in line
    assert "--ep-size 8 + --enable-nccl-nvls" in line


def test_show_gives_diff_verdict_signature_and_log_tail(
    results: Results, capsys: pytest.CaptureFixture[str]
) -> None:
    run = results.finding_run()
    code, out, err = run_cli(capsys, "show", run.id, "--results", results.dir)
    assert code == 0, err
    assert f"run {run.id} of campaign {results.rec.campaign}" in out
    assert "verdict: other" in out
    assert f"signature: {FINDING}" in out
    lines = out.splitlines()
    diff = lines[lines.index("config against good:") + 1 :]
    assert [ln.strip() for ln in diff if ln.strip().startswith(("+", "-"))] == ["+--ep-size 8"]
    assert "log tail (" in out
    assert "AttributeError: 'NoneType' object has no attribute 'dtype'" in out.split("log tail")[1]

    code, out, _ = run_cli(capsys, "show", results.run_of("good").id, "--results", results.dir)
    assert code == 0
    assert "config: identical to good" in out and "verdict: pass" in out


def test_report_writes_markdown_and_html(
    results: Results, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = results.dir / "reports"
    for p in reports.glob("*"):
        p.unlink()
    code, out, err = run_cli(capsys, "report", results.rec.campaign[:4], "--results", results.dir)
    assert code == 0, err
    paths = [Path(line) for line in out.split()]
    assert sorted(p.name for p in paths) == [
        f"{results.rec.campaign}.html",
        f"{results.rec.campaign}.md",
    ]
    md = (reports / f"{results.rec.campaign}.md").read_text()
    assert "## Answer" in md and "`--ep-size 8` + `--enable-nccl-nvls`" in md
    assert md.count(f"| {results.rec.campaign}.") == len(results.runs)  # one step row per run
    html = (reports / f"{results.rec.campaign}.html").read_text()
    assert "id=answer" in html and "id=steps" in html


def test_classify_lists_recorded_runs_with_the_same_signature(
    results: Results, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = results.run_of("bad")
    assert bad.log_path and bad.signature is not None
    same = [r.id for r in results.runs if r.signature == bad.signature and not r.cached_from]
    assert len(same) >= 2  # the bad endpoint and good + the culprit set
    code, out, err = run_cli(capsys, "classify", bad.log_path, "--results", results.dir)
    assert code == 0, err
    assert f"seen before in {len(same)} recorded run(s)" in out
    for rid in same:
        assert rid in out
    assert "--ep-size 8" in out  # with which flags

    code, out, _ = run_cli(capsys, "classify", bad.log_path, "--results", results.dir, "--json")
    data = json.loads(out)
    assert data["signature"] == bad.signature.key()
    assert [x["run"] for x in data["seen_in_runs"]] == same


@pytest.mark.parametrize(
    "args",
    [("show", "nope.1"), ("report", "nope"), ("runs", "--campaign", "nope"), ("rerun", "nope.1")],
    ids=["show", "report", "runs", "rerun"],
)
def test_unknown_ids_exit_2_with_one_line(
    results: Results, capsys: pytest.CaptureFixture[str], args: tuple[str, ...]
) -> None:
    extra = ("--hosts", results.rec.hosts) if args[0] == "rerun" else ()
    code, out, err = run_cli(capsys, *args, "--results", results.dir, *extra)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: no ") and "'nope" in lines[0], err
    assert len(lines) <= 2 and all(ln.strip().startswith("hint:") for ln in lines[1:]), err
    assert "Traceback" not in err


def test_unknown_run_in_a_subprocess_has_no_traceback(results: Results) -> None:
    res = cli("show", "nope.1", "--results", results.dir, timeout=120)
    assert res.returncode == 2
    assert res.stderr.startswith("error: no run 'nope.1' in ")
    assert "Traceback" not in res.stderr and res.stdout == ""


# ---- rerun on the host --------------------------------------------------------------------------


def test_rerun_of_a_failing_run_reproduces_its_signature(
    results: Results, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = results.rec.hosts
    # The separate finding, as JSON
    old = results.finding_run()
    code, out, err = run_cli(
        capsys, "rerun", old.id, "--hosts", hosts, "--results", results.dir, "--json"
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["rerun_of"] == old.id
    assert (data["old_verdict"], data["old_signature"]) == ("other", FINDING)
    assert (data["verdict"], data["signature"]) == ("other", FINDING)
    assert data["same"] is True

    # The target failure, as text
    bad = results.run_of("bad")
    code, out, err = run_cli(capsys, "rerun", bad.id, "--hosts", hosts, "--results", results.dir)
    assert code == 0, err
    lines = [
        " ".join(ln.split()) for ln in out.splitlines() if ln.startswith(("recorded run", "rerun "))
    ]
    assert lines[0] == f"recorded run {bad.id} on lab: fail {bad.signature}"
    assert lines[1].startswith("rerun ") and lines[1].endswith(f" on lab: fail {bad.signature}")
    assert "same verdict and signature" in out

    # Exactly the recorded config ran again: same argv and environment, recorded as new runs.
    store = Store(results.dir)
    try:
        new = {r.label: r for c in store.campaigns() if c.kind == "rerun" for r in store.runs(c.id)}
    finally:
        store.close()
    again = new[f"rerun of {bad.id}: {bad.label}"]
    assert (again.argv, again.env) == (bad.argv, bad.env)
    assert bad.signature is not None
    assert again.verdict is Verdict.FAIL and again.signature == bad.signature
    again_finding = new[f"rerun of {old.id}: {old.label}"]
    assert again_finding.argv == old.argv and str(again_finding.signature) == FINDING
    assert lab_servers(results.rec.pair.port) == []


def test_rerun_repeat_reports_the_reproduction_rate(
    results: Results, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = results.run_of("bad")
    code, out, err = run_cli(
        capsys,
        "rerun",
        bad.id,
        "--repeat",
        "2",
        "--hosts",
        results.rec.hosts,
        "--results",
        results.dir,
        "--json",
    )
    assert code == 0, err
    data = json.loads(out)
    assert (data["starts"], data["judged"], data["failed"], data["target_failures"]) == (2, 2, 2, 2)
    assert data["signatures"] == {str(bad.signature): 2} and data["rate"] == 1.0
    assert [r["verdict"] for r in data["runs"]] == ["fail", "fail"]
    assert lab_servers(results.rec.pair.port) == []
