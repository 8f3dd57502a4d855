"""The flag preflight on a real host: OpenSSH's sshd on 127.0.0.1 (the process manager)
running the lab server, directly and behind a pass-through wrapper.

- A scenario with no `known_flags` (its server's help says it accepts any flag, as
  parse_known_args wrappers do) bisects its good/bad pair to the right answer: the
  preflight refuses nothing it was not told it may refuse.
- A flag the server takes but its help hides (argparse SUPPRESS) is run, not refused, and
  the withdrawn trust is said once.
- A command line the server refuses is `invalid` in the server's own words whether the
  preflight foresaw it (seed 002, tests/test_executor_errors.py) or only the log shows it.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import yaml

from orchestrator.campaign.bisect import Bisection, BisectOptions
from orchestrator.campaign.planning import make_plan
from orchestrator.config.experiment import Experiment
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Phase, Verdict
from orchestrator.events import Event, Notice, RunStarted
from orchestrator.execution.executor import Executor
from orchestrator.lab.sshd import SshdEndpoint, free_port
from orchestrator.store.store import Store
from tests.support.campaign_lab import (
    LAB,
    check_b300_answer,
    cli,
    lab_pair,
    lab_servers,
    load_host,
    read_runs,
    sshd_hosts_file,
)

REPO = Path(__file__).resolve().parents[1]
WRAPPER = REPO / "tests" / "data" / "help" / "passthrough_wrapper.py"
SCALE = {"ORCH_LAB_TIME_SCALE": "0.1"}


def lab_exp(rel: str, **flags: object) -> Experiment:
    exp = load_experiment(LAB / rel)
    return exp.with_changes(flags={"port": free_port(), **flags}, env=SCALE)


def notices(events: list[Event], kind: str) -> list[Notice]:
    return [e for e in events if isinstance(e, Notice) and e.extra.get("kind") == kind]


def test_scenario_without_known_flags_bisects_to_the_right_answer(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    pair = lab_pair(tmp_path, "b300-any")
    plan = make_plan(str(pair.good), str(pair.bad), "auto")
    events: list[Event] = []
    store = Store(tmp_path / "results")
    try:
        outcome = Bisection(
            store,
            plan,
            [load_host(sshd_hosts_file(sshd, tmp_path), "lab")],
            options=BisectOptions(),
            listener=events.append,
            command="test",
        ).run()
    finally:
        store.close()
    answer = outcome.to_dict()
    check_b300_answer(answer, tmp_path / "results")
    assert answer["invalid"] == []  # no variant thrown away
    # The server's help was read, judged, and said not to be trusted to refuse: once.
    (said,) = notices(events, "help-untrusted")
    assert "passes flags it does not list through" in said.message
    assert sum(isinstance(e, RunStarted) for e in events) == answer["runs_executed"]
    assert lab_servers(pair.port) == []


def test_hidden_flag_is_run_and_the_withdrawn_trust_said_once(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    """`--seed` is accepted by the lab server but hidden from its --help."""
    host = load_host(sshd_hosts_file(sshd, tmp_path), "lab")
    events: list[Event] = []
    with Executor(host, service="hidden", campaign="c-hidden", listener=events.append) as ex:
        r1 = ex.run(lab_exp("b300/good.yaml", seed=3), run_id="h1")
        r2 = ex.run(lab_exp("b300/good.yaml", seed=4), run_id="h2")
    assert (r1.verdict, r2.verdict) == (Verdict.PASS, Verdict.PASS), (r1.detail, r2.detail)
    (said,) = notices(events, "help-distrusted")
    assert "--seed" in said.message and "no longer trusted" in said.message
    assert notices(events, "help-untrusted") == []


def test_refusal_only_the_log_shows_is_invalid_in_the_servers_words(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    """Behind a pass-through wrapper the help says nothing of the server's flags: the run
    starts, the server dies at argument parsing, and the verdict is `invalid` with the
    server's own message (the run is not mistaken for a crash of the config)."""
    host = load_host(sshd_hosts_file(sshd, tmp_path), "lab")
    base = lab_exp("b300/good.yaml", **{"tp-szie": 8})
    wrapped = replace(base, exec=(sys.executable, str(WRAPPER), "--scenario", "b300"))
    events: list[Event] = []
    with Executor(host, service="wrapped", campaign="c-wrap", listener=events.append) as ex:
        r = ex.run(wrapped, run_id="w1")
        ok = ex.run(replace(lab_exp("b300/good.yaml"), exec=wrapped.exec), run_id="w2")
    assert r.verdict is Verdict.INVALID
    assert r.signature is not None and r.signature.phase is Phase.ARGS
    assert r.detail == ("the server rejects its command line: unrecognized arguments: --tp-szie 8")
    assert r.polls > 0 and r.ready_s is None  # it was started and watched, never ready
    assert "launch_server.py: error: unrecognized arguments: --tp-szie 8" in r.log_tail
    assert ok.verdict is Verdict.PASS, ok.detail  # the wrapper passes good flags through
    assert len(notices(events, "help-untrusted")) == 1


def test_the_cli_shows_the_withdrawn_trust(sshd: SshdEndpoint, tmp_path: Path) -> None:
    """`orchestrator run` of a config with a hidden flag: the run passes, and the user reads
    once why the help is no longer trusted."""
    config = tmp_path / "hidden.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "hidden-seed",
                "extends": str(LAB / "b300" / "good.yaml"),
                "service": {"flags": {"port": free_port(), "seed": 3}, "env": SCALE},
            }
        )
    )
    hosts = sshd_hosts_file(sshd, tmp_path)
    res = cli("run", config, "--host", "lab", "--hosts", hosts, "--results", tmp_path / "r")
    assert res.returncode == 0, res.stdout + res.stderr
    notes = [ln for ln in res.stdout.splitlines() if ln.strip().startswith("note:")]
    assert len([n for n in notes if "no longer trusted" in n]) == 1, res.stdout
    assert "--seed" in " ".join(notes)


def test_a_typo_in_either_config_is_refused_before_anything_starts(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    """A misspelt flag in the bad config (or the good one) is put to the server's own parser
    before the first start: `bisect` stops with the file, the flag and the close match and
    starts nothing (not even the good config); `plan --host` says the same without a
    campaign, and says the flags are taken when they are."""
    pair = lab_pair(tmp_path, "b300")
    hosts = sshd_hosts_file(sshd, tmp_path)
    results = tmp_path / "results"
    ok = cli("plan", "--good", pair.good, "--bad", pair.bad, "--host", "lab", "--hosts", hosts)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "lab: the server takes both configs' flags" in ok.stdout
    for side in ("bad", "good"):
        typo = tmp_path / f"typo-{side}.yaml"
        typo.write_text(
            yaml.safe_dump(
                {"extends": str(getattr(pair, side)), "service": {"flags": {"ep-szie": 8}}}
            )
        )
        good, bad = (pair.good, typo) if side == "bad" else (typo, pair.bad)
        planned = cli("plan", "--good", good, "--bad", bad, "--host", "lab", "--hosts", hosts)
        res = cli(
            "bisect",
            "--good",
            good,
            "--bad",
            bad,
            "--host",
            "lab",
            "--hosts",
            hosts,
            "--results",
            results,
            "--fresh",
            env=SCALE,
        )
        for out in (planned, res):
            assert out.returncode == 2, out.stdout + out.stderr
            error = out.stderr
            assert f"{typo}: service.flags: on lab, before anything started" in error, error
            assert "--ep-szie" in error and "did you mean --ep-size" in error, error
        assert read_runs(results) == []  # nothing started, not even the good config
        assert lab_servers(pair.port) == []
