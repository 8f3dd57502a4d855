"""How the tests reach a real SSH host: address, key, known_hosts, and the `ssh` argv.

The project's own SSH transport is tested *against* these hosts, so the fixtures talk to
them with the OpenSSH client binary, always with host key checking on.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass(frozen=True)
class SshTarget:
    address: str
    port: int
    user: str
    identity_file: Path
    known_hosts: Path
    host_key_pub: str  # "ssh-ed25519 AAAA..." as the host serves it

    def ssh_options(self) -> list[str]:
        return [
            "-F", "/dev/null",  # the user's ~/.ssh/config must not change what we test
            "-p", str(self.port),
            "-i", str(self.identity_file),
            "-o", "IdentitiesOnly=yes",
            "-o", "IdentityAgent=none",
            "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "HostKeyAlgorithms=ssh-ed25519",
            "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=15",
            "-o", "LogLevel=ERROR",
        ]

    def ssh_command(self, *remote: str) -> list[str]:
        """`ssh` argv; the remote words are joined by ssh and run by the login shell."""
        return ["ssh", *self.ssh_options(), f"{self.user}@{self.address}", *remote]

    def ssh_run(
        self,
        command: str | Sequence[str],
        *,
        input: str | None = None,
        timeout: float = 60.0,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run `command` (a shell string, or an argv that is quoted here) over real ssh."""
        remote = command if isinstance(command, str) else shlex.join(command)
        res = subprocess.run(
            self.ssh_command(remote),
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and res.returncode != 0:
            raise AssertionError(
                f"ssh {self.user}@{self.address}: {remote!r} exited {res.returncode}\n"
                f"stdout: {res.stdout[-2000:]}\nstderr: {res.stderr[-2000:]}"
            )
        return res

    def hosts_entry(self, **extra: object) -> dict[str, object]:
        entry: dict[str, object] = {
            "address": self.address,
            "port": self.port,
            "user": self.user,
            "identity_file": str(self.identity_file),
            "known_hosts": str(self.known_hosts),
            "transport": "ssh",
        }
        entry.update(extra)
        return entry

    def hosts_yaml(self, name: str, **extra: object) -> str:
        return yaml.safe_dump({"hosts": {name: self.hosts_entry(**extra)}}, sort_keys=False)
