"""Bounded polling for tests: every wait has a deadline and a maximum number of tries."""

from __future__ import annotations

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
