"""How the tests reach a real SSH host: address, key, known_hosts, and the `ssh` argv.

The project's own SSH transport is tested *against* these hosts, so the fixtures talk to
them with the OpenSSH client binary, always with host key checking on.
"""

from __future__ import annotations

# The same client the lab host offers: one definition of how tests reach an SSH host.
from orchestrator.lab.sshd import SshTarget  # noqa: E402

__all__ = ["SshTarget"]
