"""The cache key: a verdict is reused only for the same launch under the same inputs.

The key is the config's fingerprint plus what reaches the server besides it
(`LaunchInputs`: host class, backend, the hosts file's `env:`, the unit's own definition
and environment, the host environment as the server's interpreter sees it). Fast tier:
the key itself, the store's lookup, the systemd manager's reading of the unit over the
scripted transport, and whole campaigns over the scripted host (a host env that breaks
the good config between two campaigns; a flaky pair run again). The same on the real
hosts: tests/test_cache_key_hosts.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.campaign import flaky
from orchestrator.campaign.bisect import Bisection, BisectOptions
from orchestrator.campaign.planning import make_plan
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import SlurmOptions
from orchestrator.diagnosis.verdicts import Verdict, relative
from orchestrator.execution.executor import Executor
from orchestrator.execution.inputs import LaunchInputs, launch_inputs
from orchestrator.store.store import Store
from tests.support.run_results import run_result
from tests.support.scripted import TARGET_ERROR, Faults, Oracle, Rule, factory, host, write_pair
from tests.support.scripted_transport import FakeClock, ScriptedTransport
from tests.support.scripted_transport import host as scripted_host

FP = "0123456789abcdef"


def _inputs(**changes: object) -> LaunchInputs:
    base = LaunchInputs(host_class="b300", backend="b", host_env="e", unit="", environment="x")
    return replace(base, **changes)


def test_the_key_changes_with_every_input_and_an_unknown_one_has_none() -> None:
    base = _inputs()
    assert base.key(FP) == _inputs().key(FP)
    assert base.key(FP) != base.key("fedcba9876543210")  # another config
    for part, other in [
        ("host_class", "rtx"),
        ("backend", "b2"),
        ("host_env", "e2"),
        ("unit", "u"),
        ("environment", "y"),
    ]:
        changed = _inputs(**{part: other})
        assert changed.key(FP) != base.key(FP), part
        assert changed.differences(base) and len(changed.differences(base)) == 1
    assert _inputs(unit=None).key(FP) is None  # the unit could not be read
    assert _inputs(environment=None).key(FP) is None  # e.g. a Slurm job's node


def test_the_hosts_env_and_the_jobs_options_are_inputs() -> None:
    h = host("a")
    same = launch_inputs(h, unit="", environment="x")
    assert launch_inputs(replace(h), unit="", environment="x") == same
    env = launch_inputs(replace(h, env=(("HOSTVAR", "1"),)), unit="", environment="x")
    assert env.key(FP) != same.key(FP)
    # the order of the hosts file's env: does not matter, its values do
    ab = replace(h, env=(("A", "1"), ("B", "2")))
    ba = replace(h, env=(("B", "2"), ("A", "1")))
    assert launch_inputs(ab, unit="", environment="x") == launch_inputs(
        ba, unit="", environment="x"
    )
    slurm = replace(h, service_manager="slurm", slurm=SlurmOptions(partition="gpu", time="10"))
    longer = replace(slurm, slurm=SlurmOptions(partition="gpu", time="60"))
    assert launch_inputs(slurm, unit="", environment="x").key(FP) != launch_inputs(
        longer, unit="", environment="x"
    ).key(FP)  # a time limit decides `timeout`


def _systemd_inputs(unit_text: str) -> LaunchInputs:
    h = replace(scripted_host(), service_manager="systemd")
    clock = FakeClock()
    t = ScriptedTransport(h, clock, [], unit_text=unit_text)
    ex = Executor(
        h,
        service="sglang.service",
        campaign="c-key",
        transport=t,
        sleep=clock.sleep,
        clock=clock.monotonic,
        wall_clock=clock.time,
    ).open()
    exp = Experiment.from_dict(
        {
            "name": "scripted",
            "service": {
                "exec": "python3 -m sglang.launch_server",
                "flags": {"model-path": "/models/m", "port": 30000},
            },
            "health": {"path": "/health", "timeout": 60},
        }
    )
    try:
        return ex.inputs(exp)
    finally:
        ex.close()


def test_a_systemd_units_own_environment_is_read_into_the_key() -> None:
    unit = "[Service]\nEnvironment=PYTHONPATH=/opt/srv\nExecStart=/bin/sleep infinity\n"
    one = _systemd_inputs(unit)
    assert one.known and one.unit
    assert _systemd_inputs(unit) == one
    other = _systemd_inputs(unit.replace("[Service]\n", "[Service]\nEnvironment=NCCL_ALGO=Tree\n"))
    assert other.unit != one.unit and other.key(FP) != one.key(FP)
    assert other.environment == one.environment  # the same interpreter and packages


def test_the_store_serves_every_start_of_the_same_launch_only(tmp_path: Path) -> None:
    good, bad = write_pair(tmp_path / "exp", 2)
    exp = make_plan(good, bad).good
    store = Store(tmp_path / "results")
    mine = _inputs()
    theirs = _inputs(host_env="other")
    cid = store.create_campaign(kind="run", key="k", command="test", spec={})
    starts = [Verdict.PASS, Verdict.FAIL, Verdict.INFRA, Verdict.PASS]
    ids = [
        store.add_run(cid, variant=(), purpose="run", result=run_result(exp, v, inputs=mine))
        for v in starts
    ]
    store.add_run(
        cid, variant=(), purpose="run", result=run_result(exp, Verdict.FAIL, inputs=theirs)
    )
    store.add_run(cid, variant=(), purpose="run", result=run_result(exp, Verdict.FAIL))
    got = store.reusable(mine.key(exp.fingerprint()))
    assert [r.id for r in got] == [ids[0], ids[1], ids[3]]  # every start, infra excluded
    assert all(r.inputs == mine for r in got)
    assert store.reusable(mine.key(exp.fingerprint()), exclude_campaign=cid) == []
    assert store.reusable(None) == []
    store.close()


def _bisect(
    store: Store, good: Path, bad: Path, h: object, oracle: Oracle, **opts: object
) -> object:
    return Bisection(
        store,
        make_plan(good, bad),
        [h],
        command="test",  # type: ignore[list-item]
        options=BisectOptions(**opts),  # type: ignore[arg-type]
        executor_factory=factory(oracle, Faults()),
    ).run()


def test_a_host_env_that_breaks_good_is_not_answered_from_the_cache(tmp_path: Path) -> None:
    """Row 1: the same pair again with `env: {HOSTVAR: "1"}` in the hosts file, which
    breaks the good config: nothing is reused, and the good config is seen failing."""
    good, bad = write_pair(tmp_path / "exp", 4)
    store = Store(tmp_path / "results")
    oracle = Oracle(
        [
            Rule(
                frozenset(),
                "init",
                TARGET_ERROR.replace("CUBLAS", "HOSTVAR"),
                env=frozenset({("HOSTVAR", "1")}),
            ),
            Rule(frozenset({2}), "cuda_graph", TARGET_ERROR),
        ]
    )
    plain = host("b300-01")
    first = _bisect(store, good, bad, plain, oracle)
    assert first.status == "found" and [c.indices for c in first.culprits] == [[2]]
    broken = replace(plain, env=(("HOSTVAR", "1"),))
    second = _bisect(store, good, bad, broken, oracle)
    runs = store.runs(second.campaign_id)
    assert second.runs_reused == 0 and all(r.cached_from is None for r in runs)
    assert second.status == "endpoints" and "good config does not pass" in second.message
    # the same hosts file as the first campaign: its verdicts are reused again
    third = _bisect(store, good, bad, plain, oracle)
    assert third.status == "found" and third.runs_executed == 0 and third.runs_reused > 0
    for r in store.runs(third.campaign_id):
        src = store.run(r.cached_from or "")
        assert src.campaign == first.campaign_id and src.inputs == r.inputs
    store.close()


class Starts(Oracle):
    """An oracle whose variants answer from a script of starts (then the rules)."""

    def __init__(self, rules: list[Rule], script: dict[frozenset[int], list[bool]]) -> None:
        super().__init__(rules)
        self.script = {k: list(v) for k, v in script.items()}

    def outcome(self, variant: frozenset[int], env: object = ()) -> Rule | None:
        todo = self.script.get(variant)
        if todo:
            return self.rules[0] if todo.pop(0) else None
        return super().outcome(variant, env)  # type: ignore[arg-type]


@pytest.mark.parametrize("strategy", ["auto", "noisy"])
def test_a_rerun_of_a_flaky_pair_carries_every_start(tmp_path: Path, strategy: str) -> None:
    """Row 12: the bad config passed 3 of its 4 starts in the first campaign. Run again
    without --fresh, every recorded start is reused (not the newest of each variant), and
    the counts, the search and the sureness are those of all of them."""
    n = 4
    good, bad = write_pair(tmp_path / "exp", n)
    store = Store(tmp_path / "results")
    full = frozenset(range(n))
    rules = [Rule(frozenset({1, 3}), "cuda_graph", TARGET_ERROR)]
    h = host("flaky-01")
    first = _bisect(
        store,
        good,
        bad,
        h,
        Starts(rules, {full: [False, False, False, True]}),
        strategy=strategy,
        confidence=0.9,
    )
    runs1 = [r for r in store.runs(first.campaign_id) if r.verdict is not Verdict.INFRA]
    bad1 = [r for r in runs1 if r.variant == tuple(range(n))]
    assert [r.verdict for r in bad1][:4] == [Verdict.PASS] * 3 + [Verdict.FAIL]
    # The rerun: every start of the first campaign is there to be reused.
    second = _bisect(store, good, bad, h, Oracle(rules), strategy=strategy, confidence=0.9)
    runs2 = store.runs(second.campaign_id)
    target = second.target
    counts1 = flaky.counts(runs1, first.target, relative)
    counts2 = flaky.counts(runs2, target, relative)
    assert str(counts2[tuple(range(n))]).startswith("fail ") and counts2[tuple(range(n))].runs >= 4
    assert counts2[tuple(range(n))].fails < counts2[tuple(range(n))].runs  # not "3 of 3"
    reused = [r for r in runs2 if r.cached_from is not None]
    assert len(reused) == second.runs_reused and len({r.cached_from for r in reused}) == len(
        reused
    )  # each start taken once
    for v, c in counts2.items():  # a variant reused at all is reused with all its starts
        if any(r.variant == v and r.cached_from for r in runs2) and v in counts1:
            assert c.runs >= counts1[v].runs, (v, c, counts1[v])
    # The same evidence, so the same answer and the same sureness as the first campaign.
    assert second.noise["confidence"] == first.noise["confidence"]
    assert second.noise["reproduction_counts"] == first.noise["reproduction_counts"]
    assert [c.indices for c in second.culprits] == [c.indices for c in first.culprits]
    assert bool(second.noise["switched"]) == bool(first.noise["switched"])  # said again
    # The sureness speaks of all the runs of the culprit set, the reused ones included.
    noise = second.noise
    if second.culprits and noise.get("reproduction_counts"):
        term = frozenset(second.culprits[0].indices)
        carried = [
            relative(r.verdict, r.signature, target) for r in runs2 if term <= frozenset(r.variant)
        ]
        resolved = [x for x in carried if x.resolved]
        assert noise["reproduction_counts"] == str(
            flaky.Counts(sum(x is Verdict.FAIL for x in resolved), len(resolved))
        )
        assert noise["reproduction_rate"] < 1.0  # the passes of bad are in it
    store.close()


def test_the_environment_capture_resolves_the_exec_and_keeps_older_digests() -> None:
    """The exec's file as the host resolves it, and its sha256, are part of the host's
    environment (so of the key); an environment recorded before they were keeps its digest."""
    from orchestrator.execution import environment as envfacts

    sha = "ab" * 32
    text = (
        f"@@NVSMI\n@@KERNEL\n6.1.0\n@@EXEC\n/opt/venv/bin/python3\n{sha}\n"
        '@@PYHOW exec python3\n@@PYJSON {"python": "3.12.3", "packages": {}}\n'
    )
    env = envfacts.parse(text)
    assert (env.exec_path, env.exec_sha256) == ("/opt/venv/bin/python3", sha)
    assert ("exec", f"/opt/venv/bin/python3 (sha256 {sha[:12]})") in env.rows()
    other = envfacts.parse(text.replace(sha, "cd" * 32))
    assert other.digest() != env.digest()
    older = replace(env, exec_path=None, exec_sha256=None)
    import hashlib
    import json

    data = older.to_dict()
    # (fields recorded later, none of them known then: a container's image and its id)
    for late in ("exec_path", "exec_sha256", "image", "image_id"):
        del data[late]
    assert (
        older.digest() == hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
    )
    cmd = envfacts.command(["/opt/venv/bin/python3", "-m", "sglang.launch_server"])
    assert "command -v /opt/venv/bin/python3" in cmd and "sha256sum" in cmd


def test_inputs_a_host_cannot_read_mean_no_reuse(tmp_path: Path) -> None:
    """Anything unknown: no reuse. A host whose environment cannot be read before a run
    (a Slurm job's node, a capture that failed) reuses nothing, though the store holds
    runs of the same config on the same host class."""
    from tests.support.scripted import ScriptedExecutor

    class Blind(ScriptedExecutor):
        def inputs(self, exp: object) -> LaunchInputs:  # type: ignore[override]
            return replace(super().inputs(exp), environment=None)  # type: ignore[arg-type]

    good, bad = write_pair(tmp_path / "exp", 3)
    store = Store(tmp_path / "results")
    oracle = Oracle([Rule(frozenset({1}), "cuda_graph", TARGET_ERROR)])
    h = host("blind-01")
    first = _bisect(store, good, bad, h, oracle)
    assert first.status == "found"
    second = Bisection(
        store,
        make_plan(good, bad),
        [h],
        command="test",
        executor_factory=lambda hh, s, c, li: Blind(hh, oracle, Faults()),
    ).run()
    assert second.status == "found" and second.runs_reused == 0
    assert all(r.cached_from is None for r in store.runs(second.campaign_id))
    store.close()


def test_a_rerun_counts_the_recorded_runs_its_search_does_not_ask_for(tmp_path: Path) -> None:
    """Every recorded run of a variant of the pair joins the rerun, not only those of the
    variants its own search asks for: the first campaign (one flag at a time) ran variants
    the noise-aware rerun never picks, and their passes still weigh in its sureness."""
    n = 4
    good, bad = write_pair(tmp_path / "exp", n)
    store = Store(tmp_path / "results")
    full = frozenset(range(n))
    rule = Rule(frozenset({1, 3}), "cuda_graph", TARGET_ERROR)
    h = host("flaky-02")
    first = _bisect(store, good, bad, h, Starts([rule], {full: [False, True]}), strategy="linear")
    recorded = [r for r in store.runs(first.campaign_id) if r.verdict is not Verdict.INFRA]
    second = _bisect(store, good, bad, h, Oracle([rule]), strategy="noisy", confidence=0.9)
    runs2 = store.runs(second.campaign_id)
    taken = {r.cached_from for r in runs2 if r.cached_from}
    assert taken == {r.id for r in recorded}  # every recorded start, asked for or not
    assert [c.indices for c in second.culprits] == [[1, 3]]
    term = frozenset({1, 3})
    carried = [
        relative(r.verdict, r.signature, second.target)
        for r in runs2
        if term <= frozenset(r.variant)
    ]
    resolved = [x for x in carried if x.resolved]
    assert second.noise["reproduction_counts"] == str(
        flaky.Counts(sum(x is Verdict.FAIL for x in resolved), len(resolved))
    )
    store.close()


def test_another_host_env_is_another_campaign_and_a_resume_under_it_stops(
    tmp_path: Path,
) -> None:
    """Resuming is reusing a campaign's own verdicts: the same command with another hosts
    file `env:` starts a new campaign instead of resuming the interrupted one, and a resume
    named by id whose host inputs changed stops at its first run (`changed`), as a changed
    driver does, rather than mixing verdicts judged under both."""
    from orchestrator.campaign.envwatch import EnvironmentChanged

    good, bad = write_pair(tmp_path / "exp", 4)
    store = Store(tmp_path / "results")
    oracle = Oracle([Rule(frozenset({2}), "cuda_graph", TARGET_ERROR)])
    plain = replace(host("b300-02"), env=(("NCCL_DEBUG", "WARN"),))
    other = replace(plain, env=(("NCCL_DEBUG", "WARN"), ("HOSTVAR", "1")))
    first = _bisect(store, good, bad, plain, oracle, max_runs=3, fresh=True)
    store.update_campaign(first.campaign_id, status="interrupted")  # as a Ctrl-C leaves it
    second = _bisect(store, good, bad, other, oracle, fresh=True)
    assert second.campaign_id != first.campaign_id and second.status == "found"
    # the same hosts file resumes it (the command without --fresh, which starts anew)
    again = _bisect(store, good, bad, plain, oracle, max_runs=3)
    assert again.campaign_id == first.campaign_id
    store.update_campaign(first.campaign_id, status="interrupted")
    n_runs = len(store.runs(first.campaign_id))
    with pytest.raises(EnvironmentChanged, match="the hosts file's env: changed"):
        Bisection(
            store,
            make_plan(good, bad),
            [other],
            command="test",
            resume_id=first.campaign_id,
            executor_factory=factory(oracle, Faults()),
        ).run()
    assert store.campaign(first.campaign_id).status == "changed"
    assert len(store.runs(first.campaign_id)) == n_runs  # nothing judged, nothing run
    store.close()


def test_a_unit_changed_during_a_campaign_stops_it(tmp_path: Path) -> None:
    """An operator edits the unit's environment while the campaign runs: the first run after
    the edit is `infra` and the campaign stops as `changed`, as for a driver upgrade."""
    from orchestrator.campaign.envwatch import EnvironmentChanged
    from tests.support.scripted import ScriptedExecutor

    class Edited(ScriptedExecutor):
        def inputs(self, exp: object) -> LaunchInputs:  # type: ignore[override]
            got = super().inputs(exp)  # type: ignore[arg-type]
            return replace(got, unit="edited") if self.runs > 2 else got

    good, bad = write_pair(tmp_path / "exp", 4)
    store = Store(tmp_path / "results")
    oracle = Oracle([Rule(frozenset({2}), "cuda_graph", TARGET_ERROR)])
    h = host("b300-03")
    with pytest.raises(EnvironmentChanged, match="the unit's own files or environment changed"):
        Bisection(
            store,
            make_plan(good, bad),
            [h],
            command="test",
            executor_factory=lambda hh, s, c, li: Edited(hh, oracle, Faults()),
        ).run()
    [camp] = store.campaigns()
    runs = store.runs(camp.id)
    assert camp.status == "changed" and len(runs) == 3 and runs[-1].verdict is Verdict.INFRA
    store.close()


def test_a_refusal_a_later_start_of_the_same_launch_ran_past_is_not_reused(
    tmp_path: Path,
) -> None:
    """Starts of one launch reused together: an `invalid` recorded before a start that ran
    is over (what refused it was fixed), so the cache never gives both `invalid` and
    `pass` for one variant; an `invalid` after the last start that ran still stands."""
    from orchestrator.campaign.reuse import RecordedRuns
    from orchestrator.diagnosis.verdicts import Verdict
    from orchestrator.store.store import Store
    from tests.support.run_results import run_result

    exp = Experiment.from_dict(
        {"name": "x", "service": {"exec": "python3 -m s", "flags": {"port": 30000}}}
    )
    store = Store(tmp_path / "results")
    cid = store.create_campaign(kind="bisect", key="k", command="c", spec={})
    for v in (Verdict.INVALID, Verdict.PASS, Verdict.PASS, Verdict.INVALID):
        store.add_run(cid, variant=(), purpose="endpoint", result=run_result(exp, v))
    rows = store.runs(cid)
    kept = RecordedRuns.current(rows)
    assert [r.verdict for r in kept] == [Verdict.PASS, Verdict.PASS, Verdict.INVALID]
    assert RecordedRuns.current(rows[:1]) == rows[:1]  # refusals alone: they stand
    store.close()


def test_the_files_a_launch_names_are_in_its_key() -> None:
    from orchestrator.execution.inputs import named_files

    argv = [
        "/opt/v/bin/python",
        "-m",
        "orchestrator.lab.server",
        "--scenario",
        "/srv/scen.yaml",
        "--chat-template=/srv/t.jinja",
        "--model-path",
        "/models/m",
        "--port",
        "30000",
    ]
    assert named_files(argv, [("PATH", "/usr/bin:/bin"), ("CFG", "/etc/x.json")]) == (
        "/srv/scen.yaml",
        "/srv/t.jinja",
        "/models/m",
        "/etc/x.json",
    )
    h = host("a")
    none = launch_inputs(h, unit="", environment="x")
    assert none.key(FP) == launch_inputs(h, unit="", environment="x", files="").key(FP)
    one = launch_inputs(h, unit="", environment="x", files="aaaa")
    fixed = launch_inputs(h, unit="", environment="x", files="bbbb")
    assert one.key(FP) != fixed.key(FP) and one.differences(fixed) == ["the files the launch names"]
    assert launch_inputs(h, unit="", environment="x", files=None).key(FP) is None  # unread


def test_a_relative_path_is_named_and_a_repository_id_keeps_the_key() -> None:
    from orchestrator.execution.environment import FILES_MARK, parse_files
    from orchestrator.execution.inputs import named_files

    argv = ["python3", "-m", "s", "--model-path", "org/model", "--chat-template=conf/t.jinja"]
    named = named_files(argv)
    assert named == ("org/model", "conf/t.jinja")
    # the host reads the template in the working directory; the repository id is no file
    read = parse_files(f"{FILES_MARK}\n- org/model\nabcd conf/t.jinja\n", named)
    fixed = parse_files(f"{FILES_MARK}\n- org/model\nef01 conf/t.jinja\n", named)
    assert read and fixed and read != fixed
    # a launch naming only a repository id keeps the key of one that names no file
    assert parse_files(f"{FILES_MARK}\n- org/model\n", ("org/model",)) == ""
