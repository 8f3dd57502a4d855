"""The executor a host asks for: `SlurmExecutor` for a Slurm cluster's login node, else
`Executor` (systemd or a detached process over SSH or locally). Both honour the contract
of orchestrator.execution.contract, so a campaign drives them alike.
"""

from __future__ import annotations

from typing import Any

from orchestrator.config.hosts import Host
from orchestrator.execution.contract import HostExecutor
from orchestrator.execution.executor import Executor
from orchestrator.execution.slurm.executor import SlurmExecutor


def executor_for(host: Host, **kwargs: Any) -> HostExecutor:  # noqa: ANN401
    """The executor for `host` (keyword arguments as `Executor`'s: service, campaign,
    listener, transport, ...)."""
    if host.service_manager == "slurm":
        return SlurmExecutor(host, **kwargs)
    return Executor(host, **kwargs)
