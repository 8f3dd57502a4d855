"""The Kimi K2.6 lab pair's answers, asked through the real sshd lab as a campaign asks them.

The pair's servers run on this machine (the lab host's loopback); the asker runs on the host
through the project's SSH transport (host key checked), as the answers check does, and the
answers are judged against good's with the project's judge.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.config.hosts import load_inventory
from orchestrator.config.loading import load_experiment
from orchestrator.config.prompts import load_prompts
from orchestrator.diagnosis.answers import Rule, judge, score
from orchestrator.execution.answers import Asked, AskSettings, ask
from orchestrator.execution.transport import connect
from orchestrator.lab.sshd import SshdEndpoint
from tests.hosts.procs import REPO, free_port

WAIT = 20.0
PAIR = REPO / "experiments" / "lab" / "k26-dp-ep"
PROMPTS = load_prompts()


def _ask(spawn, transport, experiment: Path, **flags: object) -> Asked:  # noqa: ANN001
    exp = load_experiment(experiment)
    port = free_port()
    words = [w if w != str(exp.port) else str(port) for w in exp.argv()[3:]]
    for name, value in flags.items():
        words += [f"--{name}", str(value)]
    proc = spawn(*words, "--time-scale", "0", env=exp.env_map())
    assert proc.wait_healthy(port, WAIT), proc.out + proc.err
    try:
        return ask(transport, PROMPTS, port, AskSettings())
    finally:
        proc.stop()


def test_k26_pair_answers_through_sshd(spawn, sshd: SshdEndpoint, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(sshd.hosts_yaml("lab", run_dir=str(tmp_path / "run")))
    transport = connect(load_inventory(hosts).host("lab"))
    try:
        good = _ask(spawn, transport, PAIR / "good.yaml")
        bad = _ask(spawn, transport, PAIR / "bad.yaml")
        ep8 = _ask(spawn, transport, PAIR / "good.yaml", **{"ep-size": 8})
    finally:
        transport.close()
    assert score(good.sets["sequential"], PROMPTS) == 1.0
    verdict = judge(good.sets["sequential"], bad.sets["sequential"], PROMPTS, Rule())
    assert not verdict.passed and verdict.kind == "garbled" and verdict.score == 0.0
    for mode in ("sequential", "batch"):
        same = judge(good.sets[mode], ep8.sets[mode], PROMPTS, Rule("exact"))
        assert same.passed, same.detail
