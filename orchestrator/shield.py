"""Sections that an interrupt must not cut short: a host's restore, and the wait for it.

A Ctrl-C (or SIGTERM, SIGHUP) that arrives while the main thread restores a host, or waits
for the threads that restore the hosts, is deferred: the section runs to its end (the host
is restored and read back), then the interrupt is raised. The command line's signal
handler (orchestrator.cli.signals) asks `active()` and calls `defer()`; a handler that
means to abandon the hosts raises anyway. Only the main thread runs signal handlers, so
only its sections count.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_state = {"depth": 0, "pending": False}


def active() -> bool:
    """True while the main thread is inside a shielded section."""
    return _state["depth"] > 0


def defer() -> None:
    """Raise KeyboardInterrupt when the outermost shielded section ends."""
    _state["pending"] = True


@contextmanager
def shielded() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _state["depth"] += 1
    try:
        yield
    except BaseException:
        _state["depth"] -= 1
        if _state["depth"] == 0:
            _state["pending"] = False  # what ends the section early wins (an abandon, an error)
        raise
    _state["depth"] -= 1
    if _state["depth"] == 0 and _state["pending"]:
        _state["pending"] = False
        raise KeyboardInterrupt


__all__ = ["active", "defer", "shielded"]
