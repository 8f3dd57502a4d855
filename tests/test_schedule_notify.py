"""A schedule never holds the notification URL: its command line is stored in the clear
(the timer unit, the crontab line, `schedule list`). With the real `crontab` in a private
spool (tests/test_schedule.py): a command with `--notify` is refused and nothing is
installed; `--notify-file` puts only the file's path in the job's environment (and a file
other users can read is refused); a line an older version installed with the URL in it is
listed with the URL hidden, and a note says how to fix it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.campaign_lab import LAB
from tests.test_schedule import NO_SYSTEMD, in_crontab, private_crontab  # noqa: F401

# Every test runs the CLI and the real crontab as processes: `slow`, so the fast tier
# (scripts/test --fast) stays within seconds.
pytestmark = pytest.mark.slow

SECRET_PATH = "T0/B0/s3cr3tpath"
URL = f"https://hooks.example/services/{SECRET_PATH}"
ORCH = [sys.executable, "-m", "orchestrator"]


def _files(tmp: Path) -> tuple[Path, Path]:
    hosts = tmp / "hosts.yaml"
    hosts.write_text(
        "hosts: {lab: {address: localhost, transport: local, service_manager: process}}\n"
    )
    base = tmp / "base.yaml"
    base.write_text(yaml.safe_dump({"extends": str(LAB / "rtx6000" / "perf_good.yaml")}))
    sweep = tmp / "nightly.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {"name": "nightly", "base": "base.yaml", "matrix": {"cuda-graph-max-bs": [512]}}
        )
    )
    return hosts, sweep


@NO_SYSTEMD
def test_a_scheduled_command_with_notify_is_refused(
    private_crontab: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    hosts, sweep = _files(tmp_path)
    res = in_crontab(
        private_crontab,
        *ORCH,
        "schedule",
        "add",
        "nightly",
        "--at",
        "Mon..Fri 01:30",
        "--",
        "sweep",
        sweep,
        "--host",
        "lab",
        "--hosts",
        hosts,
        "--notify",
        URL,
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert "cannot carry --notify" in res.stderr and "--notify-file" in res.stderr
    assert SECRET_PATH not in res.stdout + res.stderr
    assert in_crontab(private_crontab, "crontab", "-l").stdout == ""  # nothing installed


@NO_SYSTEMD
def test_notify_file_puts_only_the_path_in_the_job(
    private_crontab: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    hosts, sweep = _files(tmp_path)
    hook = tmp_path / "hook.url"
    hook.write_text(URL + "\n")
    hook.chmod(0o644)
    args = [
        *ORCH,
        "schedule",
        "add",
        "nightly",
        "--at",
        "Mon..Fri 01:30",
        "--notify-file",
        hook,
        "--",
        "sweep",
        sweep,
        "--host",
        "lab",
        "--hosts",
        hosts,
    ]
    refused = in_crontab(private_crontab, *args)
    assert refused.returncode == 2 and "readable by other users" in refused.stderr
    assert in_crontab(private_crontab, "crontab", "-l").stdout == ""
    hook.chmod(0o600)
    res = in_crontab(private_crontab, *args)
    assert res.returncode == 0, res.stdout + res.stderr
    crontab = in_crontab(private_crontab, "crontab", "-l").stdout
    assert f"ORCH_NOTIFY_FILE={hook}" in crontab
    listed = in_crontab(private_crontab, *ORCH, "schedule", "list", "--json")
    for text in (crontab, res.stdout, res.stderr, listed.stdout, listed.stderr):
        assert SECRET_PATH not in text


@NO_SYSTEMD
def test_an_old_schedule_with_the_url_is_listed_hidden(
    private_crontab: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    command = f"{sys.executable} -m orchestrator sweep n.yaml --notify {URL}"
    lines = (
        f"# orchestrator schedule old at Mon..Fri 01:30 runs: {command}\n30 1 * * 1-5 {command}\n"
    )
    assert (
        in_crontab(private_crontab, "sh", "-c", f"printf '%s' '{lines}' | crontab -").returncode
        == 0
    )
    listed = in_crontab(private_crontab, *ORCH, "schedule", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    [entry] = json.loads(listed.stdout)
    assert entry["command"].endswith("--notify [hidden]") and SECRET_PATH not in listed.stdout
    assert "carries --notify" in listed.stderr and "--notify-file" in listed.stderr
