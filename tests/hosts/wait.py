"""Bounded polling for tests: every wait has a deadline and a maximum number of tries."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    probe: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.2,
    describe: Callable[[], str] | None = None,
) -> T:
    """Call `probe` until it returns something truthy; fail with `what` (and `describe()`)."""
    deadline = time.monotonic() + timeout
    tries = max(1, int(timeout / interval) + 1) * 2
    for _ in range(tries):
        result = probe()
        if result:
            return result
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    detail = f"\n{describe()}" if describe else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")


def pgrep(pattern: str) -> list[str]:
    """The processes on this machine whose command line matches `pattern` (`pgrep -af`)."""
    res = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True, timeout=30)
    return res.stdout.splitlines()


def wait_gone(pattern: str, within: float = 10.0) -> list[str]:
    """Wait (bounded) until no process matches `pattern`; what is left at the deadline."""
    deadline = time.monotonic() + within
    left = pgrep(pattern)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = pgrep(pattern)
    return left
