"""Schedules: crontab lines and calendar checks here, a real timer in the systemd container.

On this machine (no systemd as PID 1) `schedule add` validates `--at` with
`systemd-analyze calendar` and prints the crontab line, whose command runs as printed. In
the booted systemd container, `schedule add` (run there over SSH with the project's
dependencies copied in) installs a timer that `systemctl list-timers` lists, and
`systemctl start` of its service runs a sweep on the container itself (local transport,
process manager) to its log and report; a job that fails exits with the sweep's code.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest
import yaml

from orchestrator.campaign import schedule as sched
from orchestrator.errors import UsageError
from orchestrator.lab.sdhosts import REPO_IN_CONTAINER, SystemdHost
from orchestrator.store.store import Store
from tests.support.campaign_lab import REPO, cli

CACHE = Path(os.environ.get("ORCH_ROOTFS_CACHE", "/var/cache/orchestrator-tests"))
DEPS_IN_CONTAINER = "/opt/orchestrator-deps"
WORK = "/srv/orch"  # the job's working directory in the container (writable)


# ---- pure: crontab lines ------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, fields",
    [
        ("Mon..Fri 01:30", "30 1 * * 1-5"),
        ("mon..fri 1:30", "30 1 * * 1-5"),
        ("Sat..Sun 03:00", "0 3 * * 6,0"),  # cron rejects the range 6-0
        ("Mon,Wed,Fri 04:00:00", "0 4 * * 1,3,5"),
        ("Sun 23:59", "59 23 * * 0"),
        ("02:00", "0 2 * * *"),
        ("daily", "0 0 * * *"),
    ],
)
def test_cron_line_of_simple_calendars(spec: str, fields: str) -> None:
    assert sched.cron_line(
        spec, ["/usr/bin/python3", "-m", "orchestrator", "sweep", "a b.yaml"]
    ) == (f"{fields} /usr/bin/python3 -m orchestrator sweep 'a b.yaml'")


@pytest.mark.parametrize(
    "spec", ["hourly", "*-*-* 02:00:00", "Mon..Fri *-*-01 01:30", "Mon 01:30:15", "Xyz 01:00"]
)
def test_calendars_without_a_simple_cron_form(spec: str) -> None:
    assert sched.cron_line(spec, ["x"]) is None


def test_cron_line_runs_in_the_workdir_and_appends_to_the_log() -> None:
    log = Path("/r/schedules/n.log")
    line = sched.cron_line(
        "Mon..Fri 01:30", ["orch", "sweep", "n.yaml"], workdir=Path("/srv/my work"), log=log
    )
    assert line == (
        "30 1 * * 1-5 cd '/srv/my work' && mkdir -p /r/schedules && "
        "orch sweep n.yaml >> /r/schedules/n.log 2>&1"
    )


def test_calendar_validation() -> None:
    assert sched.validate_calendar("Mon..Fri 01:30") == "Mon..Fri *-*-* 01:30:00"
    with pytest.raises(UsageError) as err:
        sched.validate_calendar("Mon..Fru 01:30")
    assert "Failed to parse calendar specification 'Mon..Fru 01:30'" in str(err.value)
    with pytest.raises(UsageError):
        sched.check_name("../evil")


def test_units_render_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/opt/x:/opt/y")
    monkeypatch.setenv("ORCH_HOSTS", "/etc/orch/hosts.yaml")
    command = sched.job_command(["sweep", "nightly.yaml", "--pool", "b300"])
    units = sched.render_units(
        "nightly",
        "Mon..Fri *-*-* 01:30:00",
        command,
        workdir=tmp_path,
        results=tmp_path / "results",
    )
    service, timer = units["orchestrator-nightly.service"], units["orchestrator-nightly.timer"]
    # the job: a shell that makes the log's directory, then becomes the command
    [exec_start] = [ln for ln in service.splitlines() if ln.startswith("ExecStart=")]
    sh, dash_c, script = shlex.split(exec_start.removeprefix("ExecStart="))
    log = tmp_path / "results" / "schedules" / "nightly.log"
    assert (sh, dash_c) == ("/bin/sh", "-c")
    assert script == (f"mkdir -p {log.parent} && exec {shlex.join(command)} >> {log} 2>&1")
    assert command == [
        sys.executable,
        "-m",
        "orchestrator",
        "sweep",
        "nightly.yaml",
        "--pool",
        "b300",
    ]
    assert f"# command: {shlex.join(command)}" in service
    assert f"WorkingDirectory={tmp_path}" in service
    for env in (
        f"ORCH_RESULTS={tmp_path / 'results'}",
        "PYTHONPATH=/opt/x:/opt/y",
        "ORCH_HOSTS=/etc/orch/hosts.yaml",
    ):
        assert f'Environment="{env}"' in service
    assert "OnCalendar=Mon..Fri *-*-* 01:30:00" in timer and "Persistent=true" in timer
    assert "Unit=orchestrator-nightly.service" in timer


# ---- the CLI on this machine (systemd is not PID 1 here) ----------------------------------


@pytest.mark.slow
def test_bad_calendar_is_a_usage_error_with_the_reason(tmp_path: Path) -> None:
    res = cli(
        "schedule",
        "add",
        "nightly",
        "--at",
        "Mon..Fru 01:30",
        "--results",
        tmp_path / "results",
        "--",
        "sweep",
        "x.yaml",
        timeout=60,
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Failed to parse calendar specification 'Mon..Fru 01:30'" in res.stdout + res.stderr
    assert not (tmp_path / "results").exists()
    nothing = cli("schedule", "add", "nightly", "--at", "daily", timeout=60)
    assert nothing.returncode == 2 and "nothing to schedule" in nothing.stdout + nothing.stderr


def test_cron_line_carries_the_settings_of_the_units(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_HOSTS", "/etc/orch/my hosts.yaml")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    env = sched.job_env(Path("/srv/results"))
    assert env == {"ORCH_RESULTS": "/srv/results", "ORCH_HOSTS": "/etc/orch/my hosts.yaml"}
    line = sched.cron_line("02:00", ["orch", "sweep", "n%d.yaml"], env=env)
    # cron makes a newline of an unescaped %
    assert line == (
        "0 2 * * * ORCH_RESULTS=/srv/results ORCH_HOSTS='/etc/orch/my hosts.yaml' "
        "orch sweep n\\%d.yaml"
    )


NO_SYSTEMD = pytest.mark.skipif(
    Path("/run/systemd/system").is_dir(), reason="systemd is running here"
)


@pytest.fixture
def private_crontab(tmp_path: Path) -> Path:
    """A spool directory for the real `crontab` command, bound over the system's in a mount
    namespace of each command's own (`in_crontab`): what tests add never reaches the
    machine's crontab."""
    if shutil.which("crontab") is None or shutil.which("unshare") is None:
        pytest.fail(
            "the crontab tests need cron's `crontab` and util-linux's `unshare` "
            "(scripts/bootstrap installs them)"
        )
    spool = tmp_path / "crontabs"
    spool.mkdir()
    shutil.chown(spool, "root", "crontab")
    spool.chmod(0o1730)
    return spool


def in_crontab(
    spool: Path, *args: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    script = 'mount --bind "$0" /var/spool/cron/crontabs && exec "$@"'
    return subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            str(spool),
            *map(str, args),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd or REPO,
    )


@pytest.mark.slow
@NO_SYSTEMD
def test_without_systemd_the_job_goes_into_the_crontab(
    private_crontab: Path, tmp_path: Path
) -> None:
    """`add` installs the line (with --results and ORCH_HOSTS), `list` shows it, the line
    runs as cron would run it, `remove` takes it out."""
    results = tmp_path / "my results"
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts: {}\n")
    env = {**os.environ, "ORCH_HOSTS": str(hosts)}
    orch = [sys.executable, "-m", "orchestrator"]
    store = Store(results)
    try:
        cid = store.create_campaign(kind="sweep", key="k", command="sweep x.yaml", spec={})
    finally:
        store.close()
    res = in_crontab(
        private_crontab,
        *orch,
        "schedule",
        "add",
        "listing",
        "--at",
        "Mon..Fri 01:30",
        "--results",
        results,
        "--",
        "runs",
        "--campaigns",
        env=env,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "added to the crontab of root" in res.stdout
    installed = in_crontab(private_crontab, "crontab", "-l").stdout.splitlines()
    [line] = [ln for ln in installed if ln.startswith("30 1 * * 1-5 ")]
    assert line in res.stdout
    assert f"cd {shlex.quote(str(REPO))} && " in line
    assert f"ORCH_RESULTS={shlex.quote(str(results))} ORCH_HOSTS={hosts} " in line
    assert f"{sys.executable} -m orchestrator runs --campaigns >> " in line
    listed = in_crontab(private_crontab, *orch, "schedule", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    [entry] = json.loads(listed.stdout)
    assert entry["name"] == "listing" and entry["at"] == "Mon..Fri 01:30"
    assert entry["command"] == f"{sys.executable} -m orchestrator runs --campaigns"
    # what cron would run (with cron's bare environment): the line after its time fields
    job = line.split(" ", 5)[5].replace("\\%", "%")
    run = subprocess.run(
        ["sh", "-c", job],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": "/root"},
    )
    log = results / "schedules" / "listing.log"
    assert run.returncode == 0, run.stderr + (log.read_text() if log.exists() else "")
    assert cid in log.read_text()  # it read the results where --results said
    # the same name again replaces it; remove takes it out; a second remove says so
    again = in_crontab(
        private_crontab,
        *orch,
        "schedule",
        "add",
        "listing",
        "--at",
        "02:00",
        "--results",
        results,
        "--",
        "runs",
        env=env,
    )
    assert again.returncode == 0, again.stderr
    assert (
        len(
            json.loads(
                in_crontab(private_crontab, *orch, "schedule", "list", "--json", env=env).stdout
            )
        )
        == 1
    )
    rm = in_crontab(private_crontab, *orch, "schedule", "remove", "listing", env=env)
    assert rm.returncode == 0 and "removed listing from the crontab of root" in rm.stdout
    assert in_crontab(private_crontab, *orch, "schedule", "list", "--json").stdout.strip() == "[]"
    rm = in_crontab(private_crontab, *orch, "schedule", "remove", "listing", env=env)
    assert rm.returncode == 2 and "no schedule named 'listing' in the crontab" in rm.stderr


@pytest.mark.slow
@NO_SYSTEMD
@pytest.mark.parametrize("daemon", [False, True])
def test_a_crontab_line_without_a_cron_daemon_is_warned_about(
    private_crontab: Path, tmp_path: Path, daemon: bool
) -> None:
    """In a process namespace of its own (its own /proc: no cron of the machine's is seen)
    `add` warns that nothing runs the line, with how to start cron and the systemd
    alternative; with a process named `cron` running there, it does not."""
    fake = tmp_path / "cron"  # a real process by cron's name (sleep, copied)
    shutil.copy(shutil.which("sleep") or "/bin/sleep", fake)
    start = f"{shlex.quote(str(fake))} 120 & " if daemon else ""
    orch = shlex.join([sys.executable, "-m", "orchestrator"])
    res = in_crontab(
        private_crontab,
        "unshare",
        "--pid",
        "--fork",
        "--mount-proc",
        "sh",
        "-c",
        f"{start}{orch} schedule add nightly --at 02:00 -- runs --campaigns",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "added to the crontab of root" in res.stdout
    warned = "no cron daemon is running here" in res.stderr
    assert warned is not daemon, res.stderr
    if warned:
        assert "service cron start" in res.stderr and "systemd timer" in res.stderr


@pytest.mark.slow
@NO_SYSTEMD
@pytest.mark.parametrize("before", [None, "MAILTO=ops\n15 3 * * * /usr/local/bin/backup\n"])
def test_add_then_remove_leaves_the_crontab_as_it_was(
    private_crontab: Path, before: str | None
) -> None:
    """No crontab before: none after (not an empty one); the user's own lines: kept as they
    were."""
    if before is not None:
        assert (
            in_crontab(private_crontab, "sh", "-c", f"printf '{before}' | crontab -").returncode
            == 0
        )
    orch = [sys.executable, "-m", "orchestrator"]
    res = in_crontab(
        private_crontab,
        *orch,
        "schedule",
        "add",
        "listing",
        "--at",
        "02:00",
        "--",
        "runs",
        "--campaigns",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert (private_crontab / "root").exists()
    rm = in_crontab(private_crontab, *orch, "schedule", "remove", "listing")
    assert rm.returncode == 0, rm.stdout + rm.stderr
    listed = in_crontab(private_crontab, "crontab", "-l")
    if before is None:
        assert not (private_crontab / "root").exists()
        assert listed.returncode == 1 and "no crontab for root" in listed.stderr
    else:
        assert listed.stdout == before


@pytest.mark.slow
@NO_SYSTEMD
@pytest.mark.parametrize(
    "at, words, expect",
    [
        ("Mon..Fri 01:30", ["bogus-command"], "would not run: argument COMMAND: invalid choice"),
        ("Mon..Fri 01:30", ["sweep", "gone.yaml"], "would fail: gone.yaml: sweep file not found"),
        ("Mon..Fri 01:30", ["sweep", "--max-runs", "x", "n.yaml"], "would not run"),
        ("hourly", ["runs"], "has no crontab form"),
    ],
)
def test_add_refuses_what_would_not_run(
    private_crontab: Path, at: str, words: list[str], expect: str
) -> None:
    res = in_crontab(
        private_crontab,
        sys.executable,
        "-m",
        "orchestrator",
        "schedule",
        "add",
        "nightly",
        "--at",
        at,
        "--",
        *words,
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert expect in res.stderr and "Traceback" not in res.stderr
    assert in_crontab(private_crontab, "crontab", "-l").stdout == ""  # nothing installed


@pytest.mark.slow
@NO_SYSTEMD
def test_without_crontab_nothing_is_scheduled_and_it_says_so(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"  # a PATH with what `schedule add` needs, but no crontab
    bindir.mkdir()
    for tool in ("systemd-analyze", "sh"):
        (bindir / tool).symlink_to(shutil.which(tool))  # type: ignore[arg-type]
    res = cli(
        "schedule",
        "add",
        "listing",
        "--at",
        "daily",
        "--results",
        tmp_path / "r",
        "--",
        "runs",
        env={**os.environ, "PATH": str(bindir)},
        timeout=60,
    )
    assert res.returncode == 3, res.stdout + res.stderr
    assert "`crontab` is not installed: nothing was scheduled" in res.stderr
    assert "apt-get install cron" in res.stderr


# ---- a real timer in the systemd container ------------------------------------------------


def project_dependencies() -> list[str]:
    return list(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])


def python_deps() -> Path:
    """The project's dependencies installed for Python 3.11 (the container's) with this
    venv's pip into a directory cached outside the repo, like the rootfs."""
    deps = project_dependencies()
    key = hashlib.sha256(json.dumps([sys.version_info[:2], sorted(deps)]).encode()).hexdigest()
    dest = CACHE / f"pydeps-cp3{sys.version_info[1]}-{key[:16]}"
    if dest.is_dir():
        return dest
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".pydeps.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if dest.is_dir():
            return dest
        tmp = Path(tempfile.mkdtemp(prefix=".pydeps-", dir=CACHE))
        res = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(tmp), *deps],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if res.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            pytest.fail(f"pip install --target failed: {res.stderr[-2000:]}")
        tmp.chmod(0o755)
        os.rename(tmp, dest)
    return dest


def copy_in(box: SystemdHost, src: Path, dest: str) -> None:
    """`src`'s contents to `dest` in the container (tar through ssh)."""
    tar = subprocess.Popen(["tar", "-C", str(src), "-cf", "-", "."], stdout=subprocess.PIPE)
    try:
        res = subprocess.run(
            box.ssh_command(f"mkdir -p {dest} && tar -C {dest} -xf -"),
            stdin=tar.stdout,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        assert tar.stdout is not None
        tar.stdout.close()
        tar.wait(timeout=60)
    assert res.returncode == 0 and tar.returncode == 0, res.stderr


def orch(box: SystemdHost, args: str, *, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python3 -m orchestrator ARGS` in the container, from the job's working directory."""
    env = f"PYTHONPATH={REPO_IN_CONTAINER}:{DEPS_IN_CONTAINER} ORCH_HOSTS={WORK}/hosts.yaml"
    return box.ssh_run(f"cd {WORK} && {env} python3 -m orchestrator {args}", timeout=timeout)


def test_timer_in_the_systemd_host_runs_the_sweep_to_a_report(systemd_host: SystemdHost) -> None:
    box = systemd_host
    copy_in(box, python_deps(), DEPS_IN_CONTAINER)
    # the sweep runs on the container itself: local transport, the process manager
    box.write_file(
        f"{WORK}/hosts.yaml",
        yaml.safe_dump(
            {
                "hosts": {
                    "self": {
                        "address": "localhost",
                        "transport": "local",
                        "service_manager": "process",
                        "run_dir": f"{WORK}/run",
                        "env": {"PYTHONPATH": REPO_IN_CONTAINER, "ORCH_LAB_TIME_SCALE": "0.1"},
                    }
                }
            }
        ),
    )
    # the server build on this host reads its scenario from here: night 2 installs a slower one
    scenario = yaml.safe_load((REPO / "experiments/lab/rtx6000/scenario.yaml").read_text())
    scenario["throughput"]["factors"][0]["multiply"] = 0.7  # 512: a margin over the noise
    box.write_file(f"{WORK}/scenario.yaml", yaml.safe_dump(scenario))
    box.write_file(
        f"{WORK}/base.yaml",
        yaml.safe_dump(
            {
                "name": "nightly-base",
                "extends": f"{REPO_IN_CONTAINER}/experiments/lab/rtx6000/perf_good.yaml",
                "service": {
                    "exec": f"python3 -m orchestrator.lab.server --scenario {WORK}/scenario.yaml"
                },
                # more tokens than the shipped probe: equal configs must stay within the 0.95 bar
                "probe": {
                    "run": "python3 -m orchestrator.lab.bench --port {port} --num-prompts 40 "
                    "--random-output-len 128"
                },
            }
        ),
    )
    box.write_file(
        f"{WORK}/nightly.yaml",
        yaml.safe_dump(
            {
                "name": "nightly",
                "base": "base.yaml",
                "host": "self",
                "matrix": {"cuda-graph-max-bs": [128, 256, 512]},
            }
        ),
    )
    # 1. install: validated, written as system units (root), enabled
    add = orch(
        box, "schedule add nightly --at 'Mon..Fri 01:30' --results results -- sweep nightly.yaml"
    )
    assert add.returncode == 0, add.stdout + add.stderr
    assert "installed orchestrator-nightly.timer in /etc/systemd/system" in add.stdout
    timers = box.ssh_run("systemctl list-timers --all --no-pager", check=True).stdout
    [row] = [ln for ln in timers.splitlines() if "orchestrator-nightly.timer" in ln]
    assert "orchestrator-nightly.service" in row
    enabled = box.ssh_run("systemctl is-enabled orchestrator-nightly.timer").stdout.strip()
    assert enabled == "enabled"
    listed = orch(box, "schedule list --json")
    assert listed.returncode == 0, listed.stderr
    [entry] = json.loads(listed.stdout)
    assert entry["name"] == "nightly" and entry["at"] == "Mon..Fri 01:30"
    assert (
        entry["next"] and entry["command"] == "/usr/bin/python3 -m orchestrator sweep nightly.yaml"
    )
    unit = box.ssh_run("systemctl cat orchestrator-nightly.service", check=True).stdout
    assert f"PYTHONPATH={REPO_IN_CONTAINER}:{DEPS_IN_CONTAINER}" in unit
    assert (
        f"WorkingDirectory={WORK}" in unit
        and "Persistent=true"
        in box.ssh_run("systemctl cat orchestrator-nightly.timer", check=True).stdout
    )
    # 2. night 1: the job runs the sweep to its table, log and report
    night1 = night(box)
    assert "cuda-graph-max-bs=128" in night1 and "cuda-graph-max-bs=512" in night1
    assert "runs: 3 executed, 0 reused" in night1
    page = box.ssh_run(f"cat {report_of(night1, '.html')}", check=True).stdout
    assert "<svg id=plot" in page and page.count("<tr><td>cuda-graph-max-bs=") == 3
    # 512 misses the bar relative to the reference (the base, 128) measured that night
    first = box.ssh_run(f"cat {report_of(night1, '.md')}", check=True).stdout
    assert "| cuda-graph-max-bs=512 | 1 | fail |" in first
    assert "Against the previous run" not in first  # nothing to compare with yet
    # 3. night 2, after a server build that makes --cuda-graph-max-bs 256 30% slower went in:
    # measured again (not reused), and the report leads with the regression
    scenario["throughput"]["factors"].append({"when": {"cuda-graph-max-bs": 256}, "multiply": 0.7})
    box.write_file(f"{WORK}/scenario.yaml", yaml.safe_dump(scenario))
    night2 = night(box, code=5)  # the regression is the job's exit status
    assert "runs: 3 executed, 0 reused" in night2
    second = box.ssh_run(f"cat {report_of(night2, '.md')}", check=True).stdout
    assert report_of(night2, ".md") != report_of(night1, ".md")
    headline = second.splitlines()[2]
    assert headline.startswith("**REGRESSION since campaign "), second[:1000]
    assert "cuda-graph-max-bs=256: metric " in headline
    assert "beyond the bar >= 0.95 * good against the previous run" in headline
    assert "| cuda-graph-max-bs=256 | 1 | fail |" in second
    table = second[second.index("## Against the previous run") :].splitlines()
    rows = {
        ln.split(" | ")[0].strip("| "): ln.split(" | ")
        for ln in table
        if ln.startswith("| cuda-graph")
    }
    assert set(rows) == {f"cuda-graph-max-bs={x}" for x in (128, 256, 512)}
    before, now, change = (rows["cuda-graph-max-bs=256"][i] for i in (1, 2, 3))
    assert float(now) < 0.8 * float(before) and change.startswith("-")
    assert rows["cuda-graph-max-bs=256"][5] == "fail"
    for config, row in rows.items():  # per config: metric and verdict, then and now
        before, now, verdicts = float(row[1]), float(row[2]), row[4:6]
        assert row[3].startswith("-" if now < before else "+"), row
        regression = now < 0.95 * before or verdicts[0] == "pass" != verdicts[1]
        assert (f"{config}: " in headline) == regression, (config, row)
        assert bool(row[6].strip(" |")) == regression
        if verdicts[0] == "pass" != verdicts[1]:
            assert f"{config}: " in headline and f"verdict pass -> {verdicts[1]}" in headline
    assert "REGRESSION since campaign" in night2  # the job's log says it too
    html = box.ssh_run(f"cat {report_of(night2, '.html')}", check=True).stdout
    assert "<p id=comparison" in html and "REGRESSION since campaign" in html
    # 4. what would fail is refused at add time; a job that fails later (its sweep file
    # deleted since) says so with the command's exit code (2)
    refused = orch(box, "schedule add broken --at daily --results results -- sweep gone.yaml")
    assert refused.returncode == 2 and "gone.yaml: sweep file not found" in refused.stderr
    assert box.ssh_run("ls /etc/systemd/system/orchestrator-broken.timer").returncode != 0
    box.ssh_run(f"cp {WORK}/nightly.yaml {WORK}/doomed.yaml", check=True)
    broken = orch(box, "schedule add broken --at daily --results results -- sweep doomed.yaml")
    assert broken.returncode == 0, broken.stdout + broken.stderr
    box.ssh_run(f"rm {WORK}/doomed.yaml", check=True)
    # (results/schedules cleared since: the job makes it again for its log)
    box.ssh_run(f"rm -rf {WORK}/results/schedules", check=True)
    failed = box.ssh_run("systemctl start orchestrator-broken.service", timeout=120)
    assert failed.returncode != 0
    show = box.ssh_run(
        "systemctl show orchestrator-broken.service -p Result -p ExecMainStatus", check=True
    ).stdout
    assert "ExecMainStatus=2" in show and "Result=exit-code" in show, show
    assert "doomed.yaml" in box.ssh_run(f"cat {WORK}/results/schedules/broken.log").stdout
    # 4. remove: units gone, the timer no longer listed
    for name in ("nightly", "broken"):
        rm = orch(box, f"schedule remove {name}")
        assert rm.returncode == 0, rm.stdout + rm.stderr
    timers = box.ssh_run("systemctl list-timers --all --no-pager", check=True).stdout
    assert "orchestrator-" not in timers
    assert box.ssh_run("ls /etc/systemd/system/orchestrator-*").returncode != 0


def night(box: SystemdHost, code: int = 0) -> str:
    """Start the timer's service now, as the timer would at 01:30; this night's log. `code`:
    the sweep's exit status (5: it found a regression, and systemd shows the job failed)."""
    before = box.ssh_run(f"cat {WORK}/results/schedules/nightly.log").stdout
    start = box.ssh_run("systemctl start orchestrator-nightly.service", timeout=300)
    show = box.ssh_run(
        "systemctl show orchestrator-nightly.service -p Result -p ExecMainStatus", check=True
    ).stdout
    log = box.ssh_run(f"cat {WORK}/results/schedules/nightly.log").stdout
    journal = box.ssh_run("journalctl -u orchestrator-nightly.service --no-pager -n 40").stdout
    assert (start.returncode == 0) == (code == 0), start.stderr + show + log[-3000:] + journal
    result = "success" if code == 0 else "exit-code"
    assert f"Result={result}" in show and f"ExecMainStatus={code}" in show, show
    assert log.startswith(before)
    return log[len(before) :]


def report_of(log: str, suffix: str) -> str:
    [path] = [
        ln.split("report: ", 1)[1]
        for ln in log.splitlines()
        if ln.startswith("report: ") and ln.endswith(suffix)
    ]
    assert path.startswith(f"{WORK}/results/reports/")
    return path
