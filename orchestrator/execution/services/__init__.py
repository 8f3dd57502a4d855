"""Service managers: how a server is started, watched, stopped and restored on a host.

`systemd` edits nothing but a drop-in of the user's unit; `process` runs the server
detached from a shell (hosts without systemd, e.g. LXC containers). Both produce the
same observations (`Poll`) so the executor's readiness loop is one piece of code.
"""

from __future__ import annotations

from orchestrator.execution.services.base import Poll, ServiceManager, Started
from orchestrator.execution.services.process import ProcessManager
from orchestrator.execution.services.systemd import SystemdManager


def manager_for(host, transport, **kwargs) -> ServiceManager:  # noqa: ANN001
    if host.service_manager == "systemd":
        return SystemdManager(host, transport, **kwargs)
    return ProcessManager(host, transport, **kwargs)


__all__ = ["Poll", "ProcessManager", "ServiceManager", "Started", "SystemdManager", "manager_for"]
