"""Starting and watching lab processes (server, bench) from Python: for tests and tools.

`LabProcess` runs `python -m orchestrator.lab.server ...` (or any lab module) with the
repository on PYTHONPATH, collects its stdout and stderr lines on background threads as
they arrive, and offers bounded waits (for a line, for the port, for the exit). `stop()`
always ends the process: SIGTERM, then SIGKILL after a grace period. Standard library only.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def http_get(port: int, path: str, host: str = "127.0.0.1", timeout: float = 2.0) -> int:
    """Status code of a GET, or 0 when nothing answered (refused, reset, timed out)."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, urllib.error.URLError):
        return 0


class LabProcess:
    """One lab module run as a child process, its output captured line by line."""

    def __init__(
        self,
        module: str,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
    ) -> None:
        self.argv = [python, "-m", module, *args]
        full_env = dict(os.environ)
        full_env.update(env or {})
        path = full_env.get("PYTHONPATH", "")
        full_env["PYTHONPATH"] = f"{REPO}{os.pathsep}{path}" if path else str(REPO)
        full_env["PYTHONUNBUFFERED"] = "1"
        self.env = full_env
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._cond = threading.Condition()
        self.proc: subprocess.Popen[str] | None = None
        self._pumps: list[threading.Thread] = []

    @classmethod
    def server(cls, args: Sequence[str], **kw: object) -> LabProcess:
        return cls("orchestrator.lab.server", args, **kw)  # type: ignore[arg-type]

    def start(self) -> LabProcess:
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=str(REPO),
        )
        for stream, sink in ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr)):
            t = threading.Thread(target=self._pump, args=(stream, sink), daemon=True)
            t.start()
            self._pumps.append(t)
        return self

    def _pump(self, stream: object, sink: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            with self._cond:
                sink.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for_line(self, text: str, timeout: float) -> bool:
        """True once a stdout line containing `text` has been printed (bounded wait)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not any(text in line for line in self.stdout):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
        return True

    def wait_healthy(self, port: int, timeout: float, path: str = "/health") -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if http_get(port, path, timeout=0.5) == 200:
                return True
            if self.proc is not None and self.proc.poll() is not None:
                return False
            time.sleep(0.02)
        return False

    def wait_exit(self, timeout: float) -> int | None:
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self._drain()
        return code

    def _drain(self) -> None:
        # The readers end at EOF; a grandchild holding the pipe must not block us forever.
        for t in self._pumps:
            t.join(timeout=2.0)

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def stop(self, grace: float = 5.0) -> int | None:
        """End the process whatever its state: SIGTERM, then SIGKILL after `grace` seconds."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=grace)
        self._drain()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        return self.proc.returncode

    @property
    def out(self) -> str:
        with self._cond:
            return "\n".join(self.stdout)

    @property
    def err(self) -> str:
        with self._cond:
            return "\n".join(self.stderr)

    def __enter__(self) -> LabProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def scenario_file(tmp_path_factory: object, text: str) -> Path:
    """A lab scenario written to a fresh temporary directory of the test session."""
    path = tmp_path_factory.mktemp("lab") / "scenario.yaml"  # type: ignore[attr-defined]
    path.write_text(text, encoding="utf-8")
    return path
