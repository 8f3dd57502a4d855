"""One orchestrator per unit per host: a lock file on the host.

The lock records who holds it (user@controller, campaign, pid, time). It is created
atomically with the shell's noclobber, so two controllers racing cannot both win. A lock
held by the same campaign (a resumed campaign after a crash) is taken over; any other
holder is reported with how to clear a stale lock.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shlex
import socket
import time
from dataclasses import dataclass

from orchestrator.config.hosts import Host
from orchestrator.errors import LockError
from orchestrator.execution.localproc import pid_alive
from orchestrator.execution.transport.base import Transport


@dataclass(frozen=True)
class LockInfo:
    owner: str
    campaign: str
    pid: int
    since: float

    def describe(self) -> str:
        age = time.time() - self.since
        return (
            f"{self.owner} (campaign {self.campaign}, pid {self.pid}, "
            f"since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.since))}, "
            f"{age / 60:.0f} min ago)"
        )


def lock_dir(host: Host) -> str:
    return (host.run_dir or "/tmp/orchestrator").rstrip("/") + "/locks"


def lock_path(host: Host, service: str) -> str:
    return f"{lock_dir(host)}/{re.sub(r'[^A-Za-z0-9_.@-]', '_', service)}.lock"


def me() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


class HostLock:
    def __init__(self, host: Host, transport: Transport, service: str, campaign: str) -> None:
        self.host = host
        self.t = transport
        self.service = service
        self.campaign = campaign
        self.path = lock_path(host, service)
        self.held = False

    def read(self) -> LockInfo | None:
        text = self.t.read_file(self.path, sudo=True)
        if text is None:
            return None
        try:
            d = json.loads(text)
            return LockInfo(str(d["owner"]), str(d["campaign"]), int(d["pid"]), float(d["since"]))
        except (ValueError, KeyError, TypeError):
            return LockInfo("unknown (unreadable lock file)", "?", 0, 0.0)

    def acquire(self) -> None:
        info = {"owner": me(), "campaign": self.campaign, "pid": os.getpid(), "since": time.time()}
        body = shlex.quote(json.dumps(info))
        p = shlex.quote(self.path)
        d = shlex.quote(lock_dir(self.host))
        r = self.t.run(f"umask 077 && mkdir -p {d} && (set -C; printf '%s\\n' {body} > {p}) "
                       "2>/dev/null",
                       sudo=True, timeout=20)  # fmt: skip
        if r.ok:
            self.held = True
            return
        holder = self.read()
        live = holder is not None and holder.owner == me() and holder.pid != os.getpid() \
            and pid_alive(holder.pid)  # fmt: skip
        if holder is not None and holder.campaign == self.campaign and not live:
            # our own campaign, resumed after the controller died: take the lock over
            self.t.write_file(self.path, json.dumps(info) + "\n", sudo=True)
            self.held = True
            return
        who = holder.describe() if holder else "another orchestrator"
        stale = ""
        if holder and holder.owner == me() and not pid_alive(holder.pid):
            stale = " The holder's process is gone from this machine: the lock is stale."
        elif live and holder.campaign == self.campaign:
            stale = " That campaign is running now: the same campaign cannot run twice."
        raise LockError(
            f"{self.host.describe()}: {self.service} is locked by {who}.{stale}",
            hint=(
                f"wait for that campaign, or if it is dead: orchestrator restore --host "
                f"{self.host.name} --break-lock (restores {self.service} and removes {self.path})"
            ),
        )

    def release(self) -> None:
        if self.held:
            self.t.run(f"rm -f {shlex.quote(self.path)}", sudo=True, timeout=20)
            self.held = False

    def break_lock(self) -> LockInfo | None:
        holder = self.read()
        self.t.run(f"rm -f {shlex.quote(self.path)}", sudo=True, timeout=20)
        return holder


