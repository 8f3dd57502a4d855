"""The default search over SSH, with flaky lab scenarios and no `--repeat`.

Through OpenSSH's sshd on 127.0.0.1 (the process manager), `orchestrator bisect` runs with
no strategy and no `--repeat` given, on two lab pairs whose scenarios draw afresh on every
start (`seed: random`, replayed from a fixed sequence, `ORCH_LAB_SEED=random:N`, so that a
test repeats its history):

- `flaky-load`: one environment variable (`NCCL_NVLS_ENABLE=1`) crashes the server under
  load on about half of the starts; startup and /health look fine, only the probe sees it;
- `decoy`: a deterministic target (`--moe-runner-backend flashinfer_cutlass`) beside a flag
  (`--enable-metrics`) whose different failure shows on some starts only.

The answer must be `found` only at the confidence asked, and the decoy must be reported as
a flaky `other` finding, never as the culprit.
"""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.campaign.planning import make_plan
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.lab.sshd import SshdEndpoint
from tests.support.campaign_lab import (
    Pair,
    bad_passes_first,
    cli,
    cli_json,
    lab_pair,
    lab_servers,
    read_runs,
    replayed_hosts_file,
)

COUNTS = re.compile(r"^fail \d+ of \d+$")
#: a replay sequence in which the search meets the decoy's failure on one start of a
#: variant and a pass on a start of a larger one (the 3rd and 6th starts here): with
#: another, it may meet the decoy once only (a finding, not yet known to be flaky) or
#: never. The answer must be the same in every sequence; only the finding's flakiness
#: needs this one.
DECOY_SEQUENCE = 9


def bisect(pair: Pair, hosts: Path, results: Path) -> tuple[int, dict]:
    return cli_json(
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
        timeout=900,
    )


def test_flaky_env_var_crashing_under_load_is_found_without_repeat(
    sshd: SshdEndpoint,
    tmp_path: Path,
) -> None:
    pair = lab_pair(tmp_path, "flaky-load")
    results = tmp_path / "results"
    base = bad_passes_first(make_plan(pair.good, pair.bad).bad, "flaky-load")
    code, answer = bisect(pair, replayed_hosts_file(sshd, tmp_path, base), results)
    assert code == 0, answer
    assert answer["status"] == "found"
    [cul] = answer["culprits"]
    assert cul["interacting"] is False and "NCCL_NVLS_ENABLE" in cul["flags"][0], cul
    assert cul["confirmed"] is True
    # the crash under load: seen by the probe only
    assert "an illegal memory access was encountered" in answer["target"]
    assert answer["confidence"] >= 0.95
    assert 0 < answer["reproduction_rate"] < 1  # flaky: some starts with it passed
    assert COUNTS.match(answer["noise"]["reproduction_counts"])
    runs = read_runs(results, answer["campaign"])
    [idx] = cul["indices"]
    for r in runs:  # a target failure is proof: none without the variable
        if r.verdict is Verdict.FAIL:
            assert idx in r.variant, r
    assert any(r.verdict is Verdict.PASS and idx in r.variant for r in runs)
    bad = [r for r in runs if r.label == "bad"]  # it passed first, and was started again
    assert bad[0].verdict is Verdict.PASS and any(r.verdict is Verdict.FAIL for r in bad)
    assert lab_servers(pair.port) == []


def test_deterministic_target_beside_a_flaky_decoy(sshd: SshdEndpoint, tmp_path: Path) -> None:
    pair = lab_pair(tmp_path, "decoy")
    results = tmp_path / "results"
    code, answer = bisect(pair, replayed_hosts_file(sshd, tmp_path, DECOY_SEQUENCE), results)
    assert code == 0, answer
    assert answer["status"] == "found"
    [cul] = answer["culprits"]
    assert cul["flags"] == ["--moe-runner-backend flashinfer_cutlass"], cul
    assert "misaligned address" in answer["target"]
    assert answer["confidence"] >= 0.95
    # the decoy: never the culprit, reported as an `other` finding that is flaky
    assert all("--enable-metrics" not in c["flags"] for c in answer["culprits"])
    [decoy] = [f for f in answer["findings"] if "Duplicated timeseries" in f["signature"]]
    metrics = cul_index(answer, "--enable-metrics")
    assert metrics in decoy["deltas"] and cul["indices"][0] not in decoy["deltas"], decoy
    assert decoy["flaky"] is True and decoy["passed"] >= 1, decoy
    # the store agrees: a variant with the decoy (and without the target's flag) showed its
    # failure, and one with it passed
    runs = read_runs(results, answer["campaign"])
    with_it = {
        r.verdict for r in runs if metrics in r.variant and cul["indices"][0] not in r.variant
    }
    assert {Verdict.PASS, Verdict.OTHER} <= with_it, with_it
    for r in runs:  # a target failure always has the target's flag
        if r.verdict is Verdict.FAIL and "misaligned" in str(r.signature):
            assert cul["indices"][0] in r.variant, r
    # the report words the decoy as a flaky other failure
    shown = cli("report", answer["campaign"], "--results", results)
    assert shown.returncode == 0, shown.stderr
    md = next(Path(p) for p in answer["reports"] if p.endswith(".md")).read_text()
    assert re.search(
        r"other failure `warmup: ValueError: Duplicated timeseries.*flaky: passed "
        r"\d+x with it",
        md,
    ), md
    assert lab_servers(pair.port) == []


def cul_index(answer: dict, flag: str) -> int:
    """The position of the delta `flag` in the campaign's delta list."""
    return next(i for i, d in enumerate(answer["deltas"]) if flag.split()[0] in d)
