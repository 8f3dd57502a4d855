"""One orchestrator per unit per host: a lock file on the host.

The lock records who holds it (user@controller, campaign, pid, time). It is created
atomically with the shell's noclobber, so two controllers racing cannot both win. A lock
held by the same campaign (a resumed campaign after a crash) is taken over; any other
holder is reported with how to clear a stale lock.

Whether a holder still lives: on the same machine, its pid; from another machine, its
lease. The holder renews the lease by touching the lock file (`LEASE_RENEW_S`); the file's
age is read with the host's own clock (mtime against `date`), so the controllers' clocks
never need to agree. A lock not renewed for `LEASE_S` belongs to a dead controller.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shlex
import socket
import threading
import time
from dataclasses import dataclass

from orchestrator.config.hosts import Host
from orchestrator.errors import LockError
from orchestrator.execution.localproc import pid_alive
from orchestrator.execution.transport.base import Transport

#: a lock not renewed for this long belongs to a controller that is gone
LEASE_S = 600.0
#: how often a holder renews its lease (well within LEASE_S, whatever a run is doing)
LEASE_RENEW_S = 60.0


@dataclass(frozen=True)
class LockInfo:
    owner: str
    campaign: str
    pid: int
    since: float
    #: seconds since the holder last renewed the lock, by the host's clock (None: unknown)
    age_s: float | None = None

    def alive(self) -> bool | None:
        """Whether the holder still runs: True, False, or None when nothing tells."""
        if self.owner == me():
            return pid_alive(self.pid) if self.pid > 0 else None
        if self.age_s is None:
            return None
        return self.age_s < LEASE_S

    def why_alive(self) -> str:
        if self.owner == me():
            return f"its process {self.pid} runs on this machine"
        return (
            f"it renewed its lease {self.age_s:.0f}s ago (a lease lasts {LEASE_S:.0f}s)"
            if self.age_s is not None
            else "its lease cannot be read"
        )

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

        self._renewer: threading.Thread | None = None
        self._stop_renewing = threading.Event()

    def read(self, *, with_age: bool = False) -> LockInfo | None:
        """Who holds the lock (None: nobody); `with_age`: also how long ago its lease was
        renewed (one more command, for deciding whether another machine's holder lives)."""
        text = self.t.read_file(self.path, sudo=True)
        if text is None:
            return None
        try:
            d = json.loads(text)
            info = LockInfo(str(d["owner"]), str(d["campaign"]), int(d["pid"]), float(d["since"]))
        except (ValueError, KeyError, TypeError):
            info = LockInfo("unknown (unreadable lock file)", "?", 0, 0.0)
        if with_age:
            r = self.t.run(
                f"stat -c %Y {shlex.quote(self.path)} && date +%s", sudo=True, timeout=20
            )
            nums = r.stdout.split()
            if r.ok and len(nums) == 2 and all(n.isdigit() for n in nums):
                info = LockInfo(
                    info.owner,
                    info.campaign,
                    info.pid,
                    info.since,
                    age_s=max(float(nums[1]) - float(nums[0]), 0.0),
                )
        return info

    def acquire(self) -> None:
        info = {"owner": me(), "campaign": self.campaign, "pid": os.getpid(), "since": time.time()}
        body = shlex.quote(json.dumps(info))
        p = shlex.quote(self.path)
        d = shlex.quote(lock_dir(self.host))
        r = self.t.run(
            f"umask 077 && mkdir -p {d} && (set -C; printf '%s\\n' {body} > {p}) 2>/dev/null",
            sudo=True,
            timeout=20,
        )
        if r.ok:
            self._held()
            return
        holder = self.read()
        if holder is not None and holder.owner != me():  # another machine's: its lease
            holder = self.read(with_age=True) or holder
        mine = holder is not None and holder.owner == me() and holder.pid == os.getpid()
        if (
            holder is not None
            and holder.campaign == self.campaign
            and (mine or holder.alive() is False)
        ):
            # our own campaign, resumed after the controller died: take the lock over
            self.t.write_file(self.path, json.dumps(info) + "\n", sudo=True)
            self._held()
            return
        who = holder.describe() if holder else "another orchestrator"
        alive = holder.alive() if holder else None
        restore = f"orchestrator restore --host {self.host.name}"
        if alive is False:
            stale = (
                " The holder's process is gone from this machine"
                if holder.owner == me()
                else f" The holder has not renewed its lease for {holder.age_s or 0:.0f}s"
            ) + ": the lock is stale."
            hint = f"{restore} (undoes what that campaign left and removes its lock)"
        elif alive is None:
            stale = " Whether the holder still runs cannot be told."
            hint = (
                f"wait for that campaign; if you know it is dead: {restore} --break-lock "
                f"(restores {self.service} and removes {self.path})"
            )
        else:
            stale = (
                " That campaign is running now: the same campaign cannot run twice."
                if holder.campaign == self.campaign
                else f" It is running ({holder.why_alive()})."
            )
            hint = "wait for that campaign to end (restore refuses to touch a live one)"
        err = LockError(
            f"{self.host.describe()}: {self.service} is locked by {who}.{stale}", hint=hint
        )
        err.holder_campaign = holder.campaign if holder else None
        raise err

    def _held(self) -> None:
        """Hold the lock, and renew its lease from a thread of its own until released (a
        run's longest steps, a probe or a slow start, run for many minutes)."""
        self.held = True
        self._stop_renewing.clear()
        self._renewer = threading.Thread(
            target=self._renew, daemon=True, name=f"lease-{self.service}"
        )
        self._renewer.start()

    def _renew(self) -> None:
        while not self._stop_renewing.wait(LEASE_RENEW_S):
            try:
                self.t.run(f"touch -c {shlex.quote(self.path)}", sudo=True, timeout=20)
            except Exception:  # noqa: BLE001 (a lost link: the next renewal tries again)
                continue

    def release(self) -> None:
        self._stop_renewing.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join(timeout=30)  # a renewal in flight: not after the release
            self._renewer = None
        if self.held:
            self.t.run(f"rm -f {shlex.quote(self.path)}", sudo=True, timeout=20)
            self.held = False

    def break_lock(self) -> LockInfo | None:
        holder = self.read()
        self.t.run(f"rm -f {shlex.quote(self.path)}", sudo=True, timeout=20)
        return holder
