"""Campaigns that outlive their terminal: `--detach` and `runs --follow ID`.

`--detach` (on `run`, `bisect`, `sweep`) starts the same command again in a session of
its own (`setsid`: no controlling terminal, so a closed terminal or a dropped SSH session
sends it no SIGHUP), stdin from /dev/null, its output to a log file under the results
directory, with this process's environment (secrets from the environment travel that way,
never on a command line). It waits until the campaign is recorded, prints its id, the log
and how to follow it, and returns. A command that fails before it records a campaign (a
usage or config error) is reported with its own output and exit code.

`runs --follow ID` shows the campaign's progress until it ends: the detached log as it
grows (or, for a campaign started in a terminal, its runs as they are recorded), then its
status, and exits with the campaign's exit code. Ctrl-C stops following only.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from rich.markup import escape

from orchestrator.cli import common
from orchestrator.cli.live import verdict_text
from orchestrator.cli.output import console, err_console
from orchestrator.errors import CampaignRef, OrchestratorError, UsageError
from orchestrator.execution.hostlock import me
from orchestrator.execution.localproc import pid_alive
from orchestrator.store.store import CampaignRow, Store

#: how long `--detach` waits for the campaign to be recorded
START_WAIT_S = 120.0
#: how often `--follow` looks again
FOLLOW_POLL_S = 1.0
#: how long `--follow` waits, after the campaign's status has left "running", for its command
#: to finish printing (its answer is printed after the status is recorded)
FINISH_WAIT_S = 30.0
#: the exit code of each campaign status, when the campaign did not record its own
STATUS_EXIT = {
    "found": 0,
    "done": 0,
    "incomplete": 1,
    "endpoints": 1,
    "interrupted": 130,
    "refused": 3,
    "error": 2,
    "dead": 3,
}


def add_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--detach",
        action="store_true",
        help="keep running after this terminal is gone: run in a session of its "
        "own, output to a log under the results directory; prints the "
        "campaign id and how to follow it (runs --follow ID)",
    )


def detach(args: argparse.Namespace) -> int:
    """Start this command line again, detached; print the campaign it records."""
    argv = [a for a in getattr(args, "argv", sys.argv[1:]) if a != "--detach"]
    results = Path(getattr(args, "results", None) or "results")
    logs = results / "detached"
    made = [d for d in (results, logs) if not d.exists()]
    logs.mkdir(parents=True, exist_ok=True, mode=0o700)
    log = logs / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}.log"
    env = os.environ | {common.LOG_ENV: str(log.resolve()), "PYTHONUNBUFFERED": "1"}
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # the log may hold
    try:  # a server's arguments: the user's only, like the store
        child = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *argv],
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(fd)
    cid = _await_campaign(results, child)
    if cid is None:
        code = child.poll()
        text = log.read_text(errors="replace") if log.exists() else ""
        err_console().print(escape(text.rstrip()), highlight=False)
        if code is not None:  # it said all it had to (above): no log nor directory for it
            _remove_made(log, made)
        if code is None:
            err_console().print(
                f"the detached command (pid {child.pid}) recorded no campaign "
                f"in {START_WAIT_S:.0f}s; it still runs; output: {log}",
                highlight=False,
            )
            return 1
        return code
    follow, resume = commands(args, cid)
    stop = f"kill {child.pid}"
    c = console()
    if getattr(args, "json", False):  # stdout is one JSON document (the campaign's goes
        import json  # to the log)

        c.print_json(
            json.dumps(
                {
                    "campaign": cid,
                    "status": "detached",
                    "pid": child.pid,
                    "log": str(log),
                    "follow": follow,
                    "stop": stop,
                    "resume": resume,
                }
            )
        )
        return 0
    c.print(
        f"campaign {cid} runs detached (pid {child.pid}); it keeps running when this "
        "terminal closes",
        highlight=False,
    )
    c.print(f"output: {log}", highlight=False)
    c.print(f"follow it with: {follow}", highlight=False)
    if resume is not None:
        c.print(
            f"stop it with: {stop}  (restores the hosts; then resume it with: {resume})",
            highlight=False,
        )
    else:  # one run is no search to go on with: it is started again, as a new run
        c.print(
            f"stop it with: {stop}  (restores the host; the run is recorded as interrupted)",
            highlight=False,
        )
    return 0


def commands(args: argparse.Namespace, cid: str) -> tuple[str, str | None]:
    """The commands a detached campaign is followed and resumed with (None: a single run,
    which nothing resumes), each with only the options its own command takes: `runs` reads
    the results and needs no hosts file."""
    follow = f"orchestrator runs --follow {cid}" + common.results_option(args)
    kind = getattr(args, "command", None)
    if kind not in ("bisect", "sweep"):
        return follow, None
    return follow, common.resume_command(args, CampaignRef(kind, cid))


def _remove_made(log: Path, made: list[Path]) -> None:
    """Remove the log of a command that recorded nothing, and the directories made for it
    (when nothing else went into them)."""
    try:
        log.unlink()
        for d in reversed(made):
            d.rmdir()
    except OSError:
        pass  # something else is there now: kept


def _await_campaign(results: Path, child: subprocess.Popen[bytes]) -> str | None:
    """The campaign the child records (found by its pid), or None when it exits first or
    records none in time."""
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        exited = child.poll() is not None
        cid = _campaign_of(results, child.pid)
        if cid is not None or exited:
            return cid
        time.sleep(0.2)
    return None


def _campaign_of(results: Path, pid: int) -> str | None:
    if not (results / "orchestrator.db").exists():
        return None
    try:
        store = Store(results, readonly=True)
    except OrchestratorError:
        return None
    try:
        for camp in store.campaigns(20):
            if (camp.controller or {}).get("pid") == pid:
                return camp.id
    finally:
        store.close()
    return None


def exit_code_of(camp: CampaignRow, status: str) -> int:
    """The exit code the campaign's command returned (recorded), or its status's."""
    code = (camp.controller or {}).get("exit_code")
    return code if isinstance(code, int) else STATUS_EXIT.get(status, 1)


def controller_alive(camp: CampaignRow) -> bool | None:
    """Whether the process that runs the campaign still runs: None when it cannot be told
    (another machine's, or none recorded)."""
    ctl = camp.controller or {}
    if ctl.get("owner") != me() or not isinstance(ctl.get("pid"), int):
        return None
    return pid_alive(ctl["pid"])


def status_of(camp: CampaignRow) -> str:
    """The campaign's status as it stands: a `running` one whose controller's process is
    gone from this machine is `dead` (killed, lost power); one run from another machine
    cannot be told and stays `running`."""
    if camp.status == "running" and controller_alive(camp) is False:
        return "dead"
    return camp.status


def follow(args: argparse.Namespace, max_wait_s: float) -> int:
    """Show a campaign's progress until it ends; its exit code."""
    store = common.store(args, readonly=True)
    camp = store.campaign(args.follow)
    as_json = bool(getattr(args, "json", False))  # then: one JSON document when it ends
    c = console()
    log_path = (camp.controller or {}).get("log")
    log = Path(log_path) if isinstance(log_path, str) and Path(log_path).exists() else None
    if not as_json:
        c.print(
            f"following campaign {camp.id} ({camp.kind}; "
            + (f"output: {log}" if log else "its recorded runs")
            + "); Ctrl-C stops "
            "following only",
            highlight=False,
        )
    offset, seen = 0, set()
    deadline = time.monotonic() + max_wait_s
    status = status_of(camp)
    try:
        while True:
            camp = store.campaign(camp.id)
            status = status_of(camp)
            if as_json:
                pass  # one document, when it ends
            elif log is not None:
                offset = _print_new(log, offset)
            else:
                for r in store.runs(camp.id):
                    if r.id not in seen:
                        seen.add(r.id)
                        c.print(
                            f"{r.seq:>3}. {verdict_text(r.verdict)} {escape(r.label)}"
                            f"  {escape(str(r.signature or ''))} {r.id}",
                            highlight=False,
                        )
            if status != "running":
                if log is not None:  # its answer is printed to the log after the status
                    camp = _finished(store, camp)
                    if not as_json:
                        _print_new(log, offset)
                code = exit_code_of(camp, status)
                if as_json:
                    return _followed_json(store, camp, status, code, log, "ended")
                c.print(f"campaign {camp.id} ended: {status} (exit {code})", highlight=False)
                return code
            if time.monotonic() >= deadline:
                if as_json:
                    return _followed_json(
                        store, camp, status, 1, log, f"still running after {max_wait_s:.0f}s"
                    )
                c.print(
                    f"campaign {camp.id} still running after {max_wait_s:.0f}s; stopped following",
                    highlight=False,
                )
                return 1
            time.sleep(FOLLOW_POLL_S)
    except KeyboardInterrupt:
        if as_json:
            return _followed_json(
                store,
                camp,
                status,
                130,
                log,
                "stopped following (Ctrl-C); the campaign keeps running",
            )
        c.print(f"\nstopped following; campaign {camp.id} keeps running", highlight=False)
        return 130


def _followed_json(
    store: Store, camp: CampaignRow, status: str, code: int, log: Path | None, following: str
) -> int:
    """`runs --follow ID --json`: the followed campaign as one JSON document (its status,
    its exit code, its runs and answer, its output's log), and that exit code."""
    import json

    runs = [
        {
            "id": r.id,
            "label": r.label,
            "host": r.host,
            "verdict": r.verdict.value,
            "signature": str(r.signature or ""),
            "duration": r.duration,
        }
        for r in store.runs(camp.id)
    ]
    console().print_json(
        json.dumps(
            {
                "campaign": camp.id,
                "kind": camp.kind,
                "status": status,
                "exit_code": code,
                "following": following,
                "log": str(log) if log else None,
                "runs": runs,
                "answer": camp.answer,
            }
        )
    )
    return code


def _finished(store: Store, camp: CampaignRow) -> CampaignRow:
    """The campaign once its command has finished: it records its exit code after printing
    its answer, or its process is gone (killed: it records nothing) or not on this machine
    (nothing to wait for), or FINISH_WAIT_S."""
    deadline = time.monotonic() + FINISH_WAIT_S
    while time.monotonic() < deadline:
        ctl = camp.controller or {}
        if "exit_code" in ctl or ctl.get("pid") == os.getpid() or not controller_alive(camp):
            return camp
        time.sleep(0.2)
        camp = store.campaign(camp.id)
    return camp


def _print_new(log: Path, offset: int) -> int:
    with log.open("rb") as f:
        f.seek(offset)
        data = f.read()
    if data:
        sys.stdout.write(data.decode(errors="replace"))
        sys.stdout.flush()
    return offset + len(data)


def check_follow_args(args: argparse.Namespace) -> None:
    if args.campaign or args.campaigns:
        raise UsageError("--follow ID takes no --campaign/--campaigns")


__all__ = [
    "add_option",
    "commands",
    "controller_alive",
    "detach",
    "exit_code_of",
    "follow",
    "status_of",
]
