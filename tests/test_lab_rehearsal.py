"""Rehearsal on dummy weights, end to end on the lab (sshd host, process manager, the
simulated SGLang server): its load phase takes its time from the model's size unless the
load format is dummy, and a fault may need the real weights.

- the b300 pair with `rehearse: dummy-weights` gives the answer the plain campaign gives
  (the session's recorded b300 bisection), with fewer starts on real weights, and every
  run says which weights it loaded;
- a failure of the checkpoint (`b300-checkpoint`: a tensor missing on real weights only)
  does not show on dummy weights: the campaign says so and searches on real weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from orchestrator.lab.sshd import SshdEndpoint
from tests.support.campaign_lab import (
    check_answer_evidence,
    cli,
    lab_pair,
    lab_servers,
    read_runs,
    recorded_b300,
    sshd_hosts_file,
)


def bisect_json(pair, hosts: Path, results: Path, *extra: str) -> tuple[int, dict]:  # noqa: ANN001
    res = cli(
        "bisect",
        "--good",
        pair.good,
        "--bad",
        pair.bad,
        "--host",
        "lab",
        "--hosts",
        hosts,
        "--results",
        results,
        "--json",
        *extra,
    )
    try:
        return res.returncode, json.loads(res.stdout)
    except json.JSONDecodeError:
        raise AssertionError(
            f"no JSON (exit {res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        ) from None


def test_b300_rehearsed_on_dummy_weights_gives_the_same_answer(
    sshd: SshdEndpoint, tmp_path: Path, tmp_path_factory
) -> None:  # noqa: ANN001
    plain = recorded_b300(sshd, tmp_path_factory.getbasetemp())
    assert plain.exit_code == 0, plain.outcome
    pair = lab_pair(tmp_path, "b300")
    data = yaml.safe_load(pair.bad.read_text())
    pair.bad.write_text(yaml.safe_dump(data | {"rehearse": "dummy-weights"}))
    code, answer = bisect_json(pair, sshd_hosts_file(sshd, tmp_path), tmp_path / "results")
    assert code == 0 and answer["status"] == "found", answer
    assert [sorted(c["flags"]) for c in answer["culprits"]] == [
        sorted(c["flags"]) for c in plain.outcome["culprits"]
    ]
    assert answer["target"] == plain.outcome["target"]
    assert [f["signature"] for f in answer["findings"]] == [
        f["signature"] for f in plain.outcome["findings"]
    ]
    runs = read_runs(tmp_path / "results", answer["campaign"])
    real = [r for r in runs if r.weights == "real"]
    dummy = [r for r in runs if r.weights == "dummy"]
    plain_runs = read_runs(plain.root / "results", plain.campaign)
    assert all(r.weights == "real" for r in plain_runs)
    assert len(real) == 2 < len(plain_runs)  # bad (the target), good + the pair (confirmed)
    assert [r.purpose for r in real] == ["endpoint", "confirm"]
    assert all("--load-format dummy" in " ".join(r.argv) for r in dummy)
    assert not any("--load-format" in r.argv for r in real)
    # the server loaded random weights: no checkpoint shard progress in a dummy run's log
    assert "Loading safetensors checkpoint shards" not in dummy[0].log_tail()
    w = answer["weights"]
    assert (w["rehearsal"], w["search"], w["real_starts"]) == ("confirmed", "dummy", 2)
    assert w["dummy_starts"] == len(dummy)
    check_answer_evidence(tmp_path / "results", answer, answer["target"])
    assert lab_servers(pair.port) == []


def test_weight_dependent_failure_falls_back_to_real_weights(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    pair = lab_pair(tmp_path, "b300-checkpoint")
    code, answer = bisect_json(
        pair, sshd_hosts_file(sshd, tmp_path), tmp_path / "results", "--rehearse"
    )
    assert code == 0 and answer["status"] == "found", answer
    assert [c["flags"] for c in answer["culprits"]] == [["--quantization w4afp8"]]
    assert answer["target"].startswith("load_weights: ")
    w = answer["weights"]
    assert (w["rehearsal"], w["search"]) == ("not reproduced", "real")
    assert "does not show with dummy weights" in w["note"]
    runs = read_runs(tmp_path / "results", answer["campaign"])
    dummy = [r for r in runs if r.weights == "dummy"]
    assert dummy and all(r.verdict.value == "pass" and r.purpose == "rehearsal" for r in dummy)
    assert len(dummy) == w["dummy_starts"]
    assert lab_servers(pair.port) == []
