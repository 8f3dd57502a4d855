"""The answers check against servers and inputs that do not play along, through the real
CLI on the lab (OpenSSH's sshd on 127.0.0.1, the process manager, the lab server):

- a chat-only server (`/v1/completions` answers 404): the shipped set's completion prompt
  gets no answer from good or any variant, judges nothing, and the Kimi K2.6 pair is still
  answered with its interacting set (not every flag as a culprit);
- a server with no completion endpoint at all: with `ready_completion` on, good is not
  ready (`no_completion`) and nothing is bisected; with it off, good's answers judge no
  run, which the campaign says;
- Ctrl-C while a slow server is being asked: the asker is stopped on the host at once (not
  after its last prompt), the host restored, and the campaign resumed to its answer.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import yaml

from orchestrator.lab.sshd import SshdEndpoint
from tests.support.campaign_lab import (
    LAB,
    cli,
    cli_json,
    lab_pair,
    lab_servers,
    popen_cli,
    sshd_hosts_file,
    stop_child,
)

PAIR = "k26-dp-ep"


def _pair_on(
    tmp: Path, routes: list[str], throughput: float | None = None, **answers: object
) -> tuple[Path, Path]:
    """The Kimi K2.6 pair served by a lab server whose scenario serves `routes` only (at
    `throughput` tokens a second)."""
    tmp.mkdir(parents=True, exist_ok=True)
    scenario = yaml.safe_load((LAB / PAIR / "scenario.yaml").read_text())
    scenario["routes"] = routes
    if throughput is not None:
        scenario["throughput"] = throughput
    scen = tmp / "scenario.yaml"
    scen.write_text(yaml.safe_dump(scenario, sort_keys=False))
    pair = lab_pair(tmp, PAIR)
    out = []
    for side in (pair.good, pair.bad):
        path = side.with_name(f"{side.stem}-routes.yaml")
        doc: dict[str, object] = {
            "extends": str(side),
            "service": {"exec": f"python3 -m orchestrator.lab.server --scenario {scen}"},
        }
        if answers:
            doc["answers"] = answers
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        out.append(path)
    return out[0], out[1]


def _bisect(sshd: SshdEndpoint, tmp: Path, good: Path, bad: Path, *, json: bool = True):  # noqa: ANN202
    args = ("bisect", "--good", good, "--bad", bad, "--host", "lab")
    args += ("--hosts", sshd_hosts_file(sshd, tmp), "--results", tmp / "results")
    return cli_json(*args) if json else cli(*args)


def test_a_chat_only_server_is_judged_on_the_prompts_it_answers(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    good, bad = _pair_on(tmp_path, ["chat"])
    res = _bisect(sshd, tmp_path, good, bad, json=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    out = res.stdout
    assert "culprit (interacting set): --enable-dp-attention + --ep-size 8" in out, out[-3000:]
    assert "culprit (single flag)" not in out, out[-3000:]
    # said once, before the search: which prompt got no answer, and what to do
    assert "the good config got no answer to 1 of 9 prompts" in out, out[:3000]
    assert "'complete-italy': HTTP 404" in out and "answers.endpoint" in out
    assert "disagrees with itself" not in out  # a 404 twice is no disagreement


def test_a_server_without_a_completion_endpoint(sshd: SshdEndpoint, tmp_path: Path) -> None:
    good, bad = _pair_on(tmp_path / "on", [])
    code, answer = _bisect(sshd, tmp_path / "on", good, bad)
    # ready means it answers: good is not ready, and nothing is bisected
    assert code == 1 and answer["status"] != "found", answer
    assert "no_completion" in answer["message"] and "good config" in answer["message"], answer

    good, bad = _pair_on(tmp_path / "off", [], ready_completion=False)
    res = _bisect(sshd, tmp_path / "off", good, bad, json=False)
    out = res.stdout
    assert "the good config got no answer to any prompt" in out, out[:3000]
    assert "no run of this campaign is judged by its answers" in out
    assert "wrong_output" not in out and "culprit" not in out, out[-3000:]
    # bad is started once, not again and again: no start of it can be judged by answers
    assert "it passed on its start" in out, out[-3000:]
    assert "its answers were not judged: the good config got no answer" in out
    assert "starting it again" not in out, out[-3000:]


def _asked(run_dir: Path) -> bool:
    """The lab server under `run_dir` has been sent a prompt (its access log says so)."""
    for log in run_dir.rglob("*.log"):
        try:
            if "POST /v1/" in log.read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False


def test_ctrl_c_while_asked_stops_the_asker_and_resumes(sshd: SshdEndpoint, tmp_path: Path) -> None:
    # 1 token a second: the check of good alone would take minutes
    good, bad = _pair_on(tmp_path, ["completions", "chat"], throughput=1)
    hosts, results = sshd_hosts_file(sshd, tmp_path), tmp_path / "results"
    args = ("bisect", "--good", good, "--bad", bad, "--host", "lab", "--hosts", hosts)
    child = popen_cli(*args, "--results", results, log=tmp_path / "cli.log")
    try:
        deadline = time.monotonic() + 120
        while not _asked(tmp_path / "run") and time.monotonic() < deadline:
            assert child.poll() is None, (tmp_path / "cli.log").read_text()
            time.sleep(0.2)
        assert _asked(tmp_path / "run"), "the check never started"
        child.send_signal(signal.SIGINT)
        # the asker is stopped on the host, not waited for (its prompts would take minutes)
        code = child.wait(timeout=90)
    finally:
        stop_child(child)
    log = (tmp_path / "cli.log").read_text()
    assert code == 130, log[-3000:]
    assert "resume with: orchestrator bisect --resume" in log, log[-3000:]
    assert lab_servers(_port(good)) == []
    campaign = log.split("--resume ", 1)[1].split()[0]
    # the same launch, now served fast: the campaign goes on to its answer
    scen = tmp_path / "scenario.yaml"
    scen.write_text(scen.read_text().replace("throughput: 1\n", "throughput: 3000\n"))
    code, answer = cli_json("bisect", "--resume", campaign, "--hosts", hosts, "--results", results)
    assert code == 0 and answer["status"] == "found", answer
    assert sorted(answer["culprits"][0]["flags"]) == ["--enable-dp-attention", "--ep-size 8"]


def _port(exp: Path) -> int:
    from orchestrator.config.loading import load_experiment

    return load_experiment(exp).port
