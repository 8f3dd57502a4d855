"""A real single-node Slurm cluster on this machine: the lab's and the tests' scheduler.

Debian's Slurm 22.05 (`slurmctld`, `slurmd`) and `munge`, run without systemd from one
private state directory: munged on its own socket with its own key, a `slurm.conf` with
its own ports, state, spool, pid and log files (`ProctrackType=proctrack/linuxproc`,
`TaskPlugin=task/none`, `SelectType=select/cons_tres`, no accounting), and a `gres.conf`
declaring 8 GPUs backed by placeholder files (`Name=gpu File=<dir>/gpus/nvidia[0-7]`).
The node declares more CPUs than the machine has (`SlurmdParameters=config_overrides`):
lab jobs mostly wait on a simulated server, and several must fit at once.

With `nodes=N` (N > 1) the cluster has N nodes on this one machine (`<host>-1` ..
`<host>-N`): one slurmd each, on a port of its own (Slurm's `-N NODENAME`, built with
multiple-slurmd support as Debian's is), so a job of `--nodes N` runs one task on each,
as on a real cluster.

Clients reach it with `SLURM_CONF=<dir>/slurm.conf`. `orchestrator lab up --slurm` and
the test fixtures use this same code; every daemon is found again by its pid file and
checked to be ours (its command line names our config) before it is stopped.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import InfraError
from orchestrator.execution.localproc import pid_alive
from orchestrator.lab.sshd import free_port

CLUSTER = "orchlab"
PARTITION = "lab"
GPUS = 8
NODE_CPUS = 16  # declared, not real (config_overrides): lab jobs wait, they do not compute
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "scancel")
PACKAGES = "slurmctld slurmd slurm-client munge"


def find_program(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")


def missing_programs() -> list[str]:
    return [p for p in PROGRAMS if find_program(p) is None]


@dataclass(frozen=True)
class SlurmCluster:
    """Where one lab cluster keeps everything, and how clients reach it."""

    state_dir: Path

    @property
    def conf(self) -> Path:
        return self.state_dir / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.state_dir / "munge" / "munge.socket"

    def pid_file(self, daemon: str) -> Path:
        return self.state_dir / "run" / f"{daemon}.pid"

    def log_file(self, daemon: str) -> Path:
        return self.state_dir / "log" / f"{daemon}.log"

    @property
    def node(self) -> str:
        """The first (for one node: the only) node's name."""
        return self.node_names()[0]

    @property
    def machine(self) -> str:
        return socket.gethostname().split(".")[0]

    def node_names(self, nodes: int | None = None) -> list[str]:
        """The nodes' names: this machine's for one node; `<machine>-K` for several (read
        back from the config once it is written)."""
        if nodes is None:
            try:
                text = self.conf.read_text()
            except OSError:
                text = ""
            names = [
                line.split()[0].split("=", 1)[1]
                for line in text.splitlines()
                if line.startswith("NodeName=")
            ]
            return names or [self.machine]
        return (
            [self.machine] if nodes == 1 else [f"{self.machine}-{k}" for k in range(1, nodes + 1)]
        )

    def slurmd_pid_file(self, name: str) -> Path:
        return self.pid_file("slurmd" if name == self.machine else f"slurmd-{name}")

    def env(self) -> dict[str, str]:
        """The environment a Slurm client needs to talk to this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def client(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (sinfo, scontrol, ...) against this cluster."""
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **self.env()},
        )

    # ---- state
    def pid(self, daemon: str) -> int | None:
        """The daemon's pid when it runs and is ours (its command line names our files)."""
        try:
            pid = int(self.pid_file(daemon).read_text().strip())
        except (OSError, ValueError):
            return None
        if not pid_alive(pid):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return None
        mine = str(self.munge_socket) if daemon == "munged" else str(self.conf)
        return pid if mine in cmdline.split("\0") or mine in cmdline else None

    def slurmd_pids(self) -> dict[str, int | None]:
        """Each node's slurmd pid (None: not running, or not ours)."""
        out: dict[str, int | None] = {}
        for name in self.node_names():
            try:
                pid = int(self.slurmd_pid_file(name).read_text().strip())
            except (OSError, ValueError):
                out[name] = None
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                cmdline = ""
            out[name] = pid if pid_alive(pid) and str(self.conf) in cmdline else None
        return out

    def running(self) -> bool:
        return all(self.pid(d) is not None for d in ("munged", "slurmctld")) and all(
            p is not None for p in self.slurmd_pids().values()
        )

    def node_state(self) -> str:
        """The nodes' state: one word when they all agree, else the worst first."""
        r = self.client("sinfo", "-h", "-N", "-o", "%t", timeout=10)
        states = set(r.stdout.split()) if r.returncode == 0 else set()
        if len(states) == 1:
            return states.pop()
        bad = sorted(x for x in states if x not in ("idle", "mix", "alloc"))
        return bad[0] if bad else (sorted(states)[0] if states else "")

    def ports(self) -> tuple[int, int] | None:
        try:
            text = self.conf.read_text()
        except OSError:
            return None
        values = dict(
            line.split("=", 1)
            for line in text.splitlines()
            if "=" in line and not line.startswith("#")
        )
        try:
            return int(values["SlurmctldPort"]), int(values["SlurmdPort"])
        except (KeyError, ValueError):
            return None

    # ---- lifecycle
    def write_config(self, *, ctld_port: int, slurmd_port: int, nodes: int = 1) -> None:
        d = self.state_dir
        names = self.node_names(nodes)
        several = len(names) > 1
        for sub in ("munge", "run", "log", "state", "spool", "gpus"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "munge").chmod(0o700)
        for i in range(GPUS):
            (d / "gpus" / f"nvidia{i}").touch()
        user = _user()
        self.conf.write_text(
            "# A private single-node Slurm cluster written by orchestrator (lab/slurmlab.py).\n"
            f"ClusterName={CLUSTER}\n"
            f"SlurmctldHost={self.machine}(127.0.0.1)\n"
            f"SlurmctldPort={ctld_port}\n"
            f"SlurmdPort={slurmd_port}\n"
            f"SlurmUser={user}\n"
            f"SlurmdUser={user}\n"
            "AuthType=auth/munge\n"
            "CredType=cred/munge\n"
            f"AuthInfo=socket={self.munge_socket}\n"
            f"StateSaveLocation={d / 'state'}\n"
            f"SlurmdSpoolDir={d / 'spool'}{'/%n' if several else ''}\n"
            f"SlurmctldPidFile={self.pid_file('slurmctld')}\n"
            f"SlurmdPidFile={self.pid_file('slurmd-%n' if several else 'slurmd')}\n"
            f"SlurmctldLogFile={self.log_file('slurmctld')}\n"
            f"SlurmdLogFile={self.log_file('slurmd-%n' if several else 'slurmd')}\n"
            "ProctrackType=proctrack/linuxproc\n"
            "TaskPlugin=task/none\n"
            "SelectType=select/cons_tres\n"
            "SelectTypeParameters=CR_Core\n"
            "JobAcctGatherType=jobacct_gather/none\n"
            "AccountingStorageType=accounting_storage/none\n"
            "JobCompType=jobcomp/none\n"
            "SlurmdParameters=config_overrides\n"
            "ReturnToService=2\n"
            "SchedulerType=sched/backfill\n"
            # a job is placed when it is submitted (Slurm's default lets a batch job wait
            # up to 3 s for the next scheduling pass: on lab runs of seconds, that is most
            # of a slot's time)
            "SchedulerParameters=sched_interval=2,batch_sched_delay=0\n"
            "MinJobAge=600\n"
            "KillWait=5\n"
            "InactiveLimit=0\n"
            "SlurmctldTimeout=30\n"
            "SlurmdTimeout=60\n"
            "MpiDefault=none\n"
            "GresTypes=gpu\n"
            + "".join(
                f"NodeName={name}"
                + (f" NodeHostname={self.machine} Port={slurmd_port + k}" if several else "")
                + f" NodeAddr=127.0.0.1 CPUs={NODE_CPUS} RealMemory=4000 Gres=gpu:{GPUS} "
                "State=UNKNOWN\n"
                for k, name in enumerate(names)
            )
            + f"PartitionName={PARTITION} Nodes={','.join(names)} Default=YES "
            "MaxTime=INFINITE State=UP\n"
        )
        (d / "gres.conf").write_text(
            "".join(
                f"NodeName={name} Name=gpu File={d / 'gpus'}/nvidia[0-{GPUS - 1}]\n"
                for name in names
            )
        )
        for name in names if several else ():
            (d / "spool" / name).mkdir(parents=True, exist_ok=True)

    def start(self, *, timeout: float = 60.0, nodes: int = 1) -> bool:
        """Start whatever of munged, slurmctld, slurmd is not running; wait until the node
        takes jobs. Returns True when something was started."""
        missing = missing_programs()
        if missing:
            raise InfraError(
                f"the lab Slurm cluster needs {', '.join(missing)}, not found",
                hint=f"install them: apt-get install {PACKAGES} (scripts/bootstrap does)",
            )
        if self.running() and self.node_state() in ("idle", "mix", "alloc"):
            return False
        ports = self.ports()
        if ports is None or any(_port_taken(p) for p in ports if not self.pid("slurmctld")):
            ports = (free_port(), _free_ports(nodes))
            self.write_config(ctld_port=ports[0], slurmd_port=ports[1], nodes=nodes)
        self._start_munge()
        env = {**os.environ, **self.env()}
        if self.pid("slurmctld") is None:
            # -i: ignore state a previous run of this cluster left (jobs of a dead lab)
            _spawn(
                [find_program("slurmctld") or "slurmctld", "-f", str(self.conf), "-i"],
                env,
                self.log_file("slurmctld-start"),
            )
        several = len(self.node_names()) > 1
        for name, pid in self.slurmd_pids().items():
            if pid is None:
                _spawn(
                    [find_program("slurmd") or "slurmd", "-f", str(self.conf)]
                    + (["-N", name] if several else []),
                    env,
                    self.log_file(f"slurmd-start-{name}" if several else "slurmd-start"),
                )
        self.wait_ready(timeout=timeout)
        return True

    def _start_munge(self) -> None:
        if self.pid("munged") is not None:
            return
        key = self.state_dir / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket.unlink(missing_ok=True)
        _spawn(
            [
                find_program("munged") or "munged",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={self.pid_file('munged')}",
                f"--log-file={self.log_file('munged')}",
                f"--seed-file={self.state_dir / 'munge' / 'munged.seed'}",
            ],
            dict(os.environ),
            self.log_file("munged-start"),
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not self.munge_socket.exists():
            time.sleep(0.05)
        if not self.munge_socket.exists():
            raise InfraError(
                "munged did not start: "
                + _tail(self.log_file("munged"))
                + _tail(self.log_file("munged-start"))
            )

    def wait_ready(self, *, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.node_state()
            if state in ("idle", "mix", "alloc"):
                return
            if state.startswith(("down", "drain")) and self.running():
                # a node left down by an earlier run of this cluster: it is ours to resume
                names = ",".join(self.node_names())
                self.client("scontrol", "update", f"NodeName={names}", "State=RESUME")
            time.sleep(0.2)
        raise InfraError(
            f"the lab Slurm cluster did not become ready in {timeout:g}s (node state "
            f"{state or 'unknown'})",
            hint="see " + ", ".join(str(self.log_file(d)) for d in ("slurmctld", "slurmd")),
        )

    def stop(self) -> list[str]:
        """Stop our daemons (slurmd, slurmctld, munged). Returns what was stopped."""
        stopped = []
        if self.pid("slurmctld") is not None:
            self.cancel_all()
        for name, pid in self.slurmd_pids().items():
            if pid is not None:
                _kill(pid)
                stopped.append(f"slurmd of {name} (pid {pid})")
        for daemon in ("slurmctld", "munged"):
            pid = self.pid(daemon)
            if pid is None:
                continue
            _kill(pid)
            stopped.append(f"{daemon} (pid {pid})")
        # What a job left running on the lab's node: a job taken from a node set DOWN (the
        # node-failure drill) is forgotten by Slurm, but here the node did not really die,
        # so its server would live on and hold its port.
        for pid in job_processes(self.conf):
            _kill(pid, grace=5.0)
            stopped.append(f"a job's process (pid {pid})")
        return stopped

    def jobs(self) -> list[str]:
        """The ids of the jobs the cluster knows that have not ended."""
        r = self.client("squeue", "-h", "-o", "%i", timeout=30)
        return [w for w in r.stdout.split() if w.isdigit()] if r.returncode == 0 else []

    def cancel_all(self, *, timeout: float = 30.0) -> None:
        """Cancel every job and wait until the queue is empty: a job's processes outlive
        slurmd (slurmstepd runs them), so they must end before the daemons do."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            jobs = self.jobs()
            if not jobs:
                return
            self.client("scancel", *jobs, timeout=30)
            time.sleep(0.2)

    def remove(self) -> None:
        shutil.rmtree(self.state_dir, ignore_errors=True)


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _free_ports(n: int) -> int:
    """The first of `n` consecutive free ports (one slurmd each)."""
    for _ in range(50):
        first = free_port()
        if not any(_port_taken(first + k) for k in range(1, n)):
            return first
    raise InfraError(f"no {n} consecutive free ports for the lab cluster's slurmd daemons")


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def _spawn(argv: list[str], env: dict[str, str], log: Path) -> None:
    """Start a daemon that forks into the background; its own output goes to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        r = subprocess.run(
            argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=60,
            start_new_session=True,
        )
    if r.returncode != 0:
        raise InfraError(f"{shlex.join(argv)} exited {r.returncode}: {_tail(log)}")


def job_processes(conf: Path) -> list[int]:
    """The processes on this machine started by jobs of the cluster whose configuration is
    `conf`: Slurm gives a job's processes SLURM_JOB_ID, and this lab's clients and daemons
    SLURM_CONF, in their environment (the daemons themselves have no job id)."""
    mark = f"SLURM_CONF={conf}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if comm.startswith(("slurm", "munge")):
            continue
        if mark in env and any(e.startswith(b"SLURM_JOB_ID=") for e in env):
            found.append(int(entry.name))
    return found


def _kill(pid: int, grace: float = 10.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.05)
    if pid_alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# ---- the lab's cluster (`orchestrator lab up --slurm`): beside the lab sshd, its login node
HOST_NAME = "lab-slurm"


def lab_cluster(lab_state_dir: Path) -> SlurmCluster:
    """The lab's cluster: its state lives in `<lab dir>/slurm` (.lab/slurm by default)."""
    return SlurmCluster(lab_state_dir / "slurm")


def lab_run_dir(cluster: SlurmCluster) -> str:
    """The jobs' run directory of a cluster (shared by login and compute node: here one
    machine), inside the cluster's own state directory: two labs never share one."""
    return str(cluster.state_dir / "jobs")


def slurm_section(
    cluster: SlurmCluster, *, gres: str = "gpu:2", max_jobs: int = 4, **extra: object
) -> dict[str, object]:
    """The `slurm:` mapping of a hosts.yaml entry for this cluster. All jobs share its one
    node, so each gets a private network namespace (the lab servers all use one port)."""
    return {
        "partition": PARTITION,
        "gres": gres,
        "max_jobs": max_jobs,
        "conf": str(cluster.conf),
        "private_network": True,
        **extra,
    }


def hosts_entry(
    login: dict[str, object], cluster: SlurmCluster, *, run_dir: str | None = None, **slurm: object
) -> dict[str, object]:
    """A `lab-slurm` hosts.yaml entry: the login node's entry (the lab sshd's) with the
    Slurm backend on top; its run directory is the cluster's unless one is given."""
    entry = dict(login)
    entry.update(
        {
            "service_manager": "slurm",
            "run_dir": run_dir or lab_run_dir(cluster),
            "labels": ["lab"],
            "class": HOST_NAME,
            "slurm": slurm_section(cluster, **slurm),
        }
    )
    return entry
