"""A prefill/decode pair whose roles disagree on the KV cache dtype, through the command
line on real hosts (two host names on OpenSSH's sshd at 127.0.0.1, each role a detached
lab server): the lab's router then returns decode's tokens with the text scrambled
(orchestrator/lab/pd.py), and the answers check, which compares the text as well as the
tokens, names the decode role's flag with a garbled answer, under `logprobs-close` as
under `exact`, where it once passed bad on all 16 starts. And an absolute score bar judges
`run` and good's own run without a reference.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.lab.sshd import SshdEndpoint
from tests.support.campaign_lab import cli, cli_json, our_processes
from tests.support.deployment_lab import pd_files, two_sshd_hosts

pytestmark = pytest.mark.sshd


@pytest.fixture
def hosts(sshd: SshdEndpoint, tmp_path: Path) -> Iterator[Path]:
    path = two_sshd_hosts(sshd, tmp_path)
    yield path
    for name in ("n0", "n1"):
        for pid in our_processes(str(tmp_path / f"run-{name}")):
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except OSError:
                pass


def dtype_pair(tmp_path: Path, rule: str) -> tuple[Path, Path]:
    """The shipped good split with its answers judged under `rule`, and a bad one whose
    decode role reads its KV cache as fp8 (started although the roles disagree) and which
    also raises the shared request limit, a harmless change."""
    good = pd_files(tmp_path)["good"]
    doc = yaml.safe_load(good.read_text())
    doc["answers"] = {
        "enabled": True,  # the shipped pair asks one completion only (enabled: false)
        "rule": rule,
        "modes": ["sequential"],
        "max_tokens": 16,
        "timeout": 20,
    }
    good.write_text(yaml.safe_dump(doc, sort_keys=False))
    bad = good.parent / "pd-dtype.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "name": "test-pd-dtype",
                "extends": good.name,
                "mismatched_roles": "start",
                "service": {"flags": {"max-running-requests": 256}},
                "roles": {"decode": {"flags": {"kv-cache-dtype": "fp8_e4m3"}}},
            },
            sort_keys=False,
        )
    )
    return good, bad


@pytest.mark.parametrize("rule", ["logprobs-close", "exact"])
def test_scrambled_text_with_the_right_tokens_is_bisected_to_the_decode_flag(
    hosts: Path, tmp_path: Path, rule: str
) -> None:
    good, bad = dtype_pair(tmp_path, rule)
    results = tmp_path / "results"
    argv = ["bisect", "--good", good, "--bad", bad, "--host", "n0", "--hosts", hosts]
    code, out = cli_json(*argv, "--results", results, "--no-report")
    assert code == 0, out
    assert out["status"] == "found", out
    assert [c["deltas"] for c in out["culprits"]] == [["decode: + --kv-cache-dtype fp8_e4m3"]], out
    assert out["target"] == "serving: wrong_output: garbled answers", out
    shown = cli("show", out["culprits"][0]["reproduced_by"], "--results", results)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    text = " ".join(shown.stdout.split())
    assert f"judged WRONG (garbled) under {rule}" in text, text
    assert "the same tokens, another text; breaks the rule; garbled: repetitive" in text, text


#: the shipped set's France question (the lab answers it right) and one the lab cannot
#: answer: the lab's score on this set is 0.50
HALF = (
    '{"id": "fact-france", "messages": [{"role": "user", "content": '
    '"What is the capital of France?"}], "expect": "Paris"}\n'
    '{"id": "gate", "prompt": "The password for the west gate is", "expect": "ALBATROSS"}\n'
)


def test_an_absolute_score_bar_judges_run_and_goods_own_run(hosts: Path, tmp_path: Path) -> None:
    """`run` with `pass_if: ">= 0.75"` and a score of 0.50 fails, judged by the bar alone;
    a bisection whose good misses it ends at its endpoints, saying so, bad never started."""
    files = pd_files(tmp_path)
    (tmp_path / "experiments" / "half.jsonl").write_text(HALF)
    good = files["good"]
    doc = yaml.safe_load(good.read_text())
    doc["answers"] = {
        "enabled": True,
        "prompts": "half.jsonl",
        "rule": "score",
        "pass_if": ">= 0.75",
        "modes": ["sequential"],
        "max_tokens": 16,
        "timeout": 20,
    }
    good.write_text(yaml.safe_dump(doc, sort_keys=False))
    results = tmp_path / "results"
    code, out = cli_json("run", good, "--host", "n0", "--hosts", hosts, "--results", results)
    assert (code, out["verdict"]) == (0, "fail"), out  # a verdict about the config
    assert out["signature"] == "serving: wrong_output: the score dropped below the bar", out
    assert "score 0.50 misses '>= 0.75'; wrong: 'gate'" in out["detail"], out
    bad = good.parent / "pd-more.yaml"
    bad.write_text(
        yaml.safe_dump({"extends": good.name, "service": {"flags": {"max-running-requests": 256}}})
    )
    argv = ["bisect", "--good", good, "--bad", bad, "--host", "n0", "--hosts", hosts]
    code, out = cli_json(*argv, "--results", results, "--no-report")
    assert (code, out["status"]) == (1, "endpoints"), out
    assert out["message"].startswith(
        "the good config's own score 0.50 misses the bar '>= 0.75' on n0 (sequential; "
        "wrong: 'gate')"
    ), out
