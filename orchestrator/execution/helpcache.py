"""The help texts a server printed, kept on the controller per host and server build.

Reading a server's options costs a start of its CLI: vLLM's `vllm serve --help=all` imports
torch and the engine (15 s on an idle machine here, 40 s on a busy one). The text only
changes with the server's build, so the preflight (orchestrator.execution.preflight) asks
this cache first and pays that cost once per host, command and build, not once per
campaign. The build is what the environment capture read with the server's own interpreter
just before the run: the interpreter, the server's package and version, and the versions
of the key packages; without a known server version nothing is cached (a build that cannot
be told apart could be stale).

Entries are small JSON files under `$ORCH_HELP_CACHE`, else `~/.cache/orchestrator/help`.
A cache that cannot be read or written is no cache (the help is read on the host again).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


def default_dir() -> Path:
    return Path(
        os.environ.get("ORCH_HELP_CACHE") or Path.home() / ".cache" / "orchestrator" / "help"
    )


def build_of(environment: Any) -> str | None:
    """The server build an environment capture saw (None: not told apart); see
    `HostEnvironment.build`, which derives it from the record the verdict cache digests."""
    return None if environment is None else environment.build()


class HelpCache:
    """host + command + build -> the help pages read there."""

    def __init__(self, directory: Path | None = None) -> None:
        self.dir = directory or default_dir()

    def _path(self, host: str, exec_argv: tuple[str, ...], build: str) -> Path:
        key = json.dumps([host, list(exec_argv), build])
        return self.dir / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")

    def get(self, host: str, exec_argv: tuple[str, ...], build: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self._path(host, exec_argv, build).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and isinstance(data.get("help"), str) else None

    def put(self, host: str, exec_argv: tuple[str, ...], build: str, entry: dict[str, Any]) -> None:
        path = self._path(host, exec_argv, build)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(entry))
            tmp.replace(path)
        except OSError:
            pass  # no cache: the next campaign reads the help again
