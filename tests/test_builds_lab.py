"""Builds on the real test hosts: the lab's six releases of the simulated server, one
pair that fails only with release 0.5.23rc1 on and --enable-nccl-nvls together, bisected
with `--builds` through OpenSSH's sshd (the process manager) and on the systemd lab host
(drop-ins); a build the host lacks, a broken build and a build that serves another release
than its name says."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.bisect import Bisection, BisectOptions
from orchestrator.campaign.planning import make_plan, with_order
from orchestrator.config.builds import BuildError
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.lab import builds as labbuilds
from orchestrator.lab.scenario import load as load_scenario
from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.store.store import Store
from tests.support.campaign_lab import (
    PACKAGE_KINDS,
    PACKAGE_REFUSED,
    REPO,
    TIME_SCALE,
    bisect_in,
    install_lab_builds,
    lab_pair,
    lab_servers,
    load_host,
)

pytestmark = pytest.mark.sshd
RELEASES = load_scenario("releases").versions
BETWEEN = RELEASES[1:-1]


def _hosts(sshd: SshdEndpoint, tmp: Path, builds: dict[str, str]) -> Path:
    path = tmp / "hosts.yaml"
    path.write_text(
        sshd.hosts_yaml(
            "lab", run_dir=str(tmp / "run"), builds=builds, env={"ORCH_LAB_TIME_SCALE": TIME_SCALE}
        )
    )
    return path


REPORTS: dict[str, str] = {}


def _bisect(tmp: Path, hosts: Path, builds=BETWEEN):  # noqa: ANN202
    from orchestrator.reports.issue_report import issue_markdown
    from orchestrator.reports.report import write_reports

    pair = lab_pair(tmp, "releases")
    plan = with_order(make_plan(pair.good, pair.bad), builds)
    store = Store(tmp / "results")
    try:
        outcome = Bisection(
            store,
            plan,
            [load_host(hosts, "lab")],
            options=BisectOptions(builds=plan.order),
            command="test",
        ).run()
        runs = store.runs(outcome.campaign_id)
        md = next(p for p in write_reports(store, outcome.campaign_id) if p.suffix == ".md")
        REPORTS["md"] = md.read_text()
        REPORTS["issue"] = issue_markdown(
            store.campaign(outcome.campaign_id),
            runs,
            log_of=lambda r: r.log_tail(),
            env_of=lambda r: store.environment(r.env_digest),
        )
        served = {
            r.id: getattr(store.environment(r.env_digest), "server_version", None) for r in runs
        }
    finally:
        store.close()
    return pair, plan, outcome, [_Run(r, r.experiment().build, served[r.id]) for r in runs]


class _Run:
    """A recorded run with its build (by name) and the release read inside it."""

    def __init__(self, row, build: str | None, served: str | None) -> None:  # noqa: ANN001
        self.row, self.build, self.served = row, build, served

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.row, name)


def test_release_together_with_a_flag_over_sshd(sshd: SshdEndpoint, tmp_path: Path) -> None:
    hosts = _hosts(sshd, tmp_path, install_lab_builds(tmp_path))
    pair, plan, outcome, runs = _bisect(tmp_path, hosts)
    answer = outcome.to_dict()
    assert outcome.found, answer
    (cul,) = answer["culprits"]
    assert sorted(cul["deltas"]) == ["+ --enable-nccl-nvls", "~ build 0.5.22 -> 0.5.23rc1"]
    assert cul["confirmed"] and sorted(cul["whats"]) == ["build", "flag"]
    # runs: the two endpoints, then at most log2(6) + the flag search's own + 2
    searched = [r for r in runs if r.purpose != "endpoint"]
    assert len(searched) <= 3 + 1 + 5, [r.label for r in runs]
    # each run is recorded under its build, and read from inside it
    by_build = {r.id: (r.build, r.served) for r in runs}
    assert all(b == v for b, v in by_build.values()), by_build
    assert {b for b, _ in by_build.values()} >= {"0.5.20", "0.5.24", "0.5.23rc1", "0.5.22"}
    assert lab_servers(pair.port) == []
    # the report shows each run's build and the release read inside it; the upstream
    # issue text names the first bad build and the last good one
    assert "| build |" in REPORTS["md"] and "| 0.5.23rc1 (serves 0.5.23rc1) |" in REPORTS["md"]
    assert (
        "the first build that fails is `0.5.23rc1`; the last good one is `0.5.22` "
        "(with `--enable-nccl-nvls`"
    ) in REPORTS["issue"], REPORTS["issue"]


def test_builds_given_out_of_order_give_the_true_answer_over_sshd(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    from orchestrator.campaign.records import Outcome
    from orchestrator.cli.bisect import cleared_deltas

    hosts = _hosts(sshd, tmp_path, install_lab_builds(tmp_path))
    misordered = ("0.5.23rc1", "0.5.21", "0.5.22", "0.5.23")
    pair, plan, outcome, runs = _bisect(tmp_path, hosts, builds=misordered)
    assert plan.order == RELEASES and any("reordered by version" in n for n in plan.notes)
    answer = outcome.to_dict()
    assert outcome.found, answer
    (cul,) = answer["culprits"]
    assert sorted(cul["deltas"]) == ["+ --enable-nccl-nvls", "~ build 0.5.22 -> 0.5.23rc1"]
    # every run the answer cites ran, with the build it names
    ran = {r.id: r for r in runs}
    assert cul["reproduced_by"] in ran and ran[cul["reproduced_by"]].build == "0.5.23rc1"
    assert all(rid in ran for rid in cul["cleared_by"].values()), cul
    # what is cleared: no build (the culprit names one), each difference once
    cleared = [d.short() for d in cleared_deltas(Outcome.from_dict(answer), plan)]
    assert not any(c.startswith("build") for c in cleared) and len(cleared) == len(set(cleared))
    # the issue text counts the launches' differences, not the builds' hidden steps
    assert f"bisecting the {plan.n} differences" in REPORTS["issue"] and plan.n == 7


def test_hosts_check_reads_each_build_of_the_host(sshd: SshdEndpoint, tmp_path: Path) -> None:
    from tests.support.campaign_lab import cli

    installed = install_lab_builds(tmp_path)
    installed["0.5.22"] = str(tmp_path / "nowhere" / "0.5.22")
    installed["img"] = "example.invalid/none:never-pulled"
    hosts = _hosts(sshd, tmp_path, installed)
    res = cli("hosts", "check", "lab", "--hosts", hosts, "--json", timeout=120)
    checks = {c["name"]: c for c in yaml.safe_load(res.stdout)["lab"]}
    assert res.returncode == 3, res.stdout + res.stderr
    assert checks["build 0.5.20"]["ok"] is True
    assert checks["build 0.5.22"]["ok"] is False
    assert "nowhere/0.5.22/bin is no directory" in checks["build 0.5.22"]["detail"]
    assert "hosts.lab.builds" in checks["build 0.5.22"]["hint"]
    assert checks["build img"]["ok"] is not True  # not pulled, or no runtime to ask


def test_a_build_the_host_lacks_stops_before_the_first_run(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    installed = install_lab_builds(tmp_path)
    installed["0.5.22"] = str(tmp_path / "nowhere" / "0.5.22")
    hosts = _hosts(sshd, tmp_path, installed)
    with pytest.raises(BuildError) as err:
        _bisect(tmp_path, hosts)
    assert "build '0.5.22' is not installed on host lab" in str(err.value)
    assert "hosts.lab.builds: {0.5.22:" in (err.value.hint or "")
    store = Store(tmp_path / "results")
    try:
        (camp,) = store.campaigns()
        assert store.runs(camp.id) == []  # nothing ran
    finally:
        store.close()


def test_a_broken_build_is_invalid_never_the_answer(sshd: SshdEndpoint, tmp_path: Path) -> None:
    hosts = _hosts(sshd, tmp_path, install_lab_builds(tmp_path, **{"0.5.22": {"broken": True}}))
    pair, plan, outcome, runs = _bisect(tmp_path, hosts)
    broken = [r for r in runs if r.build == "0.5.22"]
    assert broken and all(r.verdict is Verdict.INVALID for r in broken)
    assert "build '0.5.22' cannot start the server (ImportError" in broken[0].detail
    # the first bad build is 0.5.22 or 0.5.23rc1: said so, not guessed
    answer = outcome.to_dict()
    assert "the first bad build is one of 0.5.22, 0.5.23rc1" in answer["message"] + str(
        answer.get("reason", "")
    ) + str(answer), answer
    assert not any("0.5.21 -> 0.5.22" in d for c in answer["culprits"] for d in c["deltas"])


def test_a_build_serving_another_release_is_infra(sshd: SshdEndpoint, tmp_path: Path) -> None:
    from orchestrator.errors import InfraError

    hosts = _hosts(
        sshd, tmp_path, install_lab_builds(tmp_path, **{"0.5.22": {"version": "0.5.21"}})
    )
    with pytest.raises(
        InfraError, match="build '0.5.22' .* serves orchestrator 0.5.21, not 0.5.22"
    ):
        _bisect(tmp_path, hosts)
    store = Store(tmp_path / "results")
    try:
        (camp,) = store.campaigns()
        liar = [r for r in store.runs(camp.id) if r.experiment().build == "0.5.22"]
    finally:
        store.close()
    assert liar and all(r.verdict is Verdict.INFRA for r in liar)


# ---- on the systemd lab host: the build reaches the server through the drop-in --------------


@pytest.mark.systemd
def test_release_together_with_a_flag_on_the_systemd_host(systemd_host, tmp_path: Path) -> None:  # noqa: ANN001
    import shlex

    from tests.support.campaign_lab import LAB_UNIT, UNIT_DIR

    box = systemd_host
    unit = "lab-releases.service"
    # (not from the repo's directory: its own egg-info of the project there would be the first
    # distribution of the package `orchestrator` the capture finds, not the build's)
    box.install_unit(
        unit, LAB_UNIT.replace("WorkingDirectory=/opt/orchestrator", "WorkingDirectory=/")
    )
    unit_sha = box.ssh_run(f"sha256sum {UNIT_DIR}/{unit}", check=True).stdout
    installed = {}
    for v in RELEASES:
        for path, (text, mode) in labbuilds.files(
            "/opt/lab-builds", v, python="/usr/bin/python3", repo="/opt/orchestrator"
        ).items():
            box.ssh_run(
                f"mkdir -p {shlex.quote(str(Path(path).parent))} && printf %s "
                f"{shlex.quote(text)} > {shlex.quote(path)} && chmod {mode:o} "
                f"{shlex.quote(path)}",
                check=True,
            )
        installed[v] = f"/opt/lab-builds/{v}"
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(
        box.hosts_yaml("sd", env={"PYTHONPATH": "/opt/orchestrator"}, builds=installed)
    )
    plan = with_order(
        make_plan(
            REPO / "experiments/lab/releases/good.yaml", REPO / "experiments/lab/releases/bad.yaml"
        ),
        BETWEEN,
    )
    store = Store(tmp_path / "results")
    try:
        outcome = Bisection(
            store,
            plan,
            [load_host(hosts, "sd")],
            options=BisectOptions(builds=plan.order),
            command="test",
        ).run()
        runs = store.runs(outcome.campaign_id)
    finally:
        store.close()
    answer = outcome.to_dict()
    assert outcome.found, answer
    (cul,) = answer["culprits"]
    assert sorted(cul["deltas"]) == ["+ --enable-nccl-nvls", "~ build 0.5.22 -> 0.5.23rc1"]
    # each run's drop-in started the build's own interpreter
    for r in runs:
        build = r.experiment().build
        assert (
            f'ExecStart="/opt/lab-builds/{build}/bin/python3" "-m" "orchestrator.lab.server"'
            in (r.rendered or "")
        ), r.rendered
    assert len([r for r in runs if r.purpose != "endpoint"]) <= 3 + 1 + 5
    # restored like every change: the unit as found, no drop-in
    assert box.ssh_run(f"sha256sum {UNIT_DIR}/{unit}", check=True).stdout == unit_sha
    assert box.ssh_run(f"test -e {UNIT_DIR}/{unit}.d/99-orchestrator.conf").returncode != 0


def test_packages_of_two_builds_over_sshd(sshd: SshdEndpoint, tmp_path: Path) -> None:
    """Builds 0.5.22 and 0.5.23rc1 differ in three distributions: the server's own release,
    a kernel and a tokenizer whose new release needs the new kernel. With --enable-nccl-nvls
    set on both sides, the search over the three packages names the server's release; a
    variant taking the new tokenizer without the new kernel is refused by `pip check`."""
    from orchestrator.campaign.planning import with_packages
    from orchestrator.execution.executor import Executor

    root = tmp_path / "builds"
    for v, extra in PACKAGE_KINDS.items():
        labbuilds.install(root, v, python=sys.executable, repo=str(REPO), extra=extra)
    hosts = _hosts(sshd, tmp_path, {v: str(root / v) for v in PACKAGE_KINDS})
    pair = lab_pair(tmp_path, "releases")
    for side, build in (("good", "0.5.22"), ("bad", "0.5.23rc1")):
        path = pair.good if side == "good" else pair.bad
        data = yaml.safe_load(path.read_text())
        data["service"]["build"] = build
        data["service"]["flags"]["enable-nccl-nvls"] = True
        path.write_text(yaml.safe_dump(data))
    plan = make_plan(pair.good, pair.bad)
    host = load_host(hosts, "lab")
    ex = Executor(host, service="lab-releases.service")
    try:
        got = {"good": ex.packages_of(plan.good), "bad": ex.packages_of(plan.bad)}
    finally:
        ex.close(restore=False)
    assert got["bad"]["orchestrator-lab-server"] == "0.5.23rc1"
    plan = with_packages(plan, got["good"], got["bad"])
    assert [d.key for d in plan.deltas if d.kind == "package"] == [
        "lab-kernel",
        "lab-tokenizer",
        "orchestrator-lab-server",
    ]
    # the flags of bad that good lacks: none but the same nvls; the rest of bad's flags stay
    done = bisect_in(tmp_path / "results", plan, [host], packages=got)
    outcome, runs = done.outcome, done.runs
    answer = outcome.to_dict()
    assert outcome.found, answer
    named = [sorted(c["deltas"]) for c in answer["culprits"]]
    assert ["~ package orchestrator-lab-server 0.5.22 -> 0.5.23rc1"] in named, named
    # good's build with the new tokenizer alone: `pip check` refuses it before any start
    tok = next(i for i, d in enumerate(plan.deltas) if d.key == "lab-tokenizer")
    kern = next(i for i, d in enumerate(plan.deltas) if d.key == "lab-kernel")
    overlays = tmp_path / "run" / "overlays"
    with Executor(host, service="lab-releases.service", campaign="t") as ex:
        alone = ex.run(plan.variant(frozenset({tok})), run_id="t.1")
        ex.run(plan.variant(frozenset({kern})), run_id="t.2")
        laid = [p for p in overlays.glob("*/*") if p.is_dir()]
    assert alone.verdict is Verdict.INVALID
    assert PACKAGE_REFUSED in alone.detail, alone.detail
    # one overlay on the host while the campaign runs (the last run's), none after it
    assert len(laid) == 1 and ex.left == [], (laid, ex.left)
    assert list((tmp_path / "run" / "overlays").rglob("*")) == []
    refused = [r for r in runs if r.verdict is Verdict.INVALID]
    for r in refused:
        assert PACKAGE_REFUSED in r.detail, r.detail
    # every run ran good's build, the chosen packages from bad's first on its path
    for r in runs:
        exp = r.experiment()
        assert exp.build == "0.5.22"
        if exp.packages and r.verdict is not Verdict.INVALID:
            assert "/overlays/" in (r.rendered or ""), r.rendered


def test_bisect_builds_through_the_cli_and_its_resume(sshd: SshdEndpoint, tmp_path: Path) -> None:
    """`orchestrator bisect --builds ...`: the answer as JSON, and the same campaign's
    resume (`--resume ID`) rebuilds the ordered plan from its record."""
    from tests.support.campaign_lab import cli_json

    hosts = _hosts(sshd, tmp_path, install_lab_builds(tmp_path))
    pair = lab_pair(tmp_path, "releases")
    code, out = cli_json(
        "bisect",
        "--good",
        pair.good,
        "--bad",
        pair.bad,
        "--host",
        "lab",
        "--hosts",
        hosts,
        "--results",
        tmp_path / "results",
        "--builds",
        ",".join(BETWEEN),
        "--no-report",
    )
    assert code == 0, out
    (cul,) = out["culprits"]
    assert sorted(cul["deltas"]) == ["+ --enable-nccl-nvls", "~ build 0.5.22 -> 0.5.23rc1"]
    code, again = cli_json(
        "bisect",
        "--resume",
        out["campaign"],
        "--hosts",
        hosts,
        "--results",
        tmp_path / "results",
        "--no-report",
    )
    assert code == 0 and again["culprits"][0]["deltas"] == cul["deltas"], again
