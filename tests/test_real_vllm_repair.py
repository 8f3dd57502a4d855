"""The `real` tier: a culprit seen only behind a repaired start, on the real vLLM.

experiments/real/vllm-cpu/kv_repair.yaml: one key of `--hf-overrides` raises the model's
length to 1.5M tokens, whose KV cache does not fit good.yaml's `VLLM_CPU_KVCACHE_SPACE=1`
(vLLM refuses at KV cache: a resource failure, `kv_cache_too_small`); started again with
the built-in move (the cache space doubled), the bad config shows the failure behind it,
the CPU attention backend refusing `--block-size 16`. Through the lab's sshd, the answer
is `--block-size 16` (good plus it alone shows it too) with the repair named; with
`--no-repair` (the same results store: its starts reused) the KV cache failure is the
target and the `--hf-overrides` key its cause.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.lab.sshd import SshdEndpoint, free_port
from orchestrator.store.store import Store
from tests.hosts.vllm import REAL, RealVllm
from tests.support.campaign_lab import cli, cli_json

KV = "VLLM_CPU_KVCACHE_SPACE"
HF = "--hf-overrides.max_position_embeddings 1500000"


def test_a_culprit_behind_a_kv_cache_too_small_is_found_with_the_repair(
    sshd: SshdEndpoint, vllm_real: RealVllm, tmp_path: Path
) -> None:
    assert vllm_real.experiments == REAL
    port = free_port()
    files = []
    for side, name in (("good", "good.yaml"), ("bad", "kv_repair.yaml")):
        path = tmp_path / f"{side}.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "name": f"test-kv-repair-{side}",
                    "extends": str(REAL / name),
                    "service": {"flags": {"port": port}},
                }
            )
        )
        files.append(path)
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(sshd.hosts_yaml("lab", run_dir=str(tmp_path / "run")))
    results = tmp_path / "results"
    args = (
        "bisect",
        "--good",
        files[0],
        "--bad",
        files[1],
        "--host",
        "lab",
        "--hosts",
        hosts,
        "--results",
        results,
    )
    code, answer = cli_json(*args, timeout=3000)
    assert code == 0 and answer["status"] == "found", answer
    assert "No common block size for" in answer["target"], answer["target"]
    assert [c["flags"] for c in answer["culprits"]] == [["--block-size 16"]], answer
    notes = {n["variant"]: n for n in answer["repairs"]}
    bad = notes["bad"]
    assert bad["state"] == "repaired" and bad["moves"] == [f"env {KV} 1 -> 2"], bad
    assert bad["before"].startswith("failed on a resource (kv_cache: kv_cache_too_small")
    assert bad["after"].startswith("failed with the target")
    assert f"{KV}=2" not in bad["command"]  # the env is no command-line word
    # the long context alone, repaired, starts and serves: it is cleared
    hf_alone = next(n for n in answer["repairs"] if n["deltas"] == [0])
    assert hf_alone["after"] == "passed", answer["repairs"]
    store = Store(results)
    try:
        runs = store.runs(answer["campaign"])
    finally:
        store.close()
    repaired = [r for r in runs if r.repair]
    assert repaired and all(r.repair["knob"] == KV and r.env[KV] == "2" for r in repaired)
    assert all(r.env[KV] == "1" for r in runs if not r.repair)

    # without repair, the same pair (its starts reused): the KV cache failure hides it
    code, plain = cli_json(*args, "--no-repair", timeout=3000)
    assert code == 0 and plain["status"] == "found", plain
    assert plain["target"].startswith("kv_cache: kv_cache_too_small"), plain["target"]
    assert [c["flags"] for c in plain["culprits"]] == [[HF]], plain
    assert "repairs" not in plain

    issue = cli("report", answer["campaign"], "--issue", "--results", results)
    assert issue.returncode == 0, issue.stderr
    # good + --block-size 16 reproduces it without a repair: the issue's command line is
    # that plain one, and the repair of the bad config is told beside it
    assert "This command line is the repaired one" not in issue.stdout
    assert "- repair: bad: failed on a resource (kv_cache: kv_cache_too_small" in issue.stdout
    assert f"with env {KV} 1 -> 2 it failed with the target" in issue.stdout
