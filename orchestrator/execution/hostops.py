"""Host-level operations outside a campaign: health checks and restore after a crash.

`check_host` answers "can a campaign run here?": reachable, host key, sudo, service
manager, a unit's presence, and the GPUs (and leftover processes on them) when
`nvidia-smi` exists. `leftovers`/`restore_host` find and undo what a killed controller
left behind: our drop-ins, detached servers and locks, never what a live one holds.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from orchestrator.config import builds, containers
from orchestrator.config.hosts import Host
from orchestrator.errors import OrchestratorError
from orchestrator.execution.checks import Check
from orchestrator.execution.hostlock import HostLock, LockInfo, lock_dir
from orchestrator.execution.services import ProcessManager, SystemdManager
from orchestrator.execution.services.systemd import DROPIN_NAME, STATE_NAME
from orchestrator.execution.transport import Transport


def check_host(
    host: Host, t: Transport, *, unit: str | None = None, restore_command: str | None = None
) -> list[Check]:
    """The checks, ending with what `restore` would undo here (`restore_command`: the
    command that does it, for the hint)."""
    checks: list[Check] = []
    try:
        r = t.run("id -un; uname -sr", timeout=30)
    except OrchestratorError as exc:
        return [Check("reachable", False, str(exc), exc.hint)]
    who = r.stdout.split()
    checks.append(
        Check(
            "reachable",
            True,
            f"{host.describe()} as {who[0] if who else '?'}"
            + ("" if host.is_local else "; host key verified"),
        )
    )
    if host.service_manager == "slurm":  # a login node: the jobs' nodes are the scheduler's
        from orchestrator.execution.slurm.check import slurm_checks

        return checks + slurm_checks(host, t)
    if host.sudo:
        s = t.run("sudo -n true", timeout=30)
        checks.append(
            Check(
                "sudo",
                s.ok,
                "sudo -n works" if s.ok else s.stderr.strip()[-200:],
                None if s.ok else "allow passwordless sudo for this user",
            )
        )
    if host.service_manager == "systemd":
        v = t.run("systemctl --version | head -1", timeout=30)
        checks.append(
            Check(
                "systemd",
                v.ok,
                v.stdout.strip() or v.stderr.strip()[-200:],
                None if v.ok else "use service_manager: process on this host",
            )
        )
        if unit:
            checks.append(unit_check(t, unit))
    else:
        d = host.run_dir or "/tmp/orchestrator"
        w = t.run(
            f"command -v setsid >/dev/null && mkdir -p {shlex.quote(d)} && test -w "
            f"{shlex.quote(d)}",
            timeout=30,
        )
        checks.append(
            Check(
                "process manager",
                w.ok,
                f"setsid and writable {d}"
                if w.ok
                else (w.stderr.strip() or "setsid missing or run_dir not writable"),
                None if w.ok else "install util-linux, or set run_dir",
            )
        )
    g = t.run(
        "command -v nvidia-smi >/dev/null || exit 3; nvidia-smi --query-gpu=index,name,"
        "memory.used,memory.total --format=csv,noheader; echo @@APPS; nvidia-smi "
        "--query-compute-apps=pid,process_name,used_memory --format=csv,noheader",
        timeout=60,
    )
    if g.exit_code == 3:
        checks.append(Check("gpus", None, "nvidia-smi not found (no GPU check)"))
    elif g.ok:
        gpus, _, apps = g.stdout.partition("@@APPS")
        n = len([x for x in gpus.splitlines() if x.strip()])
        busy = [x.strip() for x in apps.splitlines() if x.strip()]
        checks.append(
            Check(
                "gpus",
                True,
                f"{n} GPU(s): " + "; ".join(x.strip() for x in gpus.splitlines() if x.strip()),
            )
        )
        checks.append(
            Check(
                "gpus free",
                not busy,
                "no compute processes" if not busy else "busy: " + "; ".join(busy),
                None
                if not busy
                else "leftover processes hold GPU memory: stop them before a campaign",
            )
        )
    else:
        checks.append(Check("gpus", False, g.stderr.strip()[-200:] or "nvidia-smi failed"))
    checks += build_checks(host, t)
    return checks + leftover_checks(host, t, restore_command)


def unit_check(t: Transport, unit: str, name: str = "unit") -> Check:
    """Whether a systemd unit is installed (loaded) on the host."""
    u = t.run(f"systemctl show {shlex.quote(unit)} -p LoadState --value", timeout=30, sudo=True)
    loaded = u.stdout.strip() == "loaded"
    return Check(
        name,
        loaded,
        f"{unit}: {u.stdout.strip() or 'unknown'}",
        None if loaded else f"install {unit} on the host first",
    )


def build_checks(host: Host, t: Transport) -> list[Check]:
    """One check per entry of the host's `builds:`: a prefix holds a `bin/` directory, an
    image is pulled (docker's or podman's). A campaign refuses a missing build before its
    first start; this says so before the campaign."""
    from orchestrator.config.builds import is_path

    out = []
    for name, target in host.builds:
        q = shlex.quote(target)
        if is_path(target):
            r = t.run(f"test -d {q}/bin", timeout=30)
            ok, seen = r.ok, (f"{target}/bin" if r.ok else f"{target}/bin is no directory")
            hint = f"install the build at {target}, or correct hosts.{host.name}.builds"
        else:
            r = t.run(
                "for rt in docker podman; do command -v $rt >/dev/null || continue; "
                f"$rt image inspect --format '{{{{.Id}}}}' {q} >/dev/null 2>&1 && exit 0; done; "
                "command -v docker >/dev/null || command -v podman >/dev/null || exit 3; exit 1",
                timeout=60,
                sudo=True,
            )
            ok = True if r.ok else None if r.exit_code == 3 else False
            seen = (
                f"image {target} is pulled"
                if r.ok
                else "neither docker nor podman is installed"
                if r.exit_code == 3
                else f"image {target} is not pulled"
            )
            hint = f"pull {target} on the host, or correct hosts.{host.name}.builds"
        out.append(Check(f"build {name}", ok, seen, None if ok is not False else hint))
    return out


def leftover_checks(
    host: Host,
    t: Transport,
    restore_command: str | None = None,
) -> list[Check]:
    """What `restore` would undo, as checks: found by the same survey it acts on."""
    s = survey(host, t)
    fix = s.to_fix()
    how = restore_command or f"orchestrator restore --host {host.name}"
    checks = [
        Check(
            "leftovers",
            not fix,
            "; ".join(fix)
            if fix
            else "none of orchestrator's (no drop-in, server, container, package overlay or "
            "lock of a campaign that is gone)",
            None if not fix else f"{how} undoes them",
        )
    ]
    if s.unknown:
        checks.append(
            Check(
                "locks",
                False,
                "; ".join(
                    f"{svc} is locked by {holder.describe() if holder else '?'}, "
                    "which cannot be told alive or dead"
                    for svc, holder in s.unknown
                ),
                f"if you know it is dead, {how} --break-lock restores it",
            )
        )
    if s.live:
        checks.append(
            Check(
                "in use",
                None,
                "; ".join(
                    f"{svc}: a campaign is running: {holder.describe()}" for svc, holder in s.live
                ),
            )
        )
    return checks


def leftovers(host: Host, t: Transport) -> dict[str, list[str]]:
    """Services with our drop-in or a detached server of ours, and lock files."""
    found: dict[str, list[str]] = {"systemd": [], "process": [], "locks": []}
    if host.service_manager == "systemd":
        d = shlex.quote(host.unit_dir)
        r = t.run(
            f"ls -1 {d}/*.d/{DROPIN_NAME} {d}/*.d/{STATE_NAME} 2>/dev/null || true",
            sudo=True,
            timeout=30,
        )
        for line in r.stdout.split():
            unit = line.rsplit("/", 2)[-2][: -len(".d")]
            if unit not in found["systemd"]:
                found["systemd"].append(unit)
    run_dir = (host.run_dir or "/tmp/orchestrator").rstrip("/")
    r = t.run(f"ls -1 {shlex.quote(run_dir)}/*/pid 2>/dev/null || true", timeout=30)
    found["process"] = [line.rsplit("/", 2)[-2] for line in r.stdout.split()]
    r = t.run(
        f"ls -1 {shlex.quote(lock_dir(host))}/*.lock 2>/dev/null || true", sudo=True, timeout=30
    )
    found["locks"] = [line.rsplit("/", 1)[-1][: -len(".lock")] for line in r.stdout.split()]
    return found


def _key(service: str) -> str:
    """The name a service's lock and run directory are kept under."""
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", service)


@dataclass
class Survey:
    """What of ours is on a host, sorted by who holds it: the leftovers of controllers that
    are gone (what `restore` undoes), and what live or unknown holders keep."""

    host: Host
    t: Transport
    #: services whose lock a live controller holds (never touched), with the holder
    live: list[tuple[str, LockInfo]]
    #: services whose holder cannot be told alive or dead (restored with --break-lock)
    unknown: list[tuple[str, LockInfo | None]]
    #: locks of controllers that are gone, with the holder read (None: unreadable)
    dead_locks: list[tuple[HostLock, LockInfo | None]]
    #: the units with our drop-in (or our note of their state), not held by a live one
    units: list[str]
    #: the process services with a pid file of ours, not held by a live one
    processes: list[str]
    #: containers a run of ours started, by the service label: (sudo, runtime, id, service)
    containers: list[tuple[bool, str, str, str]] = field(default_factory=list)
    #: services whose package overlays are on the host (`RUN_DIR/overlays/SERVICE`)
    overlays: list[str] = field(default_factory=list)

    def _kept(self, *, break_lock: bool = False) -> set[str]:
        keep = {_key(svc) for svc, _ in self.live}
        if not break_lock:
            keep |= {_key(svc) for svc, _ in self.unknown}
        return keep

    def stray_containers(self, *, break_lock: bool = False) -> list[tuple[bool, str, str, str]]:
        keep = self._kept(break_lock=break_lock)
        return [c for c in self.containers if c[3] not in keep]

    def stray_overlays(self, *, break_lock: bool = False) -> list[str]:
        keep = self._kept(break_lock=break_lock)
        return [o for o in self.overlays if o not in keep]

    def managers(self, *, break_lock: bool = False) -> list[SystemdManager | ProcessManager]:
        keep = {_key(svc) for svc, _ in self.live}
        if not break_lock:
            keep |= {_key(svc) for svc, _ in self.unknown}
        out: list[SystemdManager | ProcessManager] = [
            SystemdManager(self.host, self.t, name=u) for u in self.units if _key(u) not in keep
        ]
        out += [ProcessManager(self.host, self.t, name=p) for p in self.processes if p not in keep]
        return out

    def to_fix(self) -> list[str]:
        """What `restore` (without --break-lock) would undo, in words, as the host shows it."""
        out: list[str] = []
        for m in self.managers():
            if isinstance(m, SystemdManager):
                r = self.t.run(
                    f"test -e {shlex.quote(m.dropin)} && echo dropin; systemctl show "
                    f"{shlex.quote(m.name)} -p ActiveState --value",
                    sudo=True,
                    timeout=30,
                )
                words = r.stdout.split()
                what = (
                    f"orchestrator's drop-in {m.dropin}"
                    if "dropin" in words
                    else f"orchestrator's note of how it found it ({m.state_file})"
                )
                state = words[-1] if words and words[-1] != "dropin" else "unknown"
                out.append(
                    f"{m.name} has {what}, left by a campaign that is gone (the unit is {state})"
                )
            else:
                running = m.left_over()
                out.append(
                    f"{m.name}: "
                    + ("; ".join(running) if running else f"the pid file of a server in {m.dir}")
                    + ", left by a campaign that is gone"
                )
        for sudo, runtime, cid, svc in self.stray_containers():
            out.append(
                f"container {cid} ({'sudo ' if sudo else ''}{runtime}) of {svc or '?'}, "
                "started by a campaign that is gone"
            )
        root = builds.overlays_of(self.host.run_dir)
        for svc in self.stray_overlays():
            out.append(f"the package overlays {root}/{svc} of a campaign that is gone")
        for lock, holder in self.dead_locks:
            out.append(
                f"the lock on {lock.service}"
                + (f" left by {holder.describe()}, which is gone" if holder else " (unreadable)")
            )
        return out


def survey(host: Host, t: Transport) -> Survey:
    """Our drop-ins, servers and locks on the host, each with the state of its holder (the
    one detection `restore` acts on and `hosts check` reports)."""
    left = leftovers(host, t)
    live: list[tuple[str, LockInfo]] = []
    unknown: list[tuple[str, LockInfo | None]] = []
    dead_locks: list[tuple[HostLock, LockInfo | None]] = []
    for service in left["locks"]:
        lock = HostLock(host, t, service, campaign="")
        holder = lock.read(with_age=True)
        alive = holder.alive() if holder is not None else False
        if alive and holder is not None:
            live.append((service, holder))
        elif alive is None:
            unknown.append((service, holder))
        else:
            dead_locks.append((lock, holder))
    return Survey(
        host,
        t,
        live,
        unknown,
        dead_locks,
        left["systemd"],
        left["process"],
        _containers(host, t),
        _overlays(host, t),
    )


def _containers(host: Host, t: Transport) -> list[tuple[bool, str, str, str]]:
    """The containers labelled by a run of ours, of each runtime on the host: as the SSH
    user (rootless podman), and as root where sudo is allowed (docker, a root unit)."""
    found: list[tuple[bool, str, str, str]] = []
    for sudo in (False, True) if host.sudo else (False,):
        r = t.run(containers.survey_command(), timeout=60, sudo=sudo)
        for fields in containers.parse_marked(r.stdout):
            if len(fields) >= 2:
                entry = (sudo, fields[0], fields[1], fields[2] if len(fields) > 2 else "")
                if not any(e[1:3] == entry[1:3] for e in found):
                    found.append(entry)
    return found


def _overlays(host: Host, t: Transport) -> list[str]:
    d = shlex.quote(builds.overlays_of(host.run_dir))
    return t.run(f"ls -1A {d} 2>/dev/null; true", timeout=30, sudo=True).stdout.split()


def _remove_strays(s: Survey, *, break_lock: bool) -> list[str]:
    """Remove the containers and package overlays of campaigns that are gone."""
    done: list[str] = []
    for sudo, runtime, cid, svc in s.stray_containers(break_lock=break_lock):
        q = shlex.quote(cid)
        r = s.t.run(
            f"{runtime} stop -t 10 {q} >/dev/null 2>&1; {runtime} rm -f {q} >/dev/null",
            timeout=60,
            sudo=sudo,
        )
        done.append(
            f"stopped and removed container {cid} ({runtime}) of {svc or '?'}"
            if r.ok
            else f"container {cid} ({runtime}) of {svc or '?'}: could not be removed: "
            + r.stderr.strip()[-200:]
        )
    root = builds.overlays_of(s.host.run_dir)
    for svc in s.stray_overlays(break_lock=break_lock):
        d = shlex.quote(f"{root}/{svc}")
        r = s.t.run(f"rm -rf -- {d}", timeout=300, sudo=True)
        done.append(
            f"removed the package overlays {root}/{svc}"
            if r.ok
            else f"the package overlays {root}/{svc} could not be removed: "
            + r.stderr.strip()[-200:]
        )
    return done


def restore_host(host: Host, t: Transport, *, break_lock: bool = False) -> list[str]:
    """Undo what dead controllers left: drop-ins, servers and their locks; then read each
    service back. A service whose lock a live controller holds (on this machine: its pid
    runs; from another: its lease is not expired) is refused, named, and left untouched,
    `break_lock` or not; `break_lock` only adds the services whose holder cannot be told
    alive or dead (an unreadable lock, a lease that cannot be read)."""
    done: list[str] = []
    if host.service_manager == "slurm":  # a cluster: jobs and their files, not units
        from orchestrator.execution.slurm.leftovers import cancel_orphans

        return cancel_orphans(host, t) or [
            "nothing to restore: no job or secrets file of a stopped orchestrator found"
        ]
    s = survey(host, t)
    for service, holder in s.live:
        done.append(
            f"refused: {service} belongs to a campaign that is running: "
            f"{holder.describe()}; {holder.why_alive()}. Nothing of it was "
            "touched; wait for it to end"
        )
    dead_locks = list(s.dead_locks)
    for service, holder in s.unknown:
        if break_lock:
            dead_locks.append((HostLock(host, t, service, campaign=""), holder))
        else:
            done.append(
                f"{service} kept: locked by {holder.describe() if holder else '?'}, "
                "which cannot be told alive or dead; if you know it is dead, "
                "--break-lock restores it and removes the lock"
            )
    managers = s.managers(break_lock=break_lock)
    for m in managers:
        done += m.restore()
    strays = bool(
        s.stray_containers(break_lock=break_lock) or s.stray_overlays(break_lock=break_lock)
    )
    done += _remove_strays(s, break_lock=break_lock)
    for lock, holder in dead_locks:
        lock.break_lock()
        done.append(
            f"removed the lock on {lock.service}"
            + (f" left by {holder.describe()}, which is gone" if holder else "")
        )
    for m in managers:  # read back: never "restored" on the word of the commands alone
        got = m.left_over()
        if got is None:
            done.append(f"{m.name}: could not be read back")
        elif got:
            done.append(f"{m.name}: NOT as found: " + "; ".join(got))
        else:
            done.append(f"{m.name}: read back: as found")
    if strays:  # read back too
        again = survey(host, t)
        gone = {c[2] for c in again.containers}
        left = [c for c in s.stray_containers(break_lock=break_lock) if c[2] in gone]
        left_o = [o for o in s.stray_overlays(break_lock=break_lock) if o in again.overlays]
        done.append(
            "containers and package overlays: read back: "
            + (
                "NOT as found: " + "; ".join([f"container {c[2]}" for c in left] + left_o)
                if left or left_o
                else "none left"
            )
        )
    if not done:
        done.append(
            "nothing to restore: no drop-in, server, container, package overlay or lock of "
            "orchestrator found"
        )
    return done


def service_check(s: Survey, service: str, name: str, restore_command: str | None = None) -> Check:
    """What of ours one service shows on the surveyed host (a role's unit of a deployment):
    our drop-in or note of its state, a detached server, our lock and who holds it. `ok`:
    nothing of ours; None: a running campaign holds it; False: what `restore` undoes."""
    key = _key(service)
    how = restore_command or f"orchestrator restore --host {s.host.name}"
    live = next((h for svc, h in s.live if _key(svc) == key), None)
    if live is not None:
        return Check(name, None, f"{service}: a campaign is running: {live.describe()}")
    found: list[str] = []
    if service in s.units:
        m = SystemdManager(s.host, s.t, name=service)
        r = s.t.run(f"test -e {shlex.quote(m.dropin)} && echo dropin; true", sudo=True, timeout=30)
        found.append(
            f"orchestrator's drop-in {m.dropin}"
            if "dropin" in r.stdout.split()
            else f"orchestrator's note of how it found it ({m.state_file})"
        )
    if key in s.processes:
        found.append(f"a detached server's pid file in {ProcessManager(s.host, s.t, name=key).dir}")
    unknown = next((h for svc, h in s.unknown if _key(svc) == key), False)
    if unknown is not False:
        found.append(
            f"a lock held by {unknown.describe() if unknown else '?'}, which cannot be told "
            "alive or dead"
        )
    for lock, holder in s.dead_locks:
        if _key(lock.service) == key:
            found.append(
                f"the lock left by {holder.describe()}, which is gone"
                if holder
                else "an unreadable lock"
            )
    if not found:
        return Check(name, True, f"{service}: no drop-in, server or lock of orchestrator")
    hint = f"{how} undoes them" + (" (with --break-lock)" if unknown is not False else "")
    return Check(name, False, f"{service}: " + "; ".join(found), hint)


def service_left(host: Host, t: Transport, service: str) -> list[str] | None:
    """What of ours one service still shows after a restore (empty: as found; None: it
    could not be read back)."""
    try:
        check = service_check(survey(host, t), service, service)
    except OrchestratorError:
        return None
    if check.ok is True:
        return []
    return [check.detail]
