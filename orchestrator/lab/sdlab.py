"""`orchestrator lab up --systemd`: a real systemd host on this machine, to watch the tool work.

The Debian rootfs the tests boot (built and cached once by orchestrator/lab/rootfs.py) runs
under `systemd-nspawn -b` with systemd as PID 1, its own sshd and its own network namespace
(`10.213.255.254`, port 22: the `lab-systemd` entry of hosts.example.yaml). It carries the
unit an operator of a B300 host would have written, `sglang-lab.service`, enabled and
running, whose ExecStart starts the simulated SGLang server (orchestrator.lab.server) with
the known-good TP8 config. The tool reaches it as user `ubuntu` with `sudo: true`, as it
would a GPU host, and everything it does there can be watched with the usual commands.

Files:
    <lab state dir>/systemd/   lab.json (what runs: nspawn pid, netns, address, work dir),
                               id_ed25519(.pub) (the client key), known_hosts, hosts.yaml
    /var/tmp/orchestrator-lab-<name>/   overlay upper/work dirs, the merged root, console.log

`up` is idempotent (a running host is reported, not rebooted); `down` halts the machine
(systemd stops the unit, then everything else), unmounts its root, deletes its namespace
and work dir: no container, sshd or server is left. A host found half-gone (the machine
rebooted, nspawn killed) is cleaned up by the next `up` or `down`. The container name
follows the lab's state directory (`orch-lab-<hash of ORCH_LAB_DIR>`, or the name its
lab.json records), so `lab status/down` find it from any shell and never reach the
container of a lab with another state directory (another checkout's); with it go the
netns, the veth and the work dir. ORCH_LAB_SYSTEMD_NAME overrides it, for tests. The
address block of hosts.example.yaml's `lab-systemd` (10.213.255.252/30) is taken when it is
free and a free one otherwise: the lab's own hosts.yaml always names the address it got.

This module returns data and raises `orchestrator.errors`; the CLI prints.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from orchestrator.errors import InfraError, UsageError
from orchestrator.lab import container as ct
from orchestrator.lab import hostctl, vllm_env
from orchestrator.lab.hostctl import LabSettings
from orchestrator.lab.sshd import SshTarget

NAME_ENV = "ORCH_LAB_SYSTEMD_NAME"
NAME_PREFIX = "orch-lab"
HOST_NAME = "lab-systemd"  # the hosts.yaml entry
UNIT = "sglang-lab.service"
USER = "ubuntu"  # the image's login user with passwordless sudo (rootfs.LOGIN_USER)
UNIT_DIR = "/etc/systemd/system"
REPO_IN_CONTAINER = "/opt/orchestrator"
SERVER_PORT = 30000
#: the default host's fixed /30 (10.213.255.252/30), so hosts.example.yaml can name it;
#: other names get a free block at random (container.RESERVED_BLOCKS keeps this one free)
DEFAULT_BLOCK = "255.63"
WORK_PARENT = Path("/var/tmp")

#: The operator's unit: the known-good TP8 launch of experiments/lab/b300/good.yaml, as
#: a B300 host's sglang unit looks (the real one runs `python -m sglang.launch_server`).
UNIT_TEXT = f"""\
[Unit]
Description=SGLang server: Kimi-K2.6 on 8x B300, TP8 (simulated by orchestrator.lab.server)
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
Environment=NCCL_DEBUG=WARN
ExecStart=/usr/bin/python3 -m orchestrator.lab.server --scenario b300 \\
    --model-path /models/Kimi-K2.6 --tp-size 8 --trust-remote-code \\
    --mem-fraction-static 0.85 --max-running-requests 128 --cuda-graph-max-bs 128 \\
    --port {SERVER_PORT}
Restart=on-failure
RestartSec=5
LimitNOFILE=65535
TimeoutStopSec=30

[Install]
WantedBy=multi-user.target
"""


def name_for(state_dir: Path) -> str:
    """The container name of the lab whose state directory is `state_dir`."""
    return f"{NAME_PREFIX}-" + hashlib.sha256(str(state_dir).encode()).hexdigest()[:8]


_NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,30}")


@dataclass(frozen=True)
class SdLabSettings:
    lab: LabSettings
    name: str = ""  # "" = the lab's own (see from_env)
    #: the lab of `lab up`: it wants the default address block (taken only when free)
    default_block: bool = False

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> SdLabSettings:
        env = dict(os.environ) if env is None else env
        lab = LabSettings.from_env(env)
        name = env.get(NAME_ENV)
        if name:
            if not _NAME_RE.fullmatch(name):
                raise UsageError(
                    f"{NAME_ENV}={name!r} is not a usable name",
                    hint="lower-case letters, digits and '-', at most 31",
                )
            # a name of its own (tests, bench) never takes the default's address block
            return cls(lab=lab, name=name)
        return cls(lab=lab, default_block=True)

    def __post_init__(self) -> None:
        if not self.name:
            # what this state dir's lab.json records (a lab started before names followed
            # the state dir keeps its own), else the name derived from the state dir
            recorded = _read_json(self.lab.state_dir / "systemd" / "lab.json").get("name")
            ok = isinstance(recorded, str) and _NAME_RE.fullmatch(recorded)
            object.__setattr__(self, "name", recorded if ok else name_for(self.lab.state_dir))

    @property
    def state_dir(self) -> Path:
        return self.lab.state_dir / "systemd"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "lab.json"

    @property
    def identity_file(self) -> Path:
        return self.state_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "known_hosts"

    @property
    def hosts_file(self) -> Path:
        return self.lab.state_dir / "hosts.yaml"

    @property
    def workdir(self) -> Path:
        return WORK_PARENT / f"orchestrator-lab-{self.name}"

    @property
    def netns_name(self) -> str:
        return self.name

    @property
    def veth(self) -> str:
        # Never `oh<digits>x...`: the tests' cleanup removes those of dead pids.
        return "ol" + hashlib.sha256(self.name.encode()).hexdigest()[:10]

    @property
    def block(self) -> str | None:
        return DEFAULT_BLOCK if self.default_block else None


@dataclass(frozen=True)
class SdLabStatus:
    settings: SdLabSettings
    running: bool
    pid: int | None
    address: str | None
    leftovers: tuple[str, ...] = ()  # what a dead instance left (netns, mount, work dir)

    def target(self) -> SshTarget:
        assert self.address is not None
        host_key = ""
        kh = self.settings.known_hosts
        if kh.exists():
            host_key = " ".join(kh.read_text().split()[1:3])
        return SshTarget(
            address=self.address,
            port=22,
            user=USER,
            identity_file=self.settings.identity_file,
            known_hosts=kh,
            host_key_pub=host_key,
        )

    def hosts_entry(self) -> dict[str, object]:
        """The `lab-systemd` entry of hosts.yaml that reaches this host (absolute paths)."""
        return {
            "address": self.address or "",
            "port": 22,
            "user": USER,
            "identity_file": str(self.settings.identity_file),
            "known_hosts": str(self.settings.known_hosts),
            "sudo": True,
            "service_manager": "systemd",
            "unit_dir": UNIT_DIR,
            "labels": ["lab"],
        }


@dataclass(frozen=True)
class SdUpResult:
    status: SdLabStatus
    started: bool
    unit_state: str = ""  # "active/running" as systemctl shows it
    health: str = ""  # the HTTP code of /health inside the host


@dataclass(frozen=True)
class SdDownResult:
    stopped_pid: int | None
    removed: tuple[str, ...] = ()


def missing_prerequisites() -> str | None:
    """Why this machine cannot run the systemd lab host, or None when it can."""
    if os.geteuid() != 0:
        return "not root (systemd-nspawn and network namespaces need root)"
    for tool, pkg in (
        ("systemd-nspawn", "systemd-container"),
        ("ip", "iproute2"),
        ("zstd", "zstd"),
        ("ssh-keygen", "openssh-client"),
    ):
        if not shutil.which(tool):
            return f"'{tool}' is not installed (Debian package {pkg})"
    return None


def _read_json(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_state(settings: SdLabSettings) -> dict[str, object]:
    return _read_json(settings.state_file)


#: the real vLLM's unit (`lab up --systemd --vllm`): real `vllm serve` on the lab's tiny
#: model, from the cached venv of scripts/build-vllm, bound read-only at the same path
VLLM_UNIT = "vllm-lab.service"
VLLM_PORT = 8000


def vllm_unit_text() -> str:
    lab = vllm_env.lab_dir()
    return (
        "[Unit]\n"
        "Description=vLLM (CPU build) serving the lab's tiny Llama (orchestrator lab)\n"
        "After=network-online.target\n\n"
        "[Service]\n"
        "Type=simple\n"
        "Environment=VLLM_CPU_KVCACHE_SPACE=1\n"
        f"ExecStart={lab}/bin/vllm serve {lab}/model --load-format dummy --enforce-eager "
        f"--port {VLLM_PORT}\n"
        "Restart=no\n"
        "TimeoutStopSec=60\n\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def _vllm_binds() -> list[tuple[Path | str, str]]:
    """The venv cache, and the Python installation its interpreter links to (a venv's
    `bin/python` is a symlink to it), both at their own paths."""
    venv_python = (vllm_env.venv_path() / "bin" / "python").resolve()
    base = venv_python.parent.parent
    cache = vllm_env.cache_dir()
    return [(cache, str(cache)), (base, str(base))]


def _container(
    settings: SdLabSettings, rootfs: Path | None = None, vllm: bool = False
) -> ct.Container:
    return ct.Container(
        machine=settings.name,
        rootfs=rootfs or Path("/nonexistent"),
        workdir=settings.workdir,
        netns=ct.Netns(settings.netns_name, settings.veth),
        binds=[
            (settings.lab.repo, REPO_IN_CONTAINER),
            (settings.identity_file.with_suffix(".pub"), "/etc/ssh/orch_authorized_keys"),
            *(_vllm_binds() if vllm else []),
        ],
    )


def status(settings: SdLabSettings) -> SdLabStatus:
    state = _read_state(settings)
    pid = state.get("pid")
    running_pids = ct.nspawn_pids(settings.name)
    running = isinstance(pid, int) and pid in running_pids
    leftovers: list[str] = []
    if not running:
        netns = ct.Netns(settings.netns_name, settings.veth)
        if netns.exists():
            leftovers.append(f"network namespace {netns.name}")
        if settings.workdir.exists():
            leftovers.append(str(settings.workdir))
        leftovers += [f"systemd-nspawn pid {p}" for p in running_pids]
    address = state.get("address")
    return SdLabStatus(
        settings=settings,
        running=running,
        pid=pid if running and isinstance(pid, int) else None,
        address=address if isinstance(address, str) else None,
        leftovers=tuple(leftovers),
    )


def _keys(settings: SdLabSettings) -> None:
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    settings.state_dir.chmod(0o700)
    key = settings.identity_file
    if key.exists() and key.with_suffix(".pub").exists():
        return
    key.unlink(missing_ok=True)
    ct.run(
        [
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "orchestrator-lab-systemd",
            "-f",
            str(key),
        ]
    )
    key.with_suffix(".pub").chmod(0o644)


def _provision(root: Path, name: str, vllm: bool = False) -> None:
    """Files of the machine written into its overlay before it boots."""
    unit_dir = root / UNIT_DIR.lstrip("/")
    units = {UNIT: UNIT_TEXT} | ({VLLM_UNIT: vllm_unit_text()} if vllm else {})
    wants = unit_dir / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    for unit, text in units.items():
        (unit_dir / unit).write_text(text)
        link = wants / unit
        link.unlink(missing_ok=True)
        link.symlink_to(f"{UNIT_DIR}/{unit}")  # `systemctl enable`, done offline
    # The project (bound read-only at /opt/orchestrator) on python3's path for every user
    # and unit, the way a pip-installed sglang is: no PYTHONPATH in units or hosts.yaml.
    (root / "usr/lib/python3/dist-packages/orchestrator-lab.pth").write_text(
        REPO_IN_CONTAINER + "\n"
    )
    # The name the journal and prompts show; sudo must be able to resolve it.
    (root / "etc/hostname").write_text(f"{name}\n")
    (root / "etc/hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {name}\n")


def up(
    settings: SdLabSettings,
    *,
    progress: Callable[[str], None] = lambda _m: None,
    timeout: float = 180.0,
    vllm: bool = False,
) -> SdUpResult:
    """Boot the systemd lab host unless it runs already; wait for its unit to serve."""
    why = missing_prerequisites()
    if why:
        raise UsageError(
            f"the systemd lab host cannot run here: {why}",
            hint="`orchestrator lab up` (without --systemd) gives the process lab host",
        )
    current = status(settings)
    if current.running:
        return SdUpResult(status=current, started=False, **unit_health(current))
    if current.leftovers:
        _teardown(settings)
    tarball = ct.rootfs_tarball()
    if not tarball.exists():
        progress(
            f"building the Debian rootfs once (debootstrap: 2-4 minutes here; cached as {tarball})"
        )
        tarball = ct.build_rootfs()
    rootfs = ct.extracted_rootfs(tarball)
    _keys(settings)
    c = _container(settings, rootfs, vllm=vllm)
    block = settings.block
    if block is not None and block in ct.used_blocks():
        block = None  # another lab (another checkout's) has it: a free one, named in hosts.yaml
    try:
        c.netns.create(block=block)
        settings.known_hosts.write_text(f"{c.netns.address} {ct.rootfs_host_key(rootfs)}\n")
        settings.workdir.mkdir(parents=True, exist_ok=True)
        c.mount_root()
        _provision(c.root, HOST_NAME, vllm=vllm)
        pid = c.spawn(hostname=HOST_NAME)
        settings.state_file.write_text(
            json.dumps(
                {
                    "name": settings.name,
                    "pid": pid,
                    "address": c.netns.address,
                    "netns": c.netns.name,
                    "veth": c.netns.veth,
                    "workdir": str(settings.workdir),
                    "user": USER,
                    "unit": UNIT,
                    "started": time.time(),
                },
                indent=2,
            )
            + "\n"
        )
        c.wait_booted(status(settings).target(), timeout)
        st = status(settings)
        if not st.running:
            raise c.failure("systemd-nspawn is gone after the boot")
    except BaseException:
        _teardown(settings)
        raise
    write_hosts_file(settings.lab, st)
    return SdUpResult(status=st, started=True, **unit_health(st, wait=30.0))


def unit_health(st: SdLabStatus, *, wait: float = 0.0) -> dict[str, str]:
    """The unit's state and /health inside the host (waits up to `wait` s for a 200)."""
    deadline = time.monotonic() + wait
    cmd = (
        f"systemctl show {UNIT} -p ActiveState -p SubState --value | paste -sd/; "
        f"curl -s -o /dev/null -m 3 -w '%{{http_code}}' "
        f"http://127.0.0.1:{SERVER_PORT}/health"
    )
    state = health = ""
    for _ in range(200):
        try:
            res = st.target().ssh_run(cmd, timeout=30)
        except subprocess.TimeoutExpired:
            break
        lines = res.stdout.splitlines()
        state = lines[0] if lines else ""
        health = lines[1] if len(lines) > 1 else ""
        if health == "200" or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    return {"unit_state": state, "health": health}


def write_hosts_file(lab: LabSettings, st: SdLabStatus | None) -> Path:
    """<state dir>/hosts.yaml with the entries of what runs now (`lab`, `lab-systemd`,
    `lab-slurm`)."""
    hosts: dict[str, object] = {}
    process = hostctl.status(lab)
    if process.running or not process.sshd_installed:
        hosts["lab"] = process.hosts_entry()
    if st is not None and st.running:
        hosts[HOST_NAME] = st.hosts_entry()
    from orchestrator.lab import slurmlab

    cluster = slurmlab.lab_cluster(lab.state_dir)
    if "lab" in hosts and cluster.running():
        hosts[slurmlab.HOST_NAME] = slurmlab.hosts_entry(process.hosts_entry(), cluster)
    path = lab.state_dir / "hosts.yaml"
    lab.state_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "# Written by `orchestrator lab up`: the lab hosts that run now.\n"
        + yaml.safe_dump({"hosts": hosts}, sort_keys=False)
    )
    return path


def _teardown(settings: SdLabSettings) -> tuple[int | None, list[str]]:
    """Halt the machine and remove its mount, namespace, work dir and state."""
    removed: list[str] = []
    state = _read_state(settings)
    c = _container(settings)
    stopped: int | None = None
    pids = ct.nspawn_pids(settings.name)
    pid = state.get("pid")
    if isinstance(pid, int) and pid in pids:
        pids.remove(pid)
        pids.insert(0, pid)
    for p in pids:
        if c.attach(p):
            c.stop()
            stopped = stopped or p
    c.unmount()  # what an earlier `up` mounted, too
    if c.netns.exists():
        c.netns.delete()
        removed.append(f"network namespace {c.netns.name}")
    if settings.workdir.exists():
        ct.remove_tree(settings.workdir)
        removed.append(str(settings.workdir))
    settings.state_file.unlink(missing_ok=True)
    if c.netns.exists() or settings.workdir.exists():
        raise InfraError(
            f"the systemd lab host {settings.name} left "
            f"{c.netns.name if c.netns.exists() else settings.workdir} behind"
        )
    return stopped, removed


def down(settings: SdLabSettings) -> SdDownResult:
    """Stop the systemd lab host and remove everything it used; nothing else is touched."""
    if not _read_state(settings) and not status(settings).leftovers:
        return SdDownResult(stopped_pid=None)
    stopped, removed = _teardown(settings)
    write_hosts_file(settings.lab, None)
    return SdDownResult(stopped_pid=stopped, removed=tuple(removed))
