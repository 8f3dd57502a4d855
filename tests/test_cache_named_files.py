"""A verdict is reused only while the files its launch names are as they were: a lab
scenario file given by its path, broken (every start refused as `invalid`), then fixed.
Through OpenSSH's sshd on 127.0.0.1 (the process manager), as a user would meet it: the
next campaign starts the fixed launch instead of reusing the refusal, and after a `--fresh`
campaign the one after it reuses that campaign's starts alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.planning import make_plan
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.lab.scenario import resolve
from orchestrator.lab.sshd import SshdEndpoint
from tests.support.campaign_lab import bisect_in, lab_pair, load_host, sshd_hosts_file

pytestmark = pytest.mark.sshd


def _pair_on_file(tmp: Path, scenario: Path):  # noqa: ANN202
    """The b300 pair, its server reading the scenario from `scenario` (a path)."""
    pair = lab_pair(tmp, "b300")
    for path in (pair.good, pair.bad):
        data = yaml.safe_load(path.read_text())
        data["service"]["exec"] = f"python3 -m orchestrator.lab.server --scenario {scenario}"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return make_plan(pair.good, pair.bad)


def test_a_fixed_file_the_launch_names_is_not_answered_from_the_cache(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    scenario = tmp_path / "scenario.yaml"
    fixed = resolve("b300").read_text()
    scenario.write_text(fixed.replace("faults:", "fautls:", 1))  # a typo: refused
    plan = _pair_on_file(tmp_path, scenario)
    host = load_host(sshd_hosts_file(sshd, tmp_path), "lab")
    results = tmp_path / "results"

    broken = bisect_in(results, plan, [host])
    good = [r for r in broken.runs if r.variant == ()]
    assert good and all(r.verdict is Verdict.INVALID for r in good), broken.runs
    assert "bad scenario" in good[0].detail + good[0].log_tail()

    scenario.write_text(fixed)  # the fix
    after = bisect_in(results, plan, [host])
    assert after.outcome.found, after.outcome.to_dict()
    assert not any(r.verdict is Verdict.INVALID for r in after.runs), [
        (r.label, r.verdict, r.detail) for r in after.runs
    ]
    assert not any(r.cached_from in {b.id for b in broken.runs} for r in after.runs)

    # a fresh campaign, then one that reuses: its runs are the fresh one's, never a mix
    # with the refusals of the broken file ("pass good (cached)" beside "invalid good")
    fresh = bisect_in(results, plan, [host], fresh=True)
    assert fresh.outcome.found and fresh.outcome.runs_reused == 0
    reused = bisect_in(results, plan, [host])
    assert reused.outcome.found and reused.outcome.runs_reused > 0
    good_runs = [r for r in reused.runs if r.variant == ()]
    assert good_runs and {r.verdict for r in good_runs} == {Verdict.PASS}, good_runs


def test_a_fixed_file_named_by_a_relative_path_is_not_answered_from_the_cache(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    # the scenario named from the launch's working directory (`conf/scenario.yaml`): a path
    # relative to it was no part of the key, so the broken file's refusal outlived the fix
    from tests.support.campaign_lab import REPO

    (tmp_path / "conf").mkdir()
    scenario = tmp_path / "conf" / "scenario.yaml"
    fixed = resolve("b300").read_text()
    scenario.write_text(fixed.replace("faults:", "fautls:", 1))
    plan = _pair_on_file(tmp_path, Path("conf/scenario.yaml"))
    for path in (plan.good.source, plan.bad.source):
        data = yaml.safe_load(Path(path).read_text())
        data["service"]["workdir"] = str(tmp_path)
        svc = data["service"]
        svc["env"] = {**(svc.get("env") or {}), "PYTHONPATH": str(REPO)}
        Path(path).write_text(yaml.safe_dump(data, sort_keys=False))
    plan = make_plan(Path(plan.good.source), Path(plan.bad.source))
    host = load_host(sshd_hosts_file(sshd, tmp_path), "lab")
    results = tmp_path / "results"

    broken = bisect_in(results, plan, [host])
    good = [r for r in broken.runs if r.variant == ()]
    assert good and all(r.verdict is Verdict.INVALID for r in good), broken.runs

    scenario.write_text(fixed)
    after = bisect_in(results, plan, [host])
    assert after.outcome.found, after.outcome.to_dict()
    assert not any(r.cached_from in {b.id for b in broken.runs} for r in after.runs)
