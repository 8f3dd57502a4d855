"""The `real` tier on the systemd lab host: `orchestrator lab up --systemd --vllm`, then the
README's bisect command on the environment variable pair through the host's own unit
`vllm-lab.service` (enabled, running real `vllm serve` since the boot, as an operator's
would). Each run replaces the unit's command and environment with a drop-in; afterwards
the unit is back as it was and serving, and every vLLM process on the host is the
unit's. The pair's subsets are the bisection's own starts, plus any its search did not
need (started there too). The lab has its own state directory and container name
(ORCH_LAB_DIR, ORCH_LAB_SYSTEMD_NAME), so a lab the user runs is never touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.campaign.planning import make_plan
from orchestrator.config.hosts import load_inventory
from orchestrator.lab import sdlab
from orchestrator.lab.sshd import free_port
from orchestrator.store.store import Store
from tests.hosts.prereq import require_systemd_host
from tests.hosts.vllm import REAL, RealVllm
from tests.hosts.vllm_incidents import ENV_VAR, check_subsets, start_missing, subsets

REPO = Path(__file__).resolve().parents[1]
UNIT = sdlab.VLLM_UNIT

pytestmark = pytest.mark.systemd  # and `real`, from its fixture


@dataclass
class VllmLab:
    env: dict[str, str]
    settings: sdlab.SdLabSettings
    results: Path

    def cli(self, *args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", *map(str, args)],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def sh(self, command: str) -> str:
        res = sdlab.status(self.settings).target().ssh_run(command, timeout=60)
        assert res.returncode == 0, f"{command}: {res.stderr}"
        return res.stdout

    @property
    def hosts_file(self) -> Path:
        return self.settings.lab.state_dir / "hosts.yaml"


@pytest.fixture(scope="module")
def vllm_lab(
    vllm_real: RealVllm,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[VllmLab]:
    require_systemd_host()
    tmp = tmp_path_factory.mktemp("real-vllm-systemd")
    env = {
        **os.environ,
        "ORCH_LAB_DIR": str(tmp / "lab"),
        "ORCH_LAB_PORT": str(free_port()),
        sdlab.NAME_ENV: f"orch-lab-t{os.getpid()}-vllm",
        "ORCH_SKIP_APT": "1",
        "COLUMNS": "200",
    }
    lab = VllmLab(env=env, settings=sdlab.SdLabSettings.from_env(env), results=tmp / "results")
    try:
        up = lab.cli("lab", "up", "--systemd", "--vllm")
        assert up.returncode == 0, up.stdout + up.stderr
        yield lab
    finally:
        down = lab.cli("lab", "down")
        assert down.returncode == 0, down.stdout + down.stderr


def _health(lab: VllmLab) -> str:
    return lab.sh(
        f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 3 "
        f"http://127.0.0.1:{sdlab.VLLM_PORT}/health || true"
    ).strip()


def test_env_var_bisected_through_the_lab_hosts_unit(vllm_lab: VllmLab) -> None:
    lab = vllm_lab
    # as `lab up --systemd --vllm` left it: enabled, started at boot
    assert lab.sh(f"systemctl is-enabled {UNIT}").strip() == "enabled"
    assert lab.sh(f"systemctl show {UNIT} -p ActiveState --value").strip() in (
        "active",
        "activating",
    )
    unit = f"systemctl cat {UNIT}; systemctl show {UNIT} -p Environment -p DropInPaths"
    before = lab.sh(unit)
    # the README's command, on the lab's hosts file
    res = lab.cli(
        "bisect",
        "--good",
        REAL / "good.yaml",
        "--bad",
        REAL / "env_var.yaml",
        "--host",
        sdlab.HOST_NAME,
        "--hosts",
        lab.hosts_file,
        "--results",
        lab.results,
        "--json",
        timeout=3000,
    )
    answer = json.loads(res.stdout)
    assert res.returncode == 0 and answer["status"] == "found", res.stdout + res.stderr
    [culprit] = answer["culprits"]
    assert culprit["flags"] == list(ENV_VAR.culprits), answer
    assert answer["findings"] == [], answer["findings"]
    assert ENV_VAR.words in answer["target"], answer["target"]
    # the subsets: the bisection's own starts on the unit, and any its search skipped
    plan = make_plan(REAL / "good.yaml", REAL / "env_var.yaml")
    host = load_inventory(lab.hosts_file).host(sdlab.HOST_NAME)
    start_missing(
        lab.results,
        {"unit": host},
        [("unit", plan.variant(s.indices)) for s in subsets(ENV_VAR, plan)],
    )
    store = Store(lab.results)
    try:
        check_subsets(store, ENV_VAR, plan)
        assert {r.host for r in store.runs()} == {sdlab.HOST_NAME}
    finally:
        store.close()
    # the unit as it was: its own command and environment, no drop-in; started again, and
    # serving; every vLLM process on the host is the unit's (a run's stop left none)
    assert lab.sh(unit) == before
    deadline = time.monotonic() + 900  # a start on a loaded machine: minutes
    while _health(lab) != "200" and time.monotonic() < deadline:
        time.sleep(2)
    assert _health(lab) == "200"
    # (the unified hierarchy's line of /proc/PID/cgroup: `0::/system.slice/UNIT`)
    procs = lab.sh(
        "for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null); "
        'case "$c" in *vllm*|VLLM*) echo "$(sed -n \'s/^0:://p\' $p/cgroup '
        '2>/dev/null) $c";; esac; done'
    )
    lines = [ln for ln in procs.splitlines() if ln.strip() and "/proc/[0-9]" not in ln]
    assert lines and all(f"/system.slice/{UNIT} " in ln for ln in lines), procs
