"""Where a deployment's roles run: each role on its host of the hosts file (else the
campaign's host), as the service its unit names (else `<service>-<role>`), and the checks
of a pair's roles against the hosts file before anything runs. Pure: it reads frozen
configs and the inventory."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from orchestrator.config.deployment import Role, launch, listens
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host, Inventory
from orchestrator.errors import ConfigError
from orchestrator.execution.executor import service_name


@dataclass(frozen=True)
class RoleSite:
    """Where a role runs: its host and its service (unit name or process key) there."""

    role: Role
    host: Host
    service: str


def sites(exp: Experiment, host: Host, inventory: Inventory | None) -> tuple[RoleSite, ...]:
    """Each role of `exp` (start order) on its host: the role's `host:` (which must be a
    host of the hosts file), else `host`; its service the role's unit, else
    `<service>-<role>`."""
    dep = exp.deployment()
    base = service_name(exp)
    if host.service_manager == "slurm":
        job_of_ranks(exp, host)
    out = []
    for name in dep.start_order:
        role = dep.role(name)
        where = host
        if host.service_manager == "slurm":
            # on a cluster the deployment is one job over its nodes (the Slurm executor's)
            if role.host is not None and role.host != host.name:
                raise ConfigError(
                    f"role {name} names host {role.host!r}, but the deployment runs on the "
                    f"Slurm cluster {host.name} as one job over its nodes",
                    file=exp.source,
                    key=f"roles.{name}.host",
                    hint="drop the role's host: to run it on the cluster, or give --host "
                    "an SSH host",
                )
            out.append(RoleSite(role, host, role.unit or f"{base}-{name}"))
            continue
        if role.host is not None and role.host != host.name:
            if inventory is None or role.host not in inventory.hosts:
                known = ", ".join(sorted(inventory.hosts)) if inventory else "(no hosts file)"
                raise ConfigError(
                    f"role {name} runs on host {role.host!r}, which the hosts file "
                    f"{inventory.source if inventory else ''} does not name (it has: {known})",
                    file=exp.source,
                    key=f"roles.{name}.host",
                    hint="add the host to the hosts file, or correct the role's host:",
                )
            where = inventory.host(role.host)
        if where.service_manager == "slurm":
            raise ConfigError(
                f"role {name} would run on {where.name}, a Slurm cluster: a deployment's "
                "roles run on systemd or process hosts",
                file=exp.source,
                key=f"roles.{name}.host",
            )
        out.append(RoleSite(role, where, role.unit or f"{base}-{name}"))
    _one_service_each(exp, out)
    return tuple(out)


def job_of_ranks(exp: Experiment, host: Host) -> None:
    """Refuse, before anything runs, a deployment the cluster `host` cannot run as one job
    over its nodes: roles other than node ranks, or jobs in a private network each."""
    from orchestrator.execution.slurm.multinode import node_roles

    node_roles(exp)
    if host.slurm is not None and host.slurm.private_network:
        raise ConfigError(
            f"a deployment's job needs the nodes' own network (srun reaches the other "
            f"nodes, the ranks meet at the first node's address), but {host.name} runs each "
            "job in a private network (slurm.private_network)",
            file=exp.source,
            key="roles",
            hint="run it on a Slurm host without slurm.private_network in the hosts file",
        )


def _machine(h: Host) -> tuple[object, ...]:
    """What one machine is to a service: one SSH endpoint (two hosts-file names of it are
    one systemd), and for detached servers also the run_dir that keys them."""
    return (
        h.transport,
        h.address,
        h.port if h.transport == "ssh" else 0,
        h.service_manager,
        h.run_dir if h.service_manager == "process" else None,
    )


def _one_service_each(exp: Experiment, where: list[RoleSite]) -> None:
    """Refuse two roles on one service of one machine: each role's drop-in, start and
    restore would be the other's."""
    seen: dict[tuple[object, ...], str] = {}
    for s in where:
        first = seen.setdefault((*_machine(s.host), s.service), s.role.name)
        if first != s.role.name:
            raise ConfigError(
                f"roles {first} and {s.role.name} would both run as {s.service} on "
                f"{s.host.name}: each role needs a unit of its own on its host",
                file=exp.source,
                key=f"roles.{s.role.name}.unit",
                hint="give the role a unit: of its own, or put it on another host:",
            )


def deployment_hosts(
    exps: Iterable[Experiment], host: Host, inventory: Inventory | None
) -> list[str]:
    """Every host a deployment of these configs touches (the campaign's first), for
    `restore --host H` lines."""
    names = [host.name]
    for exp in exps:
        if exp.roles:
            for s in sites(exp, host, inventory):
                if s.host.name not in names:
                    names.append(s.host.name)
    return names


def same_layout(exps: Mapping[str, Experiment]) -> None:
    """Refuse configs whose roles differ in name, host or unit: a variant takes good's
    roles, so a role added, moved or renamed by bad cannot be bisected."""
    items = list(exps.items())
    first_name, first = items[0]

    def layout(e: Experiment) -> list[tuple[str, str | None, str | None]]:
        return sorted((r.name, r.host, r.unit) for r in e.roles)

    for name, e in items[1:]:
        if layout(e) != layout(first):
            raise ConfigError(
                f"the roles of {name} ({_words(layout(e))}) differ from {first_name}'s "
                f"({_words(layout(first))}): a variant keeps every role on its host and unit",
                file=e.source,
                key="roles",
                hint="give both configs the same roles, hosts and units; differ only in flags",
            )


def _words(layout: list[tuple[str, str | None, str | None]]) -> str:
    return (
        ", ".join(f"{n}" + (f"@{h}" if h else "") + (f" ({u})" if u else "") for n, h, u in layout)
        or "none"
    )


def port_clash(exp: Experiment, where: Iterable[RoleSite]) -> str | None:
    """Why the roles of `exp` cannot all start: two that listen would bind one port of one
    machine (one host entry, or two entries reaching the same SSH endpoint), so the
    second dies with `address already in use`; None when every such port is its own."""
    seen: dict[tuple[str, str, int, int], str] = {}
    for s in where:
        if not listens(exp, s.role.name):
            continue
        port = launch(exp, s.role.name).port
        h = s.host
        machine = (h.transport, h.address, h.port if h.transport == "ssh" else 0, port)
        first = seen.setdefault(machine, s.role.name)
        if first != s.role.name:
            return (
                f"roles {first} and {s.role.name} both listen on port {port} of "
                f"{h.describe()}: the second could not bind it"
            )
    return None
