"""The hosts of a deployment, for `hosts check --experiment` and `restore --experiment`:
each role of an experiment with the host it runs on and the service (unit) it changes
there, in start order."""

from __future__ import annotations

import argparse
import os
import shlex
from dataclasses import dataclass

from orchestrator.cli import common
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.errors import ConfigError, OrchestratorError


@dataclass(frozen=True)
class RoleHost:
    """One role of a deployment: its host and what it changes there."""

    role: str
    host: Host
    #: the name its lock, drop-in or run directory are kept under (the unit on systemd)
    service: str
    unit: str | None

    @property
    def label(self) -> str:
        return f"role {self.role}"


def load(path: str) -> Experiment:
    from orchestrator.config import load_experiment

    return load_experiment(path)


def role_hosts(args: argparse.Namespace, exp: Experiment, fallback: str | None) -> list[RoleHost]:
    """Each role of `exp` in start order with its host: the role's own `host:`, else
    `fallback` (the host a campaign would run the roles that name none on). A role without
    either, or whose host is unknown or a pool, is refused naming the file and key."""
    from orchestrator.execution.executor import service_name

    inv = common.inventory(args)
    dep = exp.deployment()
    out: list[RoleHost] = []
    for name in dep.start_order:
        role = dep.role(name)
        key = f"roles.{name}.host" if exp.roles else "service"
        where = role.host or fallback
        if where is None:
            raise ConfigError(
                f"role {name} names no host, and no host was given for it",
                file=exp.source,
                key=key,
                hint="give the role its host: in the config, or name the host of the roles "
                "that have none (`hosts check H --experiment ...`, `restore --host H "
                "--experiment ...`)",
            )
        try:
            hosts = inv.resolve(where)
        except OrchestratorError as exc:
            raise ConfigError(
                f"role {name}: {exc}", file=exp.source, key=key, hint=exc.hint
            ) from None
        if len(hosts) != 1:
            raise ConfigError(
                f"role {name}: '{where}' is a pool of {len(hosts)} hosts; a role runs on one host",
                file=exp.source,
                key=key,
                hint="name one host of the pool: " + ", ".join(h.name for h in hosts),
            )
        launch = exp.role_launch(name)
        out.append(RoleHost(name, hosts[0], service_name(launch), launch.unit))
    return out


def by_host(roles: list[RoleHost]) -> dict[str, list[RoleHost]]:
    """The roles grouped by host name, hosts in the order their first role starts."""
    out: dict[str, list[RoleHost]] = {}
    for r in roles:
        out.setdefault(r.host.name, []).append(r)
    return out


def hosts_of(args: argparse.Namespace) -> tuple[dict[str, list[RoleHost]], list[Host]]:
    """The roles of `--experiment` by host, and those hosts in start order."""
    exp = load(args.experiment)
    roles = by_host(role_hosts(args, exp, args.host))
    return roles, [rs[0].host for rs in roles.values()]


def restore_command(args: argparse.Namespace, experiment: str, host: str | None) -> str:
    """The command that restores every host of the deployment."""
    hosts = getattr(args, "hosts", None)
    return (
        "orchestrator restore"
        + (f" --host {shlex.quote(host)}" if host else "")
        + f" --experiment {shlex.quote(os.path.abspath(experiment))}"
        + (f" --hosts {shlex.quote(os.path.abspath(hosts))}" if hosts else "")
    )
