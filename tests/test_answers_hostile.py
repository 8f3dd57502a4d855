"""The answers check against servers and inputs that do not play along, through the real
CLI on the lab (OpenSSH's sshd on 127.0.0.1, the process manager, the lab server):

- a chat-only server (`/v1/completions` answers 404): the shipped set's completion prompt
  gets no answer from good or any variant, judges nothing, and the Kimi K2.6 pair is still
  answered with its interacting set (not every flag as a culprit);
- a server with no completion endpoint at all: with `ready_completion` on, good is not
  ready (`no_completion`) and nothing is bisected; with it off, good's answers judge no
  run, which the campaign says.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.lab.sshd import SshdEndpoint
from tests.support.campaign_lab import LAB, cli, cli_json, lab_pair, sshd_hosts_file

PAIR = "k26-dp-ep"


def _pair_on(tmp: Path, routes: list[str], **answers: object) -> tuple[Path, Path]:
    """The Kimi K2.6 pair served by a lab server whose scenario serves `routes` only."""
    tmp.mkdir(parents=True, exist_ok=True)
    scenario = yaml.safe_load((LAB / PAIR / "scenario.yaml").read_text())
    scenario["routes"] = routes
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
