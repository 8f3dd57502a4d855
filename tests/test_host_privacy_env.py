"""On the real systemd host: what the project writes there is private, and a change of the
host's environment during a campaign is detected.

- Files: every file the orchestrator writes on the host (the drop-in, the secret
  EnvironmentFile, the found-state note, the lock; with the process manager the launch
  script, pid, exit and per-run log files) is 0600 in 0700 directories, and a second,
  unprivileged local user (uid 65534 via setpriv) can read none of them. The process
  manager keeps only the newest `keep_runs` run logs once they are copied.
- Environment: the lab's nvidia-smi stand-in is linked into the container's PATH and a
  flashinfer-python distribution installed (a dist-info); the driver it presents, or the
  package's version, is changed between the first and the second run of one bisection.
  The second run is recorded as `infra`, the campaign stops with status `changed` and
  says what changed, the reports say so, and the same command then starts a new
  campaign that does not reuse the verdicts of the old environment.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.campaign.bisect import Bisection, BisectOptions
from orchestrator.campaign.envwatch import EnvironmentChanged
from orchestrator.campaign.planning import make_plan
from orchestrator.cli import main
from orchestrator.config.hosts import load_inventory
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.events import Event, RunRecorded
from orchestrator.execution.executor import Executor
from orchestrator.lab.sshd import SshdEndpoint, free_port
from orchestrator.reports.report import html_page, markdown
from orchestrator.store.store import Store
from tests.hosts.faults import B300, UNIT_DIR, SdLab
from tests.support.campaign_lab import LAB

AS_NOBODY = "setpriv --reuid=65534 --regid=65534 --clear-groups "
SECRET = "hf_PrivateValueThatMustNotLeak123456"
GPUS = "/etc/orchestrator-lab/gpus.json"
SHIM = "/opt/orchestrator/orchestrator/lab/bin/nvidia-smi"


def _listing(sd: SdLab, *paths: str) -> list[tuple[str, str, str]]:
    """(type, octal mode, path) of everything under `paths` (as root)."""
    out = sd.sh(
        f"find {' '.join(shlex.quote(p) for p in paths)} -printf '%y %m %p\\n' 2>/dev/null; true"
    )
    return [tuple(line.split(" ", 2)) for line in out.splitlines() if line.strip()]  # type: ignore[misc]


def _assert_private(sd: SdLab, entries: list[tuple[str, str, str]]) -> None:
    assert entries
    for kind, mode, path in entries:
        assert mode == ("700" if kind == "d" else "600"), (kind, mode, path)
        if kind == "f":
            r = sd.box.ssh_run(AS_NOBODY + f"cat {shlex.quote(path)}")
            assert r.returncode != 0 and not r.stdout, f"{path} readable by another user"
        else:
            r = sd.box.ssh_run(AS_NOBODY + f"ls {shlex.quote(path)}")
            assert r.returncode != 0, f"{path} listable by another user"


def test_systemd_files_are_private_to_root(sd: SdLab) -> None:
    exp = load_experiment(LAB / "b300" / "good.yaml").with_changes(env={"HF_TOKEN": SECRET})
    # no PYTHONPATH from the hosts file: the unit's own Environment= and WorkingDirectory=
    # are what lets the server's interpreter find its package (the lab's)
    host = replace(sd.host, env=())
    with Executor(host, service=B300, campaign="c-priv") as ex:
        r = ex.run(exp, run_id="priv-1")
        entries = _listing(sd, f"{UNIT_DIR}/{B300}.d", "/tmp/orchestrator")
        names = {p.rsplit("/", 1)[-1] for _, _, p in entries}
        assert {
            "99-orchestrator.conf",
            "99-orchestrator.env",
            "orchestrator-found-state",
            f"{B300}.lock",
        } <= names, names
        _assert_private(sd, entries)
        assert SECRET in sd.sh(f"cat {UNIT_DIR}/{B300}.d/99-orchestrator.env")  # it is there
    assert r.verdict is Verdict.PASS, (r.detail, r.log_tail[-1500:])
    assert r.environment is not None and r.environment.server == "orchestrator"
    assert r.environment.server_version  # found through the unit's context
    assert sd.restored_problems() == []


def test_process_manager_files_are_private_and_old_run_logs_pruned(sd: SdLab) -> None:
    host = replace(
        sd.host,
        service_manager="process",
        run_dir="/tmp/orch-priv",
        keep_runs=2,
        env=(("PYTHONPATH", "/opt/orchestrator"), ("ORCH_LAB_TIME_SCALE", "0.1")),
    )
    exp = load_experiment(LAB / "b300" / "good.yaml").with_changes(env={"HF_TOKEN": SECRET})
    try:
        with Executor(host, service="lab-priv", campaign="c-pm") as ex:
            for i in range(3):
                r = ex.run(exp, run_id=f"pm-{i}")
                assert r.verdict is Verdict.PASS, (r.detail, r.log_tail[-1500:])
            entries = _listing(sd, "/tmp/orch-priv")
            logs = sorted(p.rsplit("/", 1)[-1] for k, _, p in entries if p.endswith(".log"))
            assert logs == ["run-pm-1.log", "run-pm-2.log"]  # keep_runs: 2, after copying
            assert any(p.endswith("/launch.sh") for _, _, p in entries)
            assert any(p.endswith(".lock") for _, _, p in entries)
            _assert_private(sd, entries)
            # the launch script holds the secret: only its owner can read it
            assert SECRET in sd.sh("cat /tmp/orch-priv/lab-priv/launch.sh")
    finally:
        sd.sh("rm -rf /tmp/orch-priv", check=False)


def test_process_manager_files_on_the_sshd_host_are_private(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    """The same through the process manager over the real sshd on this machine: a second
    local user (uid 65534) can neither list the run directory nor read a file in it."""
    run_dir = f"/tmp/orch-priv-{os.getpid()}"
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(sshd.hosts_yaml("lab", run_dir=run_dir, env={"ORCH_LAB_TIME_SCALE": "0.1"}))
    host = load_inventory(hosts).host("lab")
    exp = load_experiment(LAB / "b300" / "good.yaml").with_changes(
        flags={"port": free_port()}, env={"HF_TOKEN": SECRET}
    )
    try:
        with Executor(host, service="lab-priv", campaign="c-sshd-priv") as ex:
            r = ex.run(exp, run_id="sshd-priv")
            assert r.verdict is Verdict.PASS, (r.detail, r.log_tail[-1500:])
            found = []
            for root, dirs, files in os.walk(run_dir):
                for name in dirs + files:
                    found.append(os.path.join(root, name))
            assert any(p.endswith("run-sshd-priv.log") for p in found), found
            for path in [run_dir, *found]:
                mode = stat.S_IMODE(os.lstat(path).st_mode)
                assert mode == (0o700 if os.path.isdir(path) else 0o600), (path, oct(mode))
                res = subprocess.run(
                    [
                        "setpriv",
                        "--reuid=65534",
                        "--regid=65534",
                        "--clear-groups",
                        "cat" if os.path.isfile(path) else "ls",
                        path,
                    ],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
                assert res.returncode != 0 and not res.stdout, f"{path} readable by another user"
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _dist(sd: SdLab, version: str) -> None:
    """A flashinfer-python distribution of `version` in the host's site-packages: what
    `pip install` leaves (a dist-info), read by importlib.metadata like any other."""
    site = sd.sh("python3 -c 'import site; print(site.getsitepackages()[0])'").strip()
    sd.sh(
        f"rm -rf {site}/flashinfer_python-*.dist-info; "
        f"mkdir -p {site}/flashinfer_python-{version}.dist-info"
    )
    sd.box.write_file(
        f"{site}/flashinfer_python-{version}.dist-info/METADATA",
        f"Metadata-Version: 2.1\nName: flashinfer-python\nVersion: {version}\n",
    )


CHANGES = {
    "driver": (
        "driver 580.95.05 -> 590.44.01",
        lambda sd: sd.box.write_file(GPUS, json.dumps({"driver": "590.44.01"})),
    ),
    "package": ("flashinfer 0.3.1 -> 0.3.2", lambda sd: _dist(sd, "0.3.2")),
}


@pytest.mark.parametrize("what", sorted(CHANGES))
def test_a_change_between_two_runs_is_detected(
    sd: SdLab, tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str
) -> None:
    said, change = CHANGES[what]
    sd.sh(f"mkdir -p /etc/orchestrator-lab && ln -sf {SHIM} /usr/local/bin/nvidia-smi")
    sd.box.write_file(GPUS, json.dumps({"driver": "580.95.05"}))
    _dist(sd, "0.3.1")
    try:
        plan = make_plan(str(LAB / "b300" / "good.yaml"), str(LAB / "b300" / "bad.yaml"), "auto")
        results = tmp_path / "results"
        store = Store(results)

        def change_after_first_run(e: Event) -> None:
            if isinstance(e, RunRecorded) and e.done == 1:  # upgraded "overnight"
                change(sd)

        b = Bisection(store, plan, [sd.host], listener=change_after_first_run)
        with pytest.raises(EnvironmentChanged) as err:
            b.run()
        assert "the environment of sd changed during campaign" in str(err.value)
        assert said in str(err.value) and "not mixed" in str(err.value)
        assert store.campaign(b.cid).status == "changed"
        runs = store.runs(b.cid)
        assert [r.verdict for r in runs] == [Verdict.PASS, Verdict.INFRA], runs
        assert said in runs[1].detail
        assert (
            runs[0].env_digest and runs[1].env_digest and runs[0].env_digest != runs[1].env_digest
        )
        seen = store.campaign_environments(b.cid)
        assert [(s.host, s.env.gpu_count) for s in seen] == [("sd", 8), ("sd", 8)]
        assert seen[0].env.driver == "580.95.05"
        assert seen[0].env.packages["flashinfer"] == "0.3.1"
        assert seen[0].env.server == "orchestrator" and seen[0].env.kernel
        assert sd.restored_problems() == []
        # both reports and `show --json` carry it
        camp = store.campaign(b.cid)
        md = markdown(camp, runs, seen)
        assert f"**The environment changed during the campaign**: {said}" in md
        assert "The environment changed during the campaign" in html_page(camp, runs, seen)
        capsys.readouterr()
        assert main(["show", runs[1].id, "--json", "--results", str(results)]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["environment"] == seen[1].env.to_dict()
        # the same command again: a new campaign, and the good config's verdict from the
        # old environment is not served from the cache
        b2 = Bisection(store, plan, [sd.host], options=BisectOptions(max_runs=1))
        assert b2.cid != b.cid
        b2.run()
        [first] = store.runs(b2.cid)
        assert first.cached_from is None and first.purpose == "endpoint"
        assert first.env_digest == runs[1].env_digest and first.verdict is Verdict.PASS
        assert sd.restored_problems() == []
    finally:
        sd.sh(
            f"rm -f /usr/local/bin/nvidia-smi {GPUS}; rm -rf "
            "$(python3 -c 'import site; print(site.getsitepackages()[0])')"
            "/flashinfer_python-*.dist-info",
            check=False,
        )
