"""The cache key on the real hosts: each input that reaches the server, changed between two
campaigns so that it changes the verdict, is never answered from the cache.

The lab's b300 pair runs under a scenario with one more rule: any launch whose process
environment has `HOSTVAR=on` dies at init. Through the sshd host (process manager) that
variable comes from the hosts file's `env:` (the row-1 incident, through the CLI) or from a
wrapper executable changed in place; on the systemd host from the unit's own definition:
an operator's drop-in with `Environment=`, or the contents of its `EnvironmentFile=`. In
each case the campaign after the change reuses nothing and sees the good config fail;
with the inputs of the first campaign back, everything is reused again. Last, the lab's
flaky pair bisected twice: the rerun takes every recorded start and states the first
campaign's counts and confidence.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from orchestrator.campaign.bisect import Bisection, Outcome
from orchestrator.campaign.planning import make_plan
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.lab.sdhosts import SystemdHost
from orchestrator.lab.sshd import SshdEndpoint, free_port
from orchestrator.store.store import Store
from tests.support.campaign_lab import (
    LAB,
    LAB_UNIT,
    SETTLE,
    TIME_SCALE,
    cli,
    lab_pair,
    load_host,
    sshd_hosts_file,
)

B300_UNIT = "lab-b300.service"
#: the rule added in front of the b300 scenario's (not a number: env values are compared
#: as the scenario reads them)
HOSTVAR_RULE = {
    "description": "a site variable this build cannot take",
    "when": {"env": {"HOSTVAR": "on"}},
    "phase": "init",
    "error": "RuntimeError: HOSTVAR=on is not supported by this build",
}


def scenario_text() -> str:
    data = yaml.safe_load((LAB / "b300" / "scenario.yaml").read_text())
    data["faults"] = [HOSTVAR_RULE, *data["faults"]]
    return yaml.safe_dump(data, sort_keys=False)


def pair(tmp: Path, exec_line: str, *, port: int = 30000) -> tuple[Path, Path]:
    """The b300 pair with another exec (the scenario above) on `port`."""
    out = []
    for side in ("good", "bad"):
        path = tmp / f"{side}.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "name": f"key-{side}",
                    "extends": str(LAB / "b300" / f"{side}.yaml"),
                    "service": {"exec": exec_line, "flags": {"port": port}},
                    "health": SETTLE,
                },
                sort_keys=False,
            )
        )
        out.append(path)
    return out[0], out[1]


def bisect(results: Path, good: Path, bad: Path, hosts: Path, host: str) -> Outcome:
    store = Store(results)
    try:
        return Bisection(
            store, make_plan(str(good), str(bad)), [load_host(hosts, host)], command="test"
        ).run()
    finally:
        store.close()


def check_nothing_reused_and_good_fails(results: Path, outcome: Outcome) -> None:
    assert outcome.status == "endpoints" and "good config does not pass" in outcome.message, (
        outcome.status,
        outcome.message,
    )
    assert outcome.runs_reused == 0
    store = Store(results)
    try:
        runs = store.runs(outcome.campaign_id)
    finally:
        store.close()
    assert runs and all(r.cached_from is None for r in runs)
    good = next(r for r in runs if r.label == "good")
    assert good.verdict in (Verdict.FAIL, Verdict.OTHER) and "HOSTVAR" in str(good.signature)


def check_all_reused_from(results: Path, outcome: Outcome, source: str) -> None:
    assert outcome.status == "found", outcome.message
    assert outcome.runs_executed == 0 and outcome.runs_reused > 0
    store = Store(results)
    try:
        for r in store.runs(outcome.campaign_id):
            src = store.run(r.cached_from or "")
            assert src.campaign == source and src.inputs == r.inputs and src.inputs is not None
    finally:
        store.close()


# ---- the sshd host: the hosts file's env:, and the executable ----------------------------------


def _sshd_hosts(sshd: SshdEndpoint, path: Path, run_dir: Path, **env: str) -> Path:
    path.write_text(
        sshd.hosts_yaml("lab", run_dir=str(run_dir), env={"ORCH_LAB_TIME_SCALE": TIME_SCALE, **env})
    )
    return path


def test_a_hosts_env_that_breaks_good_is_not_answered_from_the_cache(
    sshd: SshdEndpoint,
    tmp_path: Path,
) -> None:
    """Row 1, as the user met it: `bisect` with a hosts file, then the same file plus
    `env: {HOSTVAR: ...}` that breaks the good config: no "(cached)" endpoint, no answer,
    the good config is seen failing (exit 1)."""
    scen = tmp_path / "scenario.yaml"
    scen.write_text(scenario_text())
    good, bad = pair(
        tmp_path, f"python3 -m orchestrator.lab.server --scenario {scen}", port=free_port()
    )
    results = tmp_path / "results"
    plain = _sshd_hosts(sshd, tmp_path / "hosts.yaml", tmp_path / "run")
    broken = _sshd_hosts(sshd, tmp_path / "hosts-var.yaml", tmp_path / "run", HOSTVAR="on")
    args = ("bisect", "--good", good, "--bad", bad, "--host", "lab", "--results", results)
    first = cli(*args, "--hosts", plain, "--json", timeout=300)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    one = json.loads(first.stdout)
    assert one["status"] == "found" and one["runs_reused"] == 0
    second = cli(*args, "--hosts", broken, timeout=300)
    assert second.returncode == 1, second.stdout[-3000:] + second.stderr[-3000:]
    assert "(cached)" not in second.stdout and "culprit" not in second.stdout
    assert "good config does not pass" in second.stdout, second.stdout[-3000:]
    # and it says why the recorded verdicts were not taken
    assert (
        "note: 1 recorded run(s) of good not reused: changed since they ran: the hosts "
        "file's env:" in second.stdout
    ), second.stdout[-3000:]
    store = Store(results)
    try:
        [camp] = [c for c in store.campaigns() if c.id != one["campaign"]]
        runs = store.runs(camp.id)
        assert runs and all(r.cached_from is None for r in runs)
        assert "HOSTVAR" in str(next(r for r in runs if r.label == "good").signature)
    finally:
        store.close()
    third = cli(*args, "--hosts", plain, "--json", timeout=300)
    assert third.returncode == 0, third.stdout[-2000:] + third.stderr[-2000:]
    again = json.loads(third.stdout)
    assert again["status"] == "found" and again["runs_executed"] == 0
    assert again["runs_reused"] == one["runs_executed"]
    assert again["culprits"][0]["flags"] == one["culprits"][0]["flags"]


def test_an_executable_changed_in_place_is_not_answered_from_the_cache(
    sshd: SshdEndpoint,
    tmp_path: Path,
) -> None:
    """The exec's resolved file is an input: the same path, another content (a wrapper
    that now sets a variable the server reads) is another launch."""
    scen = tmp_path / "scenario.yaml"
    scen.write_text(scenario_text())
    wrapper = tmp_path / "bin" / "lab-python"
    wrapper.parent.mkdir()
    wrapper.write_text('#!/bin/sh\nexec python3 "$@"\n')
    wrapper.chmod(0o755)
    good, bad = pair(
        tmp_path, f"{wrapper} -m orchestrator.lab.server --scenario {scen}", port=free_port()
    )
    results = tmp_path / "results"
    hosts = _sshd_hosts(sshd, tmp_path / "hosts.yaml", tmp_path / "run")
    first = bisect(results, good, bad, hosts, "lab")
    assert first.status == "found", first.message
    wrapper.write_text('#!/bin/sh\nexport HOSTVAR=on\nexec python3 "$@"\n')
    check_nothing_reused_and_good_fails(results, bisect(results, good, bad, hosts, "lab"))
    wrapper.write_text('#!/bin/sh\nexec python3 "$@"\n')
    check_all_reused_from(results, bisect(results, good, bad, hosts, "lab"), first.campaign_id)


# ---- the systemd host: the unit's own Environment= and EnvironmentFile= ------------------------


def test_the_units_own_environment_is_in_the_key_on_systemd(
    systemd_host: SystemdHost,
    tmp_path: Path,
) -> None:
    box = systemd_host
    site = "/etc/default/lab-site"
    box.install_unit(
        B300_UNIT, LAB_UNIT.replace("[Service]\n", f"[Service]\nEnvironmentFile=-{site}\n")
    )
    box.write_file("/etc/orchestrator-lab/hostvar.yaml", scenario_text())
    good, bad = pair(
        tmp_path, "python3 -m orchestrator.lab.server --scenario /etc/orchestrator-lab/hostvar.yaml"
    )
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(box.hosts_yaml("sd", env={"PYTHONPATH": "/opt/orchestrator"}))
    results = tmp_path / "results"
    first = bisect(results, good, bad, hosts, "sd")
    assert first.status == "found", first.message
    # An operator's drop-in of the unit sets the variable.
    box.write_file(
        f"/etc/systemd/system/{B300_UNIT}.d/50-site.conf", "[Service]\nEnvironment=HOSTVAR=on\n"
    )
    box.ssh_run("systemctl daemon-reload", check=True)
    check_nothing_reused_and_good_fails(results, bisect(results, good, bad, hosts, "sd"))
    box.ssh_run(f"rm -r /etc/systemd/system/{B300_UNIT}.d && systemctl daemon-reload", check=True)
    # The unit's EnvironmentFile= gets the variable: the unit's text is unchanged.
    box.write_file(site, "HOSTVAR=on\n")
    check_nothing_reused_and_good_fails(results, bisect(results, good, bad, hosts, "sd"))
    box.ssh_run(f"rm {site}", check=True)
    # The operator's service runs its own config now: a campaign that reuses everything
    # only reads the host, and leaves the service running, the same invocation.
    box.ssh_run(f"systemctl start {B300_UNIT}", check=True)
    before = box.ssh_run(f"systemctl show {B300_UNIT} -p InvocationID --value", check=True)
    check_all_reused_from(results, bisect(results, good, bad, hosts, "sd"), first.campaign_id)
    after = box.ssh_run(f"systemctl show {B300_UNIT} -p InvocationID -p ActiveState", check=True)
    assert f"InvocationID={before.stdout.strip()}" in after.stdout, after.stdout
    assert "ActiveState=active" in after.stdout


# ---- row 12 on the sshd host: a flaky pair run again ---------------------------------------------


def test_a_flaky_pair_run_again_reuses_every_start_with_its_counts(
    sshd: SshdEndpoint,
    tmp_path: Path,
) -> None:
    """The lab's flaky pair (a capture race on about half the starts), bisected twice on one
    store without --fresh: the second campaign takes every recorded start, so it states the
    first one's reproduction rate and confidence, not "fail 3 of 3" from the newest run of
    each variant."""
    p = lab_pair(tmp_path, "flaky")
    hosts = sshd_hosts_file(sshd, tmp_path)
    args = (
        "bisect",
        "--good",
        p.good,
        "--bad",
        p.bad,
        "--host",
        "lab",
        "--hosts",
        hosts,
        "--results",
        tmp_path / "results",
        "--json",
    )
    first = cli(*args, timeout=900)
    one = json.loads(first.stdout)
    second = cli(*args, timeout=900)
    two = json.loads(second.stdout)
    store = Store(tmp_path / "results")
    try:
        runs1 = store.runs(one["campaign"])
        runs2 = store.runs(two["campaign"])
    finally:
        store.close()
    recorded = {
        r.id
        for r in runs1
        if r.verdict is not Verdict.INFRA
        and not (r.signature and r.signature.error_class == "signal")
    }
    assert {r.cached_from for r in runs2 if r.cached_from} == recorded
    if one["status"] == "found":  # the rerun's evidence is the first one's: the same answer
        assert second.returncode == first.returncode == 0
        assert two["runs_executed"] == 0 and two["runs_reused"] == len(recorded)
        assert two["noise"]["confidence"] == one["noise"]["confidence"]
        assert two["noise"]["reproduction_counts"] == one["noise"]["reproduction_counts"]
        assert bool(two["noise"]["switched"]) == bool(one["noise"]["switched"])
        assert [c["flags"] for c in two["culprits"]] == [c["flags"] for c in one["culprits"]]
