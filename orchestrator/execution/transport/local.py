"""The local transport: commands run on this machine through `sh -c` (subprocess)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from orchestrator.errors import CommandTimeout, TransportError
from orchestrator.execution.transport.base import CommandResult, Transport


class LocalTransport(Transport):
    def _exec(self, command: str, *, timeout: float, stdin: str | None) -> CommandResult:
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                ["sh", "-c", command],
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                # Explicit, not the locale's: commands' output is decoded the same way
                # everywhere, and a stray non-UTF-8 byte must not raise mid-campaign.
                encoding="utf-8",
                errors="replace",
                start_new_session=True,  # so a timeout can kill the whole process group
            )
        except OSError as exc:
            raise TransportError(f"{self.host.describe()}: cannot start sh: {exc}") from exc
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            raise CommandTimeout(
                f"{self.host.describe()}: command did not finish in {timeout:g}s"
            ) from None
        return CommandResult(command, proc.returncode, out, err, time.monotonic() - start)
