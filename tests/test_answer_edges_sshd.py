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
    assert code == 1 and again["runs_executed"] >= 1, again
    assert lab_servers(pair.port) == []
