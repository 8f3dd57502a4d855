"""What controllers leave on a cluster: their jobs, run directories and secrets files.

This controller's name (`CONTROLLER`, written into each job's comment and secrets file),
where a run's files live on the shared disk (`run_dir_of`), and the one rule that tells a
job left by a controller that stopped (`left_behind`) from one still wanted. Applied at a
campaign's start (`recover`: the jobs a dead controller of the same campaign, or of this
machine, left queued) and by `orchestrator restore` (`cancel_orphans`, then the secrets
files no queued job will read: `remove_left_secrets`).
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import threading
import uuid
from collections.abc import Callable

from orchestrator.config.hosts import Host
from orchestrator.errors import SchedulerError
from orchestrator.events import Listener, Notice
from orchestrator.execution.slurm import facts, jobscript
from orchestrator.execution.slurm.jobscript import JobFiles
from orchestrator.execution.transport import Transport

#: this controller process, as job comments name it: a job of the campaign that names
#: another controller was left by one that died (SIGKILL, lost laptop)
CONTROLLER = f"{socket.gethostname().split('.')[0]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

#: a secrets file of another machine's controller younger than this may be one that is
#: about to be submitted: `restore` leaves it (the job would start without its secrets)
FOREIGN_SECRETS_GRACE_S = 600

#: (host, campaign) pairs already recovered by this controller: once, whatever the slots
_recovered: set[tuple[str, str]] = set()
_recovered_lock = threading.Lock()


def recover(
    host: Host,
    slurm: Callable[..., object],
    t: Transport,
    campaign: str,
    emit: Listener,
) -> None:
    """Cancel the jobs that a controller which died left queued or running: this
    campaign's (their runs were never recorded: the campaign runs those variants again),
    and any other campaign's whose controller on this machine is gone (the same command
    after the hosts file changed starts a new campaign: the dead one's jobs would hold
    the GPUs until they end). Once per campaign and controller, whatever the number of
    slots. Jobs of live controllers and of other machines are left alone. `slurm` runs a
    Slurm client command on the login node (with the cluster's SLURM_CONF)."""
    if not campaign:
        return
    with _recovered_lock:
        key = (host.name, campaign)
        if key in _recovered:
            return
        _recovered.add(key)
    r = slurm("squeue -h --me -o '%i|%T|%k'", timeout=60)
    stale = []
    for job, state, comment in facts.parse_squeue_jobs(getattr(r, "stdout", "") or ""):
        info = jobscript.parse_comment(comment)
        if left_behind(info, campaign=campaign):
            stale.append((job, state, info.get("campaign", ""), info.get("run", "?")))
    if not stale:
        return
    ids = " ".join(j for j, _, _, _ in stale)
    slurm(f"scancel {ids}", timeout=60)
    # their secrets: no job will read them now
    t.run(
        "rm -f -- "
        + " ".join(
            shlex.quote(JobFiles(run_dir_of(host, camp, run)).secrets)
            for _, _, camp, run in stale
            if run != "?"
        ),
        timeout=60,
    )
    for job, state, camp, run in stale:
        again = "; its variant runs again" if camp == campaign else f" (campaign {camp})"
        emit(
            Notice(
                host=host.name,
                message=(
                    f"cancelled job {job} ({state.lower()}, run {run}) "
                    f"left by a controller that stopped{again}"
                ),
            )
        )


def _dead_here(controller: str) -> bool | None:
    """True: a controller of this machine whose process is gone; False: alive here;
    None: another machine's (or unknown)."""
    name, _, rest = controller.partition(":")
    pid = rest.partition(":")[0]
    if name != socket.gethostname().split(".")[0] or not pid.isdigit():
        return None
    return not os.path.exists(f"/proc/{pid}")


def left_behind(info: dict[str, str], *, campaign: str | None = None) -> bool:
    """Whether a queued job (its comment's words) was left by a controller that stopped:
    one of this machine whose process is gone, or, given `campaign`, an earlier controller
    of that campaign. Never this controller's own, another machine's or another tool's.
    The one rule of the campaign start's recovery and of `orchestrator restore`."""
    ctl = info.get("controller", "")
    if ctl == CONTROLLER:
        return False
    if campaign and info.get("campaign") == campaign:
        return True
    return bool(_dead_here(ctl))


def cancel_orphans(host: Host, t: Transport) -> list[str]:
    """`orchestrator restore` of a cluster: cancel the jobs that controllers on this machine
    submitted and that outlived them (their process is gone), then remove the secrets files
    that no queued job will read. Jobs of live controllers, of other machines and of other
    tools are left alone. Returns what was done."""
    opts = host.slurm
    assert opts is not None
    env = f"export SLURM_CONF={shlex.quote(opts.conf)}; " if opts.conf else ""
    r = t.run(f"{env}squeue -h --me -o '%i|%T|%k'", timeout=60)
    if not r.ok:  # without the queue, no secrets file can be known to be unread
        raise SchedulerError(
            f"{host.describe()}: squeue does not answer: {(r.stderr or r.stdout).strip()[-200:]}"
        )
    done = []
    queued: set[str] = set()
    for job, state, comment in facts.parse_squeue_jobs(r.stdout):
        words = jobscript.parse_comment(comment)
        if not left_behind(words):
            queued.add(run_dir_of(host, words.get("campaign", ""), words.get("run", "")))
            continue
        t.run(f"{env}scancel {job}", timeout=60)
        done.append(
            f"cancelled job {job} ({state.lower()}) left by a controller that "
            f"stopped ({comment.split(' ', 1)[-1]})"
        )
    return done + remove_left_secrets(host, t, queued)


def run_dir_of(host: Host, campaign: str, run_id: str) -> str:
    """The run's directory on the shared filesystem (as SlurmExecutor makes it)."""
    return f"{campaign_dir(host, campaign)}/{_safe(run_id)}"


def campaign_dir(host: Host, campaign: str) -> str:
    return f"{(host.run_dir or '/tmp/orchestrator').rstrip('/')}/{_safe(campaign or 'runs')}"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def remove_left_secrets(host: Host, t: Transport, queued: set[str]) -> list[str]:
    """Remove the `secret.env` files that no job will read: not of a queued job's run, and
    written by a controller of this machine that is gone (or by an older version, which
    did not say who wrote it; or by another machine's controller long enough ago)."""
    base = shlex.quote((host.run_dir or "/tmp/orchestrator").rstrip("/"))
    # the file name, its age and its header's controller: never a line of the secrets
    r = t.run(
        f'now=$(date +%s); for f in {base}/*/*/secret.env; do [ -f "$f" ] || continue; '
        'printf \'%s|%s|%s\\n\' "$f" "$((now - $(stat -c %Y "$f")))" '
        f'"$(sed -n \'1s/^{jobscript.SECRETS_HEADER}//p\' "$f")"; done; true',
        timeout=60,
    )
    gone = []
    for line in r.stdout.splitlines():
        path, _, rest = line.partition("|")
        age, _, controller = rest.partition("|")
        if not path.endswith("/secret.env") or path.rsplit("/", 1)[0] in queued:
            continue
        dead = _dead_here(controller) if controller else True
        if dead is False or (dead is None and age.isdigit() and int(age) < FOREIGN_SECRETS_GRACE_S):
            continue
        gone.append(path)
    if gone:
        t.run("rm -f -- " + " ".join(shlex.quote(p) for p in gone), timeout=60, check=True)
    return [
        f"removed {p} (secrets no job will read, left by a controller that stopped)" for p in gone
    ]
