"""Schedules: a systemd timer + service on the controller that runs an orchestrator command
(typically `sweep nightly.yaml`) at calendar times, or the crontab line where systemd is
absent. User units when not root; `Persistent=true` so a run missed while the machine was
off happens at the next boot. The job appends its output to `results/schedules/NAME.log`
and its reports land under `results/reports/` like any campaign's.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import InfraError, UsageError

PREFIX = "orchestrator-"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,60}$")


@dataclass(frozen=True)
class Scope:
    user: bool
    unit_dir: Path

    def systemctl(self, *args: str) -> list[str]:
        return ["systemctl", *(["--user"] if self.user else []), *args]


def scope() -> Scope:
    if os.geteuid() == 0:
        return Scope(False, Path(os.environ.get("ORCH_SYSTEMD_UNIT_DIR", "/etc/systemd/system")))
    base = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config"))
    return Scope(True, Path(os.environ.get("ORCH_SYSTEMD_UNIT_DIR", base / "systemd/user")))


def systemd_available() -> bool:
    """systemd is the running init (what `sd_booted()` checks)."""
    return Path("/run/systemd/system").is_dir()


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise UsageError(f"schedule name {name!r}: use letters, digits, '.', '_' and '-'")
    return name


def validate_calendar(spec: str) -> str:
    """Normalized OnCalendar= expression, checked by `systemd-analyze calendar`."""
    try:
        r = subprocess.run(
            ["systemd-analyze", "calendar", spec], capture_output=True, text=True, timeout=30
        )
    except FileNotFoundError:
        raise UsageError(
            "systemd-analyze not found: cannot validate --at",
            hint="install systemd, or use cron with the printed line",
        ) from None
    if r.returncode != 0:
        msg = (r.stderr or r.stdout).strip().splitlines()
        raise UsageError(
            f"--at {spec!r} is not a systemd calendar expression: {msg[-1] if msg else 'rejected'}",
            hint="e.g. 'Mon..Fri 01:30', 'daily', '*-*-* 02:00:00'",
        )
    m = re.search(r"Normalized form:\s*(.+)", r.stdout)
    return m[1].strip() if m else spec


_DOW = {"mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6, "sun": 0}


def _dow_range(first: str, last: str) -> str:
    """'mon'..'fri' -> '1-5'. A range that reaches Sunday ('Sat..Sun') is not an ascending
    cron range in cron's Sunday=0 numbering ('6-0' is rejected): it becomes a list."""
    week = list(_DOW)  # mon .. sun
    i, j = week.index(first), week.index(last)
    days = [_DOW[week[(i + k) % 7]] for k in range((j - i) % 7 + 1)]
    if days == list(range(days[0], days[0] + len(days))):
        return f"{days[0]}-{days[-1]}" if len(days) > 1 else str(days[0])
    return ",".join(str(d) for d in days)


def cron_line(
    spec: str,
    command: list[str],
    *,
    workdir: Path | None = None,
    log: Path | None = None,
    env: dict[str, str] | None = None,
) -> str | None:
    """The crontab equivalent of simple calendar specs ('Mon..Fri 01:30', 'daily', '02:00'),
    with the same settings as the systemd units (`env`: ORCH_RESULTS, ORCH_HOSTS, ...)."""
    s = spec.strip().lower()
    if s == "daily":
        minute, hour, dow = "0", "0", "*"
    else:
        m = re.fullmatch(
            r"(?:([a-z]{3})(?:\.\.([a-z]{3}))?((?:,[a-z]{3})*)\s+)?(\d{1,2}):(\d{2})"
            r"(?::00)?",
            s,
        )
        if not m or int(m[4]) > 23 or int(m[5]) > 59:
            return None
        hour, minute = str(int(m[4])), str(int(m[5]))
        if m[1] is None:
            dow = "*"
        elif m[2]:
            if m[1] not in _DOW or m[2] not in _DOW:
                return None
            dow = _dow_range(m[1], m[2])
        else:
            days = [m[1], *[d for d in m[3].split(",") if d]]
            if any(d not in _DOW for d in days):
                return None
            dow = ",".join(str(_DOW[d]) for d in days)
    line = shlex.join(command)
    if env:
        line = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + line
    if log is not None:
        line = f"mkdir -p {shlex.quote(str(log.parent))} && {line} >> {shlex.quote(str(log))} 2>&1"
    if workdir is not None:
        line = f"cd {shlex.quote(str(workdir))} && {line}"
    # cron turns an unescaped % into a newline (the rest becomes the command's stdin)
    return f"{minute} {hour} * * {dow} " + line.replace("%", "\\%")


def job_env(results: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the job needs to find what `schedule add` was given: the results
    directory, and the hosts file and Python path of this shell (`extra`: e.g. the path of
    the file holding the notification URL; never a secret itself: this is stored in the
    clear)."""
    env = {"ORCH_RESULTS": str(results)}
    for key in ("PYTHONPATH", "ORCH_HOSTS"):
        if os.environ.get(key):
            env[key] = os.environ[key]
    return env | dict(extra or {})


def job_command(args: list[str]) -> list[str]:
    """How the job calls this program again: the same interpreter, as a module."""
    if not args:
        raise UsageError(
            "nothing to schedule",
            hint="e.g. schedule add nightly --at 'Mon..Fri "
            "01:30' -- sweep experiments/sweeps/rtx6000_cuda_graph.yaml",
        )
    return [sys.executable, "-m", "orchestrator", *args]


def render_units(
    name: str,
    calendar: str,
    command: list[str],
    *,
    workdir: Path,
    results: Path,
    env_extra: dict[str, str] | None = None,
) -> dict[str, str]:
    log = results / "schedules" / f"{name}.log"
    env = [f"{k}={v}" for k, v in job_env(results, env_extra).items()]
    # The shell makes the log's directory first: `StandardOutput=append:` would need it to
    # exist before any command of the unit starts (systemd fails such a job with
    # 209/STDOUT), and results/ may have been cleared since the schedule was added.
    script = (
        f"mkdir -p {shlex.quote(str(log.parent))} && exec {shlex.join(command)} "
        f">> {shlex.quote(str(log))} 2>&1"
    )
    service = "\n".join(
        [
            "# written by `orchestrator schedule add`; remove with `orchestrator schedule remove "
            f"{name}`",
            "[Unit]",
            f"Description=orchestrator scheduled job {name}",
            "[Service]",
            "Type=oneshot",
            f"WorkingDirectory={workdir}",
            *[f"Environment={env_assignment(*e.split('=', 1))}" for e in env],
            f"# command: {shlex.join(command)}",
            f"ExecStart=/bin/sh -c {_sd_quote(script)}",
            "",
        ]
    )
    timer = "\n".join(
        [
            f"# written by `orchestrator schedule add` for {shlex.join(command[3:])}",
            "[Unit]",
            f"Description=orchestrator schedule {name}",
            "[Timer]",
            f"OnCalendar={calendar}",
            "Persistent=true",
            f"Unit={PREFIX}{name}.service",
            "[Install]",
            "WantedBy=timers.target",
            "",
        ]
    )
    return {f"{PREFIX}{name}.service": service, f"{PREFIX}{name}.timer": timer}


def env_assignment(key: str, value: str) -> str:
    # Environment= expands specifiers but not `$`: quote it like a drop-in does
    from orchestrator.execution.services.systemd import env_assignment as quoted

    return quoted(key, value)


def _sd_quote(word: str) -> str:
    from orchestrator.execution.services.systemd import systemd_quote

    return systemd_quote(word)


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def add(
    name: str,
    calendar: str,
    args: list[str],
    *,
    workdir: Path,
    results: Path,
    env: dict[str, str] | None = None,
) -> dict:
    """Install the schedule: a systemd timer, or (without systemd) a line in the user's
    crontab. The command was checked by the caller (the CLI knows its own parser)."""
    check_name(name)
    command = job_command(args)
    normalized = validate_calendar(calendar)
    if not systemd_available():
        results = results.resolve()
        log = results / "schedules" / f"{name}.log"
        line = cron_line(calendar, command, workdir=workdir, log=log, env=job_env(results, env))
        if line is None:
            raise UsageError(
                f"--at {calendar!r} has no crontab form, and systemd is not "
                "running here: nothing was scheduled",
                hint="use a time of day with optional weekdays, e.g. "
                "'Mon..Fri 01:30', '02:00' or 'daily'",
            )
        crontab_install(name, calendar, line, shlex.join(command))
        return {
            "installed": True,
            "cron": line,
            "calendar": normalized,
            "where": f"the crontab of {_user()}",
            "log": str(log),
            "cron_running": cron_running(),
        }
    sc = scope()
    sc.unit_dir.mkdir(parents=True, exist_ok=True)
    units = render_units(
        name, calendar, command, workdir=workdir, results=results.resolve(), env_extra=env
    )
    for fname, text in units.items():
        path = sc.unit_dir / fname
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    for cmd in (
        sc.systemctl("daemon-reload"),
        sc.systemctl("enable", "--now", f"{PREFIX}{name}.timer"),
    ):
        r = _run(cmd)
        if r.returncode != 0:
            raise UsageError(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return {
        "installed": True,
        "calendar": normalized,
        "unit_dir": str(sc.unit_dir),
        "timer": f"{PREFIX}{name}.timer",
        "log": str(results / "schedules" / f"{name}.log"),
    }


def remove(name: str) -> list[str]:
    check_name(name)
    if not systemd_available():
        return crontab_remove(name)
    sc = scope()
    done: list[str] = []
    timer = f"{PREFIX}{name}.timer"
    _run(sc.systemctl("disable", "--now", timer))
    for fname in (timer, f"{PREFIX}{name}.service"):
        path = sc.unit_dir / fname
        if path.exists():
            path.unlink()
            done.append(f"removed {path}")
    if not done:
        raise UsageError(
            f"no schedule named {name!r} in {sc.unit_dir}",
            hint="`orchestrator schedule list` shows them",
        )
    _run(sc.systemctl("daemon-reload"))
    return done


def listing() -> list[dict[str, str]]:
    if not systemd_available():
        return crontab_listing()
    sc = scope()
    out = []
    for path in sorted(sc.unit_dir.glob(f"{PREFIX}*.timer")):
        name = path.name[len(PREFIX) : -len(".timer")]
        text = path.read_text()
        cal = re.search(r"^OnCalendar=(.*)$", text, re.M)
        svc = sc.unit_dir / f"{PREFIX}{name}.service"
        text = svc.read_text() if svc.exists() else ""
        cmd = re.search(r"^# command: (.*)$", text, re.M) or re.search(
            r"^ExecStart=(.*)$", text, re.M
        )
        r = _run(sc.systemctl("show", path.name, "-p", "NextElapseUSecRealtime", "--value"))
        out.append(
            {
                "name": name,
                "at": cal[1] if cal else "?",
                "next": r.stdout.strip(),
                "command": cmd[1] if cmd else "?",
            }
        )
    return out


# ---------------------------------------------------------------------------- crontab

#: the comment line above each job of ours in a crontab: name, calendar, command
_MARK = "# orchestrator schedule "
_MARK_RE = re.compile(r"^# orchestrator schedule (\S+) at (.*?) runs: (.*)$")


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def _crontab(consequence: str = "nothing was scheduled") -> str:
    found = shutil.which("crontab")
    if found is None:
        raise CronMissing(
            f"systemd is not running here and `crontab` is not installed: {consequence}",
            hint="install cron (Debian: apt-get install cron) and run this again",
        )
    return found


#: the process names of the cron daemons (Debian's cron, cronie, busybox, fcron, dcron)
CRON_DAEMONS = frozenset({"cron", "crond", "fcron", "dcron"})


def cron_running(proc: Path = Path("/proc")) -> bool:
    """Whether a cron daemon runs here: a crontab line does nothing without one (a
    container or a fresh machine often has `crontab` installed and no daemon started)."""
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
        except OSError:
            continue  # gone since the listing, or not ours to read
        if name in CRON_DAEMONS:
            return True
    return False


class CronMissing(InfraError):
    """Neither systemd nor cron on the controller: no way to run anything on a calendar."""


def _crontab_read(consequence: str = "nothing was scheduled") -> list[str]:
    r = _run([_crontab(consequence), "-l"])
    if r.returncode != 0:
        if "no crontab" in (r.stderr + r.stdout).lower():
            return []
        raise InfraError(f"crontab -l failed: {(r.stderr or r.stdout).strip()}")
    return r.stdout.splitlines()


def _crontab_write(lines: list[str]) -> None:
    """Install `lines` as the user's crontab; none left (our last job removed from a crontab
    that held nothing else): remove the crontab, as it was before we added one."""
    if not any(line.strip() for line in lines):
        r = _run([_crontab(), "-r"])
        if r.returncode != 0 and "no crontab" not in (r.stderr + r.stdout).lower():
            raise InfraError(f"crontab -r failed: {(r.stderr or r.stdout).strip()}")
        return
    text = "".join(line + "\n" for line in lines)
    r = subprocess.run([_crontab(), "-"], input=text, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise InfraError(f"crontab - failed: {(r.stderr or r.stdout).strip()}")


def _without(lines: list[str], name: str) -> tuple[list[str], bool]:
    """The crontab without our job `name` (its mark line and the job line after it)."""
    out: list[str] = []
    found = False
    skip_next = False
    for line in lines:
        if skip_next:
            skip_next = False
            continue
        m = _MARK_RE.match(line)
        if m and m[1] == name:
            found = skip_next = True
            continue
        out.append(line)
    return out, found


def crontab_install(name: str, calendar: str, line: str, command: str) -> None:
    lines, _ = _without(_crontab_read(), name)  # `add` of an existing name replaces it
    lines += [f"{_MARK}{name} at {calendar} runs: {command}", line]
    _crontab_write(lines)


def crontab_remove(name: str) -> list[str]:
    lines, found = _without(_crontab_read("no schedule to remove"), name)
    if not found:
        raise UsageError(
            f"no schedule named {name!r} in the crontab of {_user()}",
            hint="`orchestrator schedule list` shows them",
        )
    _crontab_write(lines)
    return [f"removed {name} from the crontab of {_user()}"]


def crontab_listing() -> list[dict[str, str]]:
    out = []
    lines = _crontab_read("no schedules")
    for i, line in enumerate(lines):
        m = _MARK_RE.match(line)
        if m and i + 1 < len(lines):
            out.append(
                {"name": m[1], "at": m[2], "next": "", "command": m[3], "cron": lines[i + 1]}
            )
    return out
