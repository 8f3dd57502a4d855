"""The hosts inventory (`hosts.yaml`): where servers run and how to reach them.

Each host: address, user, port, identity file, known_hosts, sudo, transport (`ssh` or
`local`), service manager (`systemd` or `process`), unit directory, run directory for
the process manager, labels, and a host class (hosts of one class share cached
verdicts). Pools name groups of equivalent hosts for parallel runs. Relative paths are
relative to the hosts file's directory; `~` is expanded.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchestrator.config.repair import Declared, RepairModel
from orchestrator.config.webhook import check_url
from orchestrator.config.yamlio import load_model
from orchestrator.errors import ConfigError, UsageError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class _Raw(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SlurmModel(_Raw):
    """A Slurm cluster: each variant is one `sbatch` job (see orchestrator/execution/slurm)."""

    partition: str
    gres: str | None = None  # e.g. gpu:8
    time: str | None = None  # sbatch --time; default: the health deadline + probe + margin
    account: str | None = None
    constraint: str | None = None
    exclusive: bool = False
    options: list[str] = Field(default_factory=list)  # more sbatch options, one per item
    max_jobs: int = Field(default=1, ge=1, le=256)  # jobs of one campaign queued at once
    conf: str | None = None  # SLURM_CONF for the clients on the login node
    pending_timeout: float = Field(default=86400.0, gt=0)  # seconds a job may wait to start
    #: run each job in a private network namespace (unshare --net), so that jobs sharing a
    #: node can all use the config's port (root or unprivileged user namespaces needed)
    private_network: bool = False

    @field_validator("partition", "gres", "time", "account", "constraint")
    @classmethod
    def _word(cls, v: str | None) -> str | None:
        if v is not None and (not v or re.search(r"[\s\x00-\x1f\x7f]", v)):
            raise ValueError(f"expected one word without spaces, got {v!r}")
        return v


class HostModel(_Raw):
    address: str
    user: str | None = None
    port: int = Field(default=22, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str | None = None
    sudo: bool = False
    transport: Literal["ssh", "local"] = "ssh"
    service_manager: Literal["systemd", "process", "slurm"] = "systemd"
    slurm: SlurmModel | None = None  # service_manager: slurm (the host is the login node)
    unit_dir: str = "/etc/systemd/system"
    run_dir: str | None = None
    labels: list[str] = Field(default_factory=list)
    host_class: str | None = Field(default=None, alias="class")
    env: dict[str, str] = Field(default_factory=dict)
    connect_timeout: float = Field(default=15.0, gt=0)
    keep_runs: int = Field(default=20, ge=1)  # run logs left on a process-manager host
    #: the host's habits: what a run that fails on a resource may change (config.repair)
    repair: RepairModel | None = None
    builds: dict[str, str] = Field(default_factory=dict)  # build name -> prefix path or image

    @field_validator("builds")
    @classmethod
    def _builds(cls, v: dict[str, str]) -> dict[str, str]:
        for name, target in v.items():
            if not name or re.search(r"[\x00-\x20\x7f]", name):
                raise ValueError(f"a build name is one word, got {name!r}")
            if not target or re.search(r"[\x00-\x20\x7f]", target):
                raise ValueError(
                    f"build {name!r}: expected one path on the host or one image, got {target!r}"
                )
        return v

    @field_validator("unit_dir", "run_dir")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"expected an absolute path on the host, got {v!r}")
        if v is not None and re.search(r"[\x00-\x1f\x7f]", v):
            # every command names it; a NUL or newline cannot travel in one
            raise ValueError(f"a path on the host cannot hold control characters: {v!r}")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        # each name is exported by a shell on the host: a name must be a name, not code
        for name in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(
                    f"{name!r} is not an environment variable name "
                    "(letters, digits and _, not starting with a digit)"
                )
        return v


class PoolModel(_Raw):
    hosts: list[str] = Field(default_factory=list)
    labels: list[str] = Field(default_factory=list)


class InventoryModel(_Raw):
    hosts: dict[str, HostModel]
    pools: dict[str, list[str] | PoolModel] = Field(default_factory=dict)
    defaults: dict[str, object] | None = None
    notify: str | None = None  # URL a message is POSTed to when a campaign ends


@dataclass(frozen=True)
class SlurmOptions:
    """How variants become jobs on a Slurm cluster reached through this host (login node)."""

    partition: str
    gres: str | None = None
    time: str | None = None
    account: str | None = None
    constraint: str | None = None
    exclusive: bool = False
    options: tuple[str, ...] = ()
    max_jobs: int = 1
    conf: str | None = None
    pending_timeout: float = 86400.0
    private_network: bool = False


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    user: str | None = None
    port: int = 22
    identity_file: str | None = None
    known_hosts: str | None = None
    sudo: bool = False
    transport: str = "ssh"
    service_manager: str = "systemd"
    unit_dir: str = "/etc/systemd/system"
    run_dir: str | None = None
    labels: tuple[str, ...] = ()
    host_class: str = ""
    env: tuple[tuple[str, str], ...] = ()
    connect_timeout: float = 15.0
    keep_runs: int = 20
    slurm: SlurmOptions | None = None
    repair: Declared | None = field(default=None, compare=False)
    #: build name -> prefix path or image (`builds:`; see orchestrator.config.builds)
    builds: tuple[tuple[str, str], ...] = ()
    #: the hosts file this host was read from (errors name it)
    hosts_file: str = field(default="", compare=False)

    @property
    def is_local(self) -> bool:
        return self.transport == "local"

    def describe(self) -> str:
        if self.is_local:
            return f"{self.name} (local)"
        user = f"{self.user}@" if self.user else ""
        return f"{self.name} ({user}{self.address}:{self.port})"


@dataclass(frozen=True)
class Inventory:
    hosts: dict[str, Host]
    pools: dict[str, tuple[str, ...]] = field(default_factory=dict)
    source: str = "hosts.yaml"
    notify: str | None = None

    def host(self, name: str) -> Host:
        if name in self.hosts:
            return self.hosts[name]
        raise self._unknown(name)

    def resolve(self, name: str) -> list[Host]:
        """A host name or a pool name -> the hosts to use."""
        if name in self.hosts:
            return [self.hosts[name]]
        if name in self.pools:
            return [self.hosts[h] for h in self.pools[name]]
        raise self._unknown(name)

    def _unknown(self, name: str) -> UsageError:
        names = sorted(self.hosts) + sorted(self.pools)
        close = difflib.get_close_matches(name, names, n=1)
        mean = f"; did you mean '{close[0]}'?" if close else ""
        return UsageError(
            f"no host or pool named '{name}' in {self.source}{mean}",
            hint="known: " + ", ".join(names),
        )


def _expand(path: str | None, base: Path) -> str | None:
    if path is None:
        return None
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else (base / p))


def _slurm_options(h: HostModel, base: Path, *, file: str, key: str) -> SlurmOptions:
    if h.service_manager != "slurm":
        raise ConfigError(
            "a slurm: section needs service_manager: slurm", file=file, key=f"{key}.service_manager"
        )
    if h.slurm is None:
        raise ConfigError(
            "service_manager: slurm needs a slurm: section (at least its partition)",
            file=file,
            key=f"{key}.slurm",
            hint="e.g. slurm: {partition: gpu, gres: 'gpu:8', max_jobs: 4}",
        )
    if not h.run_dir:
        raise ConfigError(
            "required for a Slurm cluster: a directory that the login node and "
            "the compute nodes share (job scripts, logs and results go there)",
            file=file,
            key=f"{key}.run_dir",
        )
    s = h.slurm
    # A relative SLURM_CONF only makes sense for a login node that is this machine (the lab):
    # relative to the hosts file, like the other paths.
    conf = _expand(s.conf, base) if s.conf and not s.conf.startswith("/") else s.conf
    return SlurmOptions(
        partition=s.partition,
        gres=s.gres,
        time=s.time,
        account=s.account,
        constraint=s.constraint,
        exclusive=s.exclusive,
        options=tuple(s.options),
        max_jobs=s.max_jobs,
        conf=conf,
        pending_timeout=s.pending_timeout,
        private_network=s.private_network,
    )


def load_inventory(path: str | Path) -> Inventory:
    path = Path(path)
    model = load_model(path, InventoryModel, what="hosts")
    base = path.resolve().parent
    hosts: dict[str, Host] = {}
    for name, h in model.hosts.items():
        if not _NAME.match(name):
            raise ConfigError(
                "host names may use letters, digits, '.', '_' and '-'",
                file=str(path),
                key=f"hosts.{name}",
            )
        if h.transport == "ssh" and not h.known_hosts:
            raise ConfigError(
                "required for ssh hosts: host keys are always verified",
                file=str(path),
                key=f"hosts.{name}.known_hosts",
                hint="e.g. known_hosts: ~/.ssh/known_hosts",
            )
        slurm: SlurmOptions | None = None
        if h.service_manager == "slurm" or h.slurm is not None:
            slurm = _slurm_options(h, base, file=str(path), key=f"hosts.{name}")
        hosts[name] = Host(
            name=name,
            address=h.address,
            user=h.user,
            port=h.port,
            identity_file=_expand(h.identity_file, base),
            known_hosts=_expand(h.known_hosts, base),
            sudo=h.sudo,
            transport=h.transport,
            service_manager=h.service_manager,
            unit_dir=h.unit_dir,
            run_dir=h.run_dir,
            labels=tuple(h.labels),
            host_class=h.host_class or (h.labels[0] if h.labels else name),
            env=tuple(h.env.items()),
            connect_timeout=h.connect_timeout,
            keep_runs=h.keep_runs,
            slurm=slurm,
            repair=Declared.of(h.repair, f"{path} (host {name})"),
            builds=tuple(h.builds.items()),
            hosts_file=str(path),
        )
    pools: dict[str, tuple[str, ...]] = {}
    for pname, p in model.pools.items():
        if pname in hosts:
            raise ConfigError(
                "a pool cannot have the name of a host", file=str(path), key=f"pools.{pname}"
            )
        members: list[str] = []
        if isinstance(p, list):
            members = list(p)
        else:
            members = list(p.hosts)
            for label in p.labels:
                members += [n for n, h in hosts.items() if label in h.labels and n not in members]
        for i, m in enumerate(members):
            if m not in hosts:
                close = difflib.get_close_matches(m, list(hosts), n=1)
                raise ConfigError(
                    f"unknown host '{m}'" + (f"; did you mean '{close[0]}'?" if close else ""),
                    file=str(path),
                    key=f"pools.{pname}[{i}]" if isinstance(p, list) else f"pools.{pname}.hosts",
                )
        if not members:
            raise ConfigError("the pool has no hosts", file=str(path), key=f"pools.{pname}")
        pools[pname] = tuple(dict.fromkeys(members))
    if model.notify is not None:
        try:
            check_url(model.notify)
        except UsageError as exc:
            raise ConfigError(
                "expected an http:// or https:// URL", file=str(path), key="notify"
            ) from exc
    return Inventory(hosts=hosts, pools=pools, source=str(path), notify=model.notify)
