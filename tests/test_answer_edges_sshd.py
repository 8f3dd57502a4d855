"""True answers at the edges of a launch and of a repair, on the real sshd lab.

A launch that never reached the server (a typo'd interpreter) is `invalid` from `run` as
from `bisect`, and is never reused as a verdict, not even one recorded as a failure before
such launches were told apart. A repair that finds no working window says so with the
target bad shows as written; a regression that is itself a resource failure is named with
the repair that avoids it; a repair runs from the value the server chose itself when the
config does not set the knob.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import yaml

from orchestrator.lab.sshd import SshdEndpoint
from tests.support.campaign_lab import (
    cli,
    cli_json,
    lab_pair,
    lab_servers,
    read_runs,
    sshd_hosts_file,
)

TYPO = "/usr/bin/pyhton3 -m orchestrator.lab.server --scenario b300"


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_launch_that_never_reached_the_server_is_invalid_and_never_reused(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    hosts = sshd_hosts_file(sshd, tmp_path)
    pair = lab_pair(tmp_path, "b300")
    typo = _write(
        tmp_path / "typo.yaml",
        {
            "name": "typo",
            "extends": str(pair.good),
            "service": {"exec": TYPO, "flags": {"max-running-requests": 256}},
        },
    )
    results = tmp_path / "results"
    code, ran = cli_json("run", typo, "--host", "lab", "--hosts", hosts, "--results", results)
    assert code == 2, ran  # rejected before it could run: a usage/config error
    assert ran["verdict"] == "invalid", ran
    assert "never reached the server" in ran["detail"] and "pyhton3" in ran["detail"]
    # As the run was recorded before such launches were told apart: a `fail` at init
    db = sqlite3.connect(results / "orchestrator.db")
    with db:
        db.execute(
            "UPDATE runs SET verdict='fail', signature=? WHERE id=?",
            ("init|untyped|launch.sh: <n>: exec:: not found", ran["run"]),
        )
    db.close()
    args = ("bisect", "--good", pair.good, "--bad", typo, "--host", "lab", "--hosts", hosts)
    code, answer = cli_json(*args, "--results", results)
    assert code == 1, answer
    assert answer["status"] == "endpoints" and answer["culprits"] == [], answer
    assert "the bad config could not be judged: invalid" in answer["message"], answer
    assert "never reached the server" in answer["message"]
    runs = read_runs(results, answer["campaign"])
    bad = [r for r in runs if len(r.variant) == 2]
    # bad was started again, not taken from the old record
    assert bad and all(r.cached_from is None and r.verdict.value == "invalid" for r in bad)
    # nor is this campaign's own invalid start reused by the next one
    code, again = cli_json(*args, "--results", results)
    assert code == 1 and again["status"] == "endpoints", again
    bad = [r for r in read_runs(results) if len(r.variant) == 2]
    assert len(bad) == 2 and all(r.cached_from is None for r in bad), bad
    assert lab_servers(pair.port) == []


def _bisect(sshd: SshdEndpoint, tmp_path: Path, pair_name: str) -> tuple[int, dict, Path]:
    pair = lab_pair(tmp_path, pair_name)
    hosts = sshd_hosts_file(sshd, tmp_path)
    results = tmp_path / "results"
    args = ("bisect", "--good", pair.good, "--bad", pair.bad, "--host", "lab", "--hosts", hosts)
    code, answer = cli_json(*args, "--results", results)
    assert lab_servers(pair.port) == []
    return code, answer, results


def test_a_repair_with_no_working_window_keeps_the_failure_bad_shows_as_written(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    code, answer, results = _bisect(sshd, tmp_path, "rtx6000-nowindow")
    assert code == 1, answer
    # the target is bad's failure as written, never the repaired start's graph-capture OOM
    assert answer["target"].startswith("kv_cache: cuda_oom: CUDA out of memory"), answer
    assert answer["status"] == "incomplete", answer
    said = answer["message"]
    assert said == answer["resource"] and said.startswith("no working window")
    [bad] = [n for n in answer["repairs"] if n["variant"] == "bad"]
    assert bad["state"] == "unrepaired" and bad["before_run"] != bad["after_run"]
    # both sides' runs, each with what it showed
    runs = {r.id: r for r in read_runs(results, answer["campaign"])}
    low, high = runs[bad["before_run"]], runs[bad["after_run"]]
    assert f"bad as written: run {low.id}" in said and f": run {high.id}]" in said
    assert str(low.signature).startswith("kv_cache: cuda_oom") and "--mem-fraction-static" in said
    assert str(high.signature).startswith("cuda_graph: cuda_oom") and high.repair
    # the answer is that of the failure as written: --ep-size, never "repaired with"
    assert [c["flags"] for c in answer["culprits"]] == [["--ep-size 8"]]
    assert all(not c.get("repaired_with") for c in answer["culprits"])
    issue = cli("report", answer["campaign"], "--issue", "--results", results)
    assert issue.returncode == 0, issue.stderr
    assert "no working window" in issue.stdout
    assert "This command line is the repaired one" not in issue.stdout
    repro = issue.stdout.split("## Reproduction", 1)[1].split("```", 2)[1]
    assert "--mem-fraction-static 0.85" in " ".join(repro.split()), repro
    assert "0.89" not in repro


def test_a_regression_that_is_itself_a_resource_failure_is_named_with_its_repair(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    code, answer, results = _bisect(sshd, tmp_path, "hicache")
    assert code == 0, answer
    assert answer["status"] == "found", answer
    assert answer["target"].startswith("kv_cache: cuda_oom: CUDA out of memory"), answer
    [cul] = answer["culprits"]
    assert cul["flags"] == ["--enable-hierarchical-cache"]
    assert cul["needs"] == ["--mem-fraction-static >= 0.89"]
    assert "the repair avoids" in answer["resource"]
    assert "does not fail" not in answer["message"]
    # bad was started as written and once repaired, not again and again as if it passed
    bad = [r for r in read_runs(results, answer["campaign"]) if len(r.variant) == 2]
    assert len(bad) == 2 and str(bad[0].signature) == answer["target"] and bad[1].repair
    text = cli("report", answer["campaign"], "--issue", "--results", results)
    assert "needs --mem-fraction-static >= 0.89" in text.stdout


def test_a_repair_moves_the_value_the_server_chose_when_the_config_sets_none(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    code, answer, results = _bisect(sshd, tmp_path, "rtx6000-default")
    assert code == 0, answer
    assert answer["status"] == "found", answer
    assert answer["target"].startswith("cuda_graph: AssertionError"), answer
    [cul] = answer["culprits"]
    assert sorted(cul["flags"]) == ["--ep-size 8", "--moe-a2a-backend flashinfer"]
    moved = "--mem-fraction-static 0.88 (chosen by the server) -> 0.92"
    assert cul["repaired_with"] == [moved]
    runs = {r.id: r for r in read_runs(results, answer["campaign"])}
    rep = runs[cul["reproduced_by"]]
    assert rep.repair and "--mem-fraction-static 0.92" in " ".join(rep.argv)
    first = runs[rep.repair["after"]]  # the start it repaired set no fraction: the server's
    assert "--mem-fraction-static" not in first.argv
    assert "mem_fraction_static=0.88" in first.log_tail()
