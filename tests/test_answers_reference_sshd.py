"""The answers check at a campaign's ends through the real CLI on the real sshd lab: a good
whose server crashes while asked again fails with its crash (never noise), and a rerun of
the reference is judged by the reference's recorded answers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.lab.sshd import SshdEndpoint
from tests.hosts.procs import free_port
from tests.support.campaign_lab import (
    LAB,
    SETTLE,
    cli,
    cli_json,
    lab_servers,
    read_runs,
    sshd_hosts_file,
)

pytestmark = pytest.mark.sshd

CRASH = "RuntimeError: CUDA error: an illegal memory access was encountered"


def _pair(tmp: Path, faults: list[dict]) -> tuple[Path, Path, Path, int]:
    """A lab pair on a scenario of this test's own (crash-wrong's, `faults` replacing its
    own): good answers right; bad adds an fp8 KV cache that garbles every answer."""
    scenario = yaml.safe_load((LAB / "crash-wrong" / "scenario.yaml").read_text())
    scenario["faults"] = faults
    path = tmp / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    port = free_port()
    good = tmp / "good.yaml"
    good.write_text(
        yaml.safe_dump(
            {
                "name": "answers-good",
                "extends": str(LAB / "crash-wrong" / "good.yaml"),
                "service": {
                    "exec": f"python3 -m orchestrator.lab.server --scenario {path}",
                    "flags": {"port": port},
                },
                "health": SETTLE,
                "answers": {"rule": "logprobs-close"},
            },
            sort_keys=False,
        )
    )
    bad = tmp / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "name": "answers-bad",
                "extends": str(good),
                "service": {"flags": {"kv-cache-dtype": "fp8_e5m2", "max-running-requests": 256}},
            },
            sort_keys=False,
        )
    )
    return good, bad, path, port


def test_a_good_that_crashes_while_asked_again_fails_with_its_crash(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    # 9 prompts one at a time and batched (18 requests), then good's second pass: the
    # 21st request crashes the server, as a CUDA error after a few requests does
    crash = {"when": {"tp-size": 8}, "phase": "serving", "after_requests": 21, "error": CRASH}
    good, bad, _, port = _pair(tmp_path, [crash])
    hosts = sshd_hosts_file(sshd, tmp_path)
    results = tmp_path / "results"
    args = ("bisect", "--good", good, "--bad", bad, "--host", "lab", "--hosts", hosts)
    code, answer = cli_json(*args, "--results", results)
    assert lab_servers(port) == []
    assert answer["status"] == "endpoints", answer
    assert code != 0, answer
    runs = read_runs(results, answer["campaign"])
    [good_run] = [r for r in runs if r.variant == ()]
    assert good_run.verdict.value == "fail", good_run
    assert "illegal memory access" in str(good_run.signature), good_run.signature
    assert "the good config does not pass" in answer["message"], answer["message"]
    assert good_run.id in answer["message"]
    # bad is never started on a good that failed, and no looser rule is advised
    assert [r.variant for r in runs] == [()]
    text = str(answer)
    assert "answers.rule" not in text and "disagrees with itself" not in text, text


def test_a_rerun_of_the_reference_is_judged_by_its_recorded_answers(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    good, bad, scenario, port = _pair(tmp_path, [])
    hosts = sshd_hosts_file(sshd, tmp_path)
    results = tmp_path / "results"
    args = ("bisect", "--good", good, "--bad", bad, "--host", "lab", "--hosts", hosts)
    code, answer = cli_json(*args, "--results", results)
    assert code == 0 and answer["status"] == "found", answer
    [good_run] = [r for r in read_runs(results, answer["campaign"]) if r.variant == ()]
    # the host's server now answers some prompts otherwise on the same config
    data = yaml.safe_load(scenario.read_text())
    data["answers"] = [
        *data.get("answers", []),
        {"description": "drift", "when": {"tp-size": 8}, "effect": "wrong", "fraction": 0.5},
    ]
    scenario.write_text(yaml.safe_dump(data, sort_keys=False))
    res = cli("rerun", good_run.id, "--repeat", "2", "--hosts", hosts, "--results", results)
    assert lab_servers(port) == []
    out = res.stdout
    assert "answers judged under logprobs-close against the recorded run's own" in out, out
    assert "failed 2 of 2 starts" in out, out + res.stderr
    assert "wrong_output" in out, out
    # the answer names the check that judged it
    assert answer["answers"].startswith("answers judged under logprobs-close"), answer
