"""Transports run shell commands on a host: over SSH (fabric/paramiko) or locally.

They are the only code that touches paramiko, invoke or subprocess for host commands,
and they map those libraries' errors to `orchestrator.errors` at this one boundary.
"""

from __future__ import annotations

from orchestrator.execution.transport.base import CommandResult, Transport
from orchestrator.execution.transport.local import LocalTransport


def connect(host, **kwargs) -> Transport:  # noqa: ANN001
    """The transport a host's config asks for (not connected until the first command)."""
    if host.transport == "local":
        return LocalTransport(host)
    from orchestrator.execution.transport.ssh import SSHTransport

    return SSHTransport(host, **kwargs)


__all__ = ["CommandResult", "LocalTransport", "Transport", "connect"]
