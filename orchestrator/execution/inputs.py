"""What reaches a server's process besides its experiment config: the other half of the
key under which a verdict is cached.

A verdict is about one launch on one system. The config's own part (command, flags,
environment, unit, health check, probe) is `Experiment.fingerprint()`; the rest is here:

- the host class (hosts of one class are equivalent) and the backend (service manager,
  and for a Slurm cluster the job options that reach the job: partition, gres, time...);
- the host's `env:` from the hosts file (every command on the host, the server's launch
  and the flag pre-check included, runs with it);
- the unit's own definition and environment, as systemd reads them back (its unit file and
  drop-ins, `Environment=`, the contents of its `EnvironmentFile=`s, the manager's
  environment); a process-manager host has none: its launch script is wholly ours;
- the host's environment as the server's own interpreter sees it (`environment.py`: the
  resolved interpreter, the server's and key libraries' versions, driver, CUDA, kernel);
- the files the launch names (`named_files`: a scenario, a chat template, a config file
  given by its path or by a bare name in its working directory): the server reads them,
  so a file fixed since a run makes another launch, and the run's verdict (an `invalid`
  above all) is not reused for it. Each file's own digest is kept beside (`named`): a
  file is part of the launch that names it, so the environment watch compares a file only
  with what earlier runs read at the same path, never one launch's files with another's
  (a variant that adds `--chat-template t.jinja` names a file good does not).

Only digests are kept (values may be secrets). A part that could not be read is unknown
(None), and a launch with an unknown part has no key: its verdict is never reused, nor is
an earlier one reused for it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.config.hosts import Host

#: the parts of the key, in the words `differences` uses
PARTS = {
    "host_class": "the host class",
    "backend": "the service manager or the cluster's job options",
    "host_env": "the hosts file's env:",
    "unit": "the unit's own files or environment",
    "environment": "the host's environment (exec, packages, driver)",
    "files": "the files the launch names",
}

#: how many path words of a launch are read (a launch names a few files, not hundreds)
MAX_NAMED_FILES = 64


#: a bare word that is a number or an address (`0.9`, `1e-5`, `127.0.0.1`) names no file
_NUMBER = re.compile(r"[0-9][0-9.eE+_-]*")


def named_files(argv: Iterable[str], env: Iterable[tuple[str, str]] = ()) -> tuple[str, ...]:
    """The paths a launch names, after its executable (whose own file the environment
    covers): words of its command line, `--flag=/path` values, and environment values;
    absolute (`/etc/x.yaml`) or relative to the launch's working directory with a
    directory part (`conf/x.yaml`, `./t.jinja`), then bare names (`t.jinja`), where the
    host reads them from. What is a regular file among them is read on the host (a
    relative word that names none, a model's repository id `org/model`, a value such as
    `auto`, counts for nothing). Bare names come last: a launch that names no such file
    keeps the key it had before they were read."""
    args = list(argv)[1:]
    # the module of `python -m mod` is imported, not read as a file
    module = {i + 1 for i, w in enumerate(args[:-1]) if w == "-m"}
    words = [w for i, w in enumerate(args) if i not in module] + [v for _, v in env]
    paths: list[str] = []
    bare: list[str] = []
    for word in words:
        value = word.split("=", 1)[1] if word.startswith("-") and "=" in word else word
        if (
            not value
            or value.startswith(("//", "-"))
            or any(c.isspace() or c == ":" for c in value)
            or value in paths
            or value in bare
        ):
            continue
        if "/" in value:
            paths.append(value)
        elif (
            "=" not in value
            and value not in (".", "..")
            and not _NUMBER.fullmatch(value)
            and len(value) <= 255
        ):
            bare.append(value)
    return tuple([*paths, *bare][:MAX_NAMED_FILES])


def digest(obj: object) -> str:
    """A short stable digest of a JSON-able value."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def env_digest(items: Iterable[tuple[str, str]]) -> str:
    """The digest of environment variables, whatever their order."""
    return digest(sorted([k, v] for k, v in items))


def backend_digest(host: Host) -> str:
    """The service manager, and for a cluster the options that reach each job (a time
    limit decides `timeout`, a gres or constraint the node a job gets)."""
    slurm = host.slurm
    opts: Any = None
    if slurm is not None:
        opts = [
            slurm.partition,
            slurm.gres,
            slurm.time,
            slurm.account,
            slurm.constraint,
            slurm.exclusive,
            list(slurm.options),
            slurm.conf,
            slurm.private_network,
        ]
    return digest([host.service_manager, opts])


@dataclass(frozen=True)
class LaunchInputs:
    """Everything besides the config that reaches a run's server, as digests."""

    host_class: str
    backend: str
    host_env: str
    #: the unit's own definition and environment ("" where there is no unit of the
    #: user's: a process-manager host, a Slurm job); None: it could not be read
    unit: str | None
    #: `HostEnvironment.digest()` of the host as the server's interpreter sees it; None:
    #: unknown (not read, or not readable before the run: a Slurm job's node)
    environment: str | None
    #: the digest of the files the launch names, as read on the host ("": it names none;
    #: None: they could not be read)
    files: str | None = ""
    #: each of those files by itself, (path, digest) as read on the host (`-`: no readable
    #: file at an absolute path); None: not read one by one (a record from before). Not
    #: part of the key (`files` covers them), nor of `differences`: what the environment
    #: watch compares path by path
    named: tuple[tuple[str, str], ...] | None = field(default=None, compare=False)

    @property
    def known(self) -> bool:
        return self.unit is not None and self.environment is not None and self.files is not None

    def key(self, fingerprint: str) -> str | None:
        """The cache key of a launch of the config `fingerprint` under these inputs; None
        when a part is unknown (nothing is reused then)."""
        if not self.known:
            return None
        parts = self.to_dict()
        del parts["named"]  # `files` is their digest already
        if parts["files"] == "":  # names no file: the key runs recorded before files had
            del parts["files"]
        return digest([fingerprint, parts])

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["named"] = None if self.named is None else dict(self.named)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> LaunchInputs | None:
        if not data:
            return None
        try:
            # a record from before files were read: none named, as its key was made
            fields = {
                k: data.get(k, "" if k == "files" else None) for k in cls.__dataclass_fields__
            }
            named = fields["named"]
            fields["named"] = (
                tuple((str(p), str(d)) for p, d in named.items())
                if isinstance(named, Mapping)
                else None
            )
            return cls(**fields)
        except (TypeError, AttributeError):
            return None

    def differences(self, other: LaunchInputs) -> list[str]:
        """What differs from `other`, for people."""
        return [PARTS[k] for k in PARTS if getattr(self, k) != getattr(other, k)]


def launch_inputs(
    host: Host,
    *,
    unit: str | None,
    environment: str | None,
    files: str | None = "",
    named: tuple[tuple[str, str], ...] | None = None,
) -> LaunchInputs:
    return LaunchInputs(
        host_class=host.host_class,
        backend=backend_digest(host),
        host_env=env_digest(host.env),
        unit=unit,
        environment=environment,
        files=files,
        named=named,
    )


__all__ = [
    "PARTS",
    "LaunchInputs",
    "backend_digest",
    "digest",
    "env_digest",
    "launch_inputs",
    "named_files",
]
