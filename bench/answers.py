"""The answers check on the lab: the flaky accuracy drop answered, the check's cost, and the
runs to answer of the lab pairs whose failure is a wrong answer.

Placements: for each lab pair, its bad config's deltas (as `plan` makes them) are shuffled
into PLACEMENTS orders, so the culprit flags sit at every kind of position. Each placement
is searched by the campaign's default strategy (`auto`, confidence 0.95) against a scripted
host driven by the pair's lab scenario's own `answers:` and `faults:` rules: a variant fails
(a wrong answer) when a rule's `when:` flags are all among its deltas, on the rule's
`probability` share of the starts (each start draws afresh, seeded per placement); a
`faults:` rule is the crash target, an `answers:` rule then the other failure. No server is
started for the search (`bench/noise.py`'s oracles and driver, the scenario's rules).

The cost of the check is measured on the real lab server (`orchestrator.lab.server`, startup
time scaled to 0) on this machine: the shipped prompt set asked through the project's asker
on a local transport, per run (seconds, requests), for each pair's good config.

    .venv/bin/python bench/answers.py [--placements 20]
"""

from __future__ import annotations

import argparse
import random
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from noise import CONFIDENCE, Oracle, run_ours  # noqa: E402

from orchestrator.campaign.planning import make_plan  # noqa: E402
from orchestrator.config.hosts import load_inventory  # noqa: E402
from orchestrator.config.loading import load_experiment  # noqa: E402
from orchestrator.config.prompts import load_prompts  # noqa: E402
from orchestrator.execution.answers import AskSettings, ask  # noqa: E402
from orchestrator.execution.transport import connect  # noqa: E402
from orchestrator.lab import scenario as sc  # noqa: E402
from orchestrator.planner.adaptive import Adaptive  # noqa: E402
from orchestrator.planner.noisy import NoiseModel  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "experiments" / "lab"
PAIRS = ("flaky-answers", "k26-dp-ep", "crash-wrong", "drift")


def _indices(deltas: list, when: sc.When) -> frozenset[int]:
    """The deltas that set the flags a rule's `when:` names."""
    keys = {c.key for c in when.flags}
    return frozenset(i for i, d in enumerate(deltas) if d.key in keys)


def oracle_for(pair: str, order: list[int], seed: int) -> tuple[Oracle, int]:
    """The scripted host of `pair` with its deltas in `order`: (oracle, n)."""
    plan = make_plan(str(LAB / pair / "good.yaml"), str(LAB / pair / "bad.yaml"), "auto")
    deltas = [plan.deltas[i] for i in order]
    scen = sc.load(pair)
    rules = [(r.when, r.probability) for r in scen.faults] + [
        (r.when, r.probability) for r in scen.answers
    ]
    target, p = rules[0]
    terms = (_indices(deltas, target),)
    rng = random.Random(f"answers:{pair}:{seed}")
    other, q = (None, 1.0)
    if len(rules) > 1:
        other, q = _indices(deltas, rules[1][0]), rules[1][1] or 1.0
    return Oracle(terms, p or 1.0, rng, other=other, q=q), len(deltas)


def placements(pair: str, count: int) -> list[tuple[bool, int, float | None]]:
    plan = make_plan(str(LAB / pair / "good.yaml"), str(LAB / pair / "bad.yaml"), "auto")
    n = len(plan.deltas)
    out = []
    for seed in range(count):
        order = list(range(n))
        random.Random(f"order:{pair}:{seed}").shuffle(order)
        o, n = oracle_for(pair, order, seed)
        r = run_ours(n, o, Adaptive(NoiseModel(confidence=CONFIDENCE)))
        out.append((r.right, r.runs, r.confidence))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_cost(pair: str) -> tuple[float, int]:
    """Seconds and requests of one answers check of `pair`'s good config on the lab server."""
    exp = load_experiment(LAB / pair / "good.yaml")
    port = _free_port()
    words = [w if w != str(exp.port) else str(port) for w in exp.argv()[3:]]
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.lab.server", *words, "--time-scale", "0"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        inv = REPO / ".bench-hosts.yaml"
        inv.write_text(
            "hosts: {here: {address: localhost, transport: local, service_manager: process}}\n"
        )
        try:
            host = load_inventory(inv).host("here")
        finally:
            inv.unlink()
        asked = ask(connect(host), load_prompts(), port, AskSettings())
        assert asked.error is None, asked.error
        return sum(asked.seconds.values()), asked.requests
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--placements", type=int, default=20)
    args = ap.parse_args()
    print(
        f"| pair | placements | right @ conf>={CONFIDENCE} | runs mean | runs worst "
        "| check s/run | requests/run |"
    )
    print("|---|---|---|---|---|---|---|")
    for pair in PAIRS:
        got = placements(pair, args.placements)
        sure = sum(1 for right, _, c in got if right and c is not None and c >= CONFIDENCE)
        runs = [r for _, r, _ in got]
        secs, reqs = check_cost(pair)
        print(
            f"| {pair} | {len(got)} | {sure}/{len(got)} | {statistics.mean(runs):.1f} "
            f"| {max(runs)} | {secs:.2f} | {reqs} |"
        )


if __name__ == "__main__":
    main()
