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

The flaky pair on the real lab server (`--real-lab`): the flaky-answers pair's bisection
run through the campaign (`Bisection`, the default search at confidence 0.95) against the
real lab server started by the process manager on this machine (a local host: no scripted
host), for each placement: the bad config's flags written in that placement's order, the
lab's random draws replayed from a sequence of the placement's own (`ORCH_LAB_SEED`), the
lab's startup sped up (`ORCH_LAB_TIME_SCALE`). A placement is right when the answer is the
culprit alone, said at confidence >= 0.95.

    .venv/bin/python bench/answers.py [--placements 20]
    .venv/bin/python bench/answers.py --real-lab [--placements 20]
"""

from __future__ import annotations

import argparse
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from noise import CONFIDENCE, Oracle, run_ours  # noqa: E402

from orchestrator.campaign.bisect import Bisection  # noqa: E402
from orchestrator.campaign.planning import make_plan  # noqa: E402
from orchestrator.campaign.records import BisectOptions  # noqa: E402
from orchestrator.config.hosts import load_inventory  # noqa: E402
from orchestrator.config.loading import load_experiment  # noqa: E402
from orchestrator.config.prompts import load_prompts  # noqa: E402
from orchestrator.execution.answers import AskSettings, ask  # noqa: E402
from orchestrator.execution.transport import connect  # noqa: E402
from orchestrator.lab import scenario as sc  # noqa: E402
from orchestrator.planner.adaptive import Adaptive  # noqa: E402
from orchestrator.planner.noisy import NoiseModel  # noqa: E402
from orchestrator.store.store import Store  # noqa: E402

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


#: the flaky pair's culprit, as the answer names it
FLAKY_CULPRIT = ["--speculative-algorithm NEXTN"]
#: the lab's startup, sped up (the pair's health settle with it)
LAB_SCALE = 0.02


def _placement_pair(root: Path, seed: int, port: int) -> tuple[Path, Path]:
    """flaky-answers' good and bad, written out whole, bad's changed flags in the order
    of placement `seed` (the deltas follow the bad config's flags)."""
    good = yaml.safe_load((LAB / "flaky-answers" / "good.yaml").read_text())
    bad = yaml.safe_load((LAB / "flaky-answers" / "bad.yaml").read_text())
    good["service"]["flags"]["port"] = port
    good["health"]["settle"] = f"{LAB_SCALE:g}s"
    changed = list(bad["service"]["flags"].items())
    random.Random(f"order:flaky-answers:{seed}").shuffle(changed)
    rest = {k: v for k, v in good["service"]["flags"].items() if k not in dict(changed)}
    bad_doc = yaml.safe_load(yaml.safe_dump(good))
    bad_doc["name"] = bad["name"]
    bad_doc["service"]["flags"] = dict(changed) | rest
    bad_doc["service"]["env"] = {**good["service"]["env"], **bad["service"]["env"]}
    paths = (root / f"good-{seed}.yaml", root / f"bad-{seed}.yaml")
    for path, doc in zip(paths, (good, bad_doc), strict=True):
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return paths


def real_lab(count: int) -> list[tuple[bool, int, float | None, float]]:
    """The flaky-answers pair bisected on the real lab server, `count` placements:
    (right, runs executed, confidence, seconds) each."""
    out = []
    with tempfile.TemporaryDirectory(prefix="orch-answers-lab-") as tmp:
        root = Path(tmp)
        for seed in range(count):
            inv = root / f"hosts-{seed}.yaml"
            entry = {
                "address": "localhost",
                "transport": "local",
                "service_manager": "process",
                "run_dir": str(root / "run"),
                "env": {
                    "ORCH_LAB_TIME_SCALE": str(LAB_SCALE),
                    "ORCH_LAB_SEED": f"random:{seed + 1}",
                    "ORCH_LAB_DIR": str(root / f"lab-state-{seed}"),
                },
            }
            inv.write_text(yaml.safe_dump({"hosts": {"here": entry}}))
            good, bad = _placement_pair(root, seed, _free_port())
            store = Store(root / f"results-{seed}")
            t0 = time.monotonic()
            try:
                outcome = Bisection(
                    store,
                    make_plan(good, bad, "auto"),
                    [load_inventory(inv).host("here")],
                    options=BisectOptions(confidence=CONFIDENCE),
                    command="bench",
                ).run()
            finally:
                store.close()
            answer = outcome.to_dict()
            conf = (outcome.noise or {}).get("confidence")
            conf = 1.0 if conf is None and answer.get("status") == "found" else conf
            culprits = [c.get("flags") for c in answer.get("culprits", [])]
            right = culprits == [FLAKY_CULPRIT]
            out.append((right, outcome.runs_executed, conf, time.monotonic() - t0))
            print(
                f"placement {seed}: {answer.get('status')} {culprits} conf={conf} "
                f"runs={outcome.runs_executed} {out[-1][3]:.0f}s",
                file=sys.stderr,
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--placements", type=int, default=20)
    ap.add_argument("--real-lab", action="store_true", help="the flaky pair on the real lab server")
    args = ap.parse_args()
    if args.real_lab:
        got = real_lab(args.placements)
        sure = sum(1 for right, _, c, _ in got if right and c is not None and c >= CONFIDENCE)
        runs = [r for _, r, _, _ in got]
        secs = [s for _, _, _, s in got]
        print(
            f"| pair | placements | right @ conf>={CONFIDENCE} | runs mean | runs worst "
            "| seconds/placement |"
        )
        print("|---|---|---|---|---|---|")
        print(
            f"| flaky-answers (real lab server) | {len(got)} | {sure}/{len(got)} "
            f"| {statistics.mean(runs):.1f} | {max(runs)} | {statistics.mean(secs):.0f} |"
        )
        return
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
