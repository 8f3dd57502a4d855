"""Helpers for the campaign tests: lab experiment pairs and hosts files on the real hosts.

The lab pairs under `experiments/lab/` are used as shipped, through small YAML files that
`extends:` them and only move the server to a port of the test's own (on the sshd host the
server listens on this machine's 127.0.0.1, where other tests may run servers too). The
lab's startup is sped up with `ORCH_LAB_TIME_SCALE`: on the sshd host through the host's
`env:` entry, on the systemd host through the unit's `Environment=`; the pairs' settle after
the first ready answers (`health.settle`) is shortened by the same factor.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from orchestrator.campaign.bisect import Bisection, BisectOptions, Outcome
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host, load_inventory
from orchestrator.diagnosis.verdicts import Verdict, relative
from orchestrator.lab.sshd import SshdEndpoint, free_port
from orchestrator.lab.units import lab_unit
from orchestrator.store.store import RunRow, Store

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "experiments" / "lab"
UNIT_DIR = "/etc/systemd/system"
TIME_SCALE = "0.1"
#: the health settle of lab configs in the tests: shortened like the lab's startup
SETTLE = {"settle": f"{float(TIME_SCALE):g}s"}

#: the lab pairs: scenario -> (good, bad) file names under experiments/lab/<scenario>/
PAIRS = {
    "b300": ("good.yaml", "bad.yaml"),
    "rtx6000": ("good.yaml", "bad.yaml"),
    "rtx6000-perf": ("perf_good.yaml", "perf_bad.yaml"),
    "rtx6000-repair": ("good.yaml", "bad.yaml"),
    "glm5": ("good.yaml", "bad.yaml"),
    "b300-any": ("good.yaml", "bad.yaml"),
    "flaky": ("good.yaml", "bad.yaml"),
    "flaky-load": ("good.yaml", "bad.yaml"),
    "decoy": ("good.yaml", "bad.yaml"),
    "compile": ("good.yaml", "bad.yaml"),
    "b300-checkpoint": ("good.yaml", "bad.yaml"),
    "releases": ("good.yaml", "bad.yaml"),
    "rtx6000-nowindow": ("good.yaml", "bad.yaml"),
    "hicache": ("good.yaml", "bad.yaml"),
    "rtx6000-default": ("good.yaml", "bad.yaml"),
}

#: the user's own unit on the systemd host: the lab's environment, and an ExecStart of its
#: own that the orchestrator's drop-in replaces for each run
LAB_UNIT = lab_unit(time_scale=TIME_SCALE)


@dataclass(frozen=True)
class Pair:
    """A good/bad pair of experiment files written for one test."""

    good: Path
    bad: Path
    port: int
    unit: str


def lab_pair(tmp: Path, pair: str, *, port: int | None = None) -> Pair:
    """The shipped lab pair `pair`, extended to listen on `port` (a free one by default)."""
    scenario = pair if (LAB / pair).is_dir() else pair.split("-")[0]
    good_name, bad_name = PAIRS.get(pair, ("good.yaml", "bad.yaml"))
    port = port or free_port()
    out = tmp / "experiments"
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for side, name in (("good", good_name), ("bad", bad_name)):
        path = out / f"{pair}-{side}.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "name": f"test-{pair}-{side}",
                    "extends": str(LAB / scenario / name),
                    "service": {"flags": {"port": port}},
                    # the lab starts TIME_SCALE times faster; so does the check that it stays up
                    "health": SETTLE,
                },
                sort_keys=False,
            )
        )
        paths.append(path)
    unit = _unit(LAB / scenario / good_name)
    return Pair(paths[0], paths[1], port, unit)


def _unit(path: Path) -> str:
    """The `service.unit` of an experiment file, following its `extends:` chain."""
    data = yaml.safe_load(path.read_text())
    unit = (data.get("service") or {}).get("unit")
    return unit or _unit(path.parent / data["extends"])


def replayed_hosts_file(sshd: SshdEndpoint, tmp: Path, base: int) -> Path:
    """The sshd lab host whose flaky scenarios (`seed: random`) replay the fixed draw
    sequence `base` (`ORCH_LAB_SEED=random:BASE`), so that a test repeats its history."""
    path = tmp / "hosts.yaml"
    path.write_text(
        sshd.hosts_yaml(
            "lab",
            run_dir=str(tmp / "run"),
            env={
                "ORCH_LAB_TIME_SCALE": TIME_SCALE,
                "ORCH_LAB_SEED": f"random:{base}",
                "ORCH_LAB_DIR": str(tmp / "lab-state"),
            },
        )
    )
    return path


def bad_passes_first(bad: Experiment, scenario: str) -> int:
    """The first replay sequence whose 2nd start (bad, after good) does not crash: the
    campaign then meets the flakiness on its own bad config."""
    from orchestrator.lab import cmdline
    from orchestrator.lab import scenario as sc
    from orchestrator.lab.scenario_model import LAB_ONLY_FLAGS
    from orchestrator.lab.server import replayed_seed

    scen = sc.load(scenario)
    argv = bad.argv()
    flags = cmdline.parse_strict(argv[argv.index("--scenario") + 2 :], scen.known_flags)
    for name in LAB_ONLY_FLAGS:
        flags.pop(name, None)
    for base in range(1, 200):
        if scen.select_fault(flags, bad.env_map(), replayed_seed(base, 2)) is None:
            return base
    raise AssertionError("no sequence starts with a pass of bad")


def sshd_hosts_file(sshd: SshdEndpoint, tmp: Path, name: str = "lab") -> Path:
    """A hosts.yaml with the sshd as a process-manager host, run_dir and env of its own."""
    path = tmp / "hosts.yaml"
    path.write_text(
        sshd.hosts_yaml(name, run_dir=str(tmp / "run"), env={"ORCH_LAB_TIME_SCALE": TIME_SCALE})
    )
    return path


def load_host(hosts_file: Path, name: str) -> Host:
    return load_inventory(hosts_file).host(name)


def sigkill_executor_child_while_polling(spec: dict[str, Any], tmp_path: Path) -> int:
    """Run `tests/support/executor_child.py` on `spec` and SIGKILL it once it polls the
    server: a controller that dies mid-run, leaving the host as such a crash would. Returns
    its pid (the lock it leaves names it)."""
    import time

    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("executor_child.py")), str(spec_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "POLLING" not in line:
            assert child.stdout is not None
            line = child.stdout.readline()
            if not line and child.poll() is not None:
                break
        assert "POLLING" in line, child.stderr.read() if child.stderr else ""
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
    return child.pid


def our_processes(marker: str) -> list[int]:
    """Pids on this machine whose command line mentions `marker` (a run_dir, a port)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            found.append(int(proc.name))
    return found


def lab_servers(port: int) -> list[int]:
    """Pids of lab servers on this machine listening (or meant to listen) on `port`."""
    return [p for p in our_processes("orchestrator.lab.server") if f"--port {port}" in _cmdline(p)]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def cli(
    *args: str | Path,
    timeout: float = 600,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`orchestrator ARGS` in a subprocess (this interpreter), output captured."""
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def cli_json(*args: str | Path, timeout: float = 600) -> tuple[int, dict]:
    """`orchestrator ARGS --json` -> (exit code, parsed stdout)."""
    res = cli(*args, "--json", timeout=timeout)
    try:
        return res.returncode, json.loads(res.stdout)
    except json.JSONDecodeError:
        raise AssertionError(
            f"exit {res.returncode}, not JSON:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        ) from None


def popen_cli(*args: str | Path, log: Path) -> subprocess.Popen[bytes]:
    """`orchestrator ARGS` started in the background, its output to `log`."""
    fh = open(log, "wb")  # noqa: SIM115 - the child owns it until it ends
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *map(str, args)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            env={**os.environ, "COLUMNS": "200"},
        )
    finally:
        fh.close()


def stop_child(child: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Make sure a child is gone (SIGKILL if needed), bounded."""
    if child.poll() is None:
        child.send_signal(signal.SIGKILL)
    child.wait(timeout=timeout)


def read_runs(results: Path, campaign: str | None = None) -> list[RunRow]:
    """The runs recorded in `results` (a fresh connection: what another process sees)."""
    store = Store(results)
    try:
        if campaign is None:
            camps = [c.id for c in store.campaigns() if c.kind == "bisect"]
            return [r for c in camps for r in store.runs(c)]
        return store.runs(campaign)
    finally:
        store.close()


def check_answer_evidence(results: Path, answer: dict, target: str) -> None:
    """Each culprit's claims are backed by recorded runs with the claimed verdicts."""
    store = Store(results)
    try:
        for cul in answer["culprits"]:
            rep = store.run(cul["reproduced_by"])
            assert rep.verdict is Verdict.FAIL and str(rep.signature) == target, rep
            assert set(rep.variant) == set(cul["indices"])  # good + exactly the set
            assert set(cul["cleared_by"]) == set(cul["flags"])
            for flag, rid in cul["cleared_by"].items():
                cleared = store.run(rid)
                # bad minus the flag does not show the target failure
                assert not (cleared.verdict is Verdict.FAIL and str(cleared.signature) == target)
                assert cleared.verdict in (Verdict.PASS, Verdict.OTHER), (flag, cleared)
                assert set(cleared.variant) == set(range(len(answer["deltas"]))) - {
                    cul["indices"][cul["flags"].index(flag)]
                }
    finally:
        store.close()


@dataclass(frozen=True)
class Recorded:
    """A finished b300 bisection on the sshd host, made once per test session."""

    root: Path
    pair: Pair
    hosts: Path
    exit_code: int
    outcome: dict

    @property
    def campaign(self) -> str:
        return str(self.outcome["campaign"])

    def copy_results(self, dest: Path) -> Path:
        """A private copy of the results dir (the store is closed: a consistent copy)."""
        shutil.copytree(self.root / "results", dest)
        return dest


def recorded_b300(sshd: SshdEndpoint, basetemp: Path) -> Recorded:
    """The b300 bisection through `orchestrator bisect ... --json` on the sshd host.

    Made by the first test that needs it and kept under the session's base temp dir, so
    the tests that only read a recorded campaign (reports, `runs`, `show`, `rerun`) do
    not pay for a bisection each; each of them works on its own copy of the results.
    """
    root = basetemp / "recorded-b300"
    root.mkdir(exist_ok=True)
    with open(root / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = root / "outcome.json"
        pair = Pair(
            root / "experiments" / "b300-good.yaml",
            root / "experiments" / "b300-bad.yaml",
            0,
            "lab-b300.service",
        )
        if not done.exists():
            pair = lab_pair(root, "b300")
            hosts = sshd_hosts_file(sshd, root)
            res = cli(
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
                root / "results",
                "--json",
            )
            try:
                outcome = json.loads(res.stdout)
            except json.JSONDecodeError:
                raise AssertionError(
                    f"bisect --json printed no JSON (exit {res.returncode}):\n"
                    f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
                ) from None
            done.write_text(
                json.dumps({"exit_code": res.returncode, "outcome": outcome, "port": pair.port})
            )
        data = json.loads(done.read_text())
    pair = Pair(pair.good, pair.bad, data["port"], pair.unit)
    return Recorded(root, pair, root / "hosts.yaml", data["exit_code"], data["outcome"])


def check_b300_answer(answer: dict[str, Any], results: Path, *, resumed: bool = False) -> None:
    """{ep-size 8, enable-nccl-nvls} as one interacting set; AttributeError at init as a
    separate finding; max-running-requests cleared; every claim backed by a stored run."""
    assert answer["status"] == "found", answer
    target = answer["target"]
    assert target.startswith("cuda_graph: cublas: ") and "CUBLAS_STATUS_EXECUTION_FAILED" in target
    deltas = answer["deltas"]
    assert sorted(deltas) == sorted(
        ["+ --ep-size 8", "+ --enable-nccl-nvls", "~ --max-running-requests 128 -> 256"]
    )
    [culprit] = answer["culprits"]
    assert sorted(culprit["flags"]) == ["--enable-nccl-nvls", "--ep-size 8"]
    assert culprit["interacting"] is True and culprit["confirmed"] is True
    assert deltas.index("~ --max-running-requests 128 -> 256") not in culprit["indices"]
    check_answer_evidence(results, answer, target)
    [finding] = answer["findings"]
    assert (
        finding["signature"] == "init: AttributeError: 'NoneType' object has no attribute 'dtype'"
        " @ sglang/pynccl.py:__init__"
    )
    assert finding["deltas"] == [deltas.index("+ --ep-size 8")]  # the smallest variant: ep alone
    store = Store(results)
    try:
        run = store.run(finding["run"])
        camp = store.campaign(answer["campaign"])
        assert str(run.signature) == finding["signature"]
        assert relative(run.verdict, run.signature, camp.target) is Verdict.OTHER
        assert run.variant == tuple(finding["deltas"])
        assert "AttributeError: 'NoneType' object has no attribute 'dtype'" in run.log_tail()
        assert camp.status == "done" and str(camp.target) == target
        # Every variant the search needed ran once, but those the posterior search ran
        # again to be sure: nothing else repeated, nothing reused (a resumed campaign's
        # last process executed only the rest).
        runs = store.runs(camp.id)
        once = [r.variant for r in runs if not r.purpose.startswith("noise-")]
        assert len(set(once)) == len(once)
        assert all(r.cached_from is None for r in runs)
        if not resumed:
            assert len(runs) == answer["runs_executed"]
        assert [r.seq for r in runs] == list(range(1, len(runs) + 1))
    finally:
        store.close()


def install_lab_builds(tmp: Path, **special: dict) -> dict[str, str]:
    """The lab's releases (the `releases` scenario's versions) installed as build prefixes
    under `tmp/builds` on this machine: the hosts file's `builds:` (name -> prefix).
    `special`: a release's own `orchestrator.lab.builds.files` options (broken, version)."""
    from orchestrator.lab import builds as labbuilds
    from orchestrator.lab.scenario import load as load_scenario

    root = tmp / "builds"
    out = {}
    for v in load_scenario("releases").versions:
        labbuilds.install(root, v, python=sys.executable, repo=str(REPO), **special.get(v, {}))
        out[v] = str(root / v)
    return out


#: two lab releases that differ in three distributions: the server's own, a kernel, and a
#: tokenizer whose new release needs the new kernel (`bisect --packages`); name ->
#: {distribution: (version, requirements)}
PACKAGE_KINDS: dict[str, dict[str, tuple[str, list[str]]]] = {
    "0.5.22": {"lab-kernel": ("0.1.0", []), "lab-tokenizer": ("1.0", [])},
    "0.5.23rc1": {"lab-kernel": ("0.1.1", []), "lab-tokenizer": ("1.1", ["lab-kernel>=0.1.1"])},
}
#: what `pip check` says of the new tokenizer without the new kernel
PACKAGE_REFUSED = (
    "pip check refuses this set of packages: lab-tokenizer 1.1 has requirement lab-kernel>=0.1.1"
)


@dataclass(frozen=True)
class Bisected:
    """A campaign run to its end in a results store, as recorded."""

    outcome: Outcome
    runs: list[RunRow]
    envs: dict[str, Any]  # run id -> the environment recorded for it (or None)


def bisect_in(results: Path, plan: Any, hosts: list[Host], **options: Any) -> Bisected:
    """Bisect `plan` on `hosts` (BisectOptions from `options`), recorded under `results`:
    the outcome, its runs and each run's recorded environment."""
    store = Store(results)
    try:
        outcome = Bisection(
            store, plan, hosts, options=BisectOptions(**options), command="test"
        ).run()
        runs = store.runs(outcome.campaign_id)
        envs = {r.id: store.environment(r.env_digest) for r in runs}
    finally:
        store.close()
    return Bisected(outcome, runs, envs)
