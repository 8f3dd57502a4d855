"""The dispatch loop: runs in flight on a pool of hosts until the search wants no more.

Each pass asks what is wanted now (a key wanted twice runs twice), cancels the runs in
progress that a decided round no longer needs (newest first), hands on a verdict the
campaign has without a run (recorded, reused), starts what is missing on idle hosts, and
with `speculate` lets hosts left idle run ahead on what the search will want whatever the
runs in progress show. Then it waits for one run to end and hands its result back.

What a key is, what a verdict without a run is, and what a finished run becomes is the
campaign's side (`Source`): the loop only knows tasks, hosts and budgets, so a bisection
(variants) and a sweep (items) can both drive it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from orchestrator.campaign.pool import FlagsRefused, Pool, Task
from orchestrator.execution.contract import RunCancelled, RunResult


class Source(Protocol):
    """The campaign's side of the loop, for one drive. A key is what a task runs (`Task.key`:
    a variant, a sweep item)."""

    def obtain(self, key: Any) -> bool:
        """Hand on a verdict of `key` that needs no new run (recorded, reused), if there
        is one; True if it did (what is wanted may have changed)."""
        ...

    def budget(self, in_flight: int) -> str | None:
        """Why no run may start now that `in_flight` are in progress (a budget), or None."""
        ...

    def start(self, key: Any) -> Task:
        """The task that runs `key` now (a host is idle and no budget is spent)."""
        ...

    def blocked(self, key: Any) -> bool:
        """Whether `key` may not run ahead of the search now."""
        ...

    def known(self, key: Any) -> bool:
        """Whether a verdict of `key` is at hand without a run (running ahead stops)."""
        ...

    def start_ahead(self, key: Any) -> Task:
        """The task that runs `key` ahead of the search (purpose `speculative`)."""
        ...

    def finished(self, task: Task, result: RunResult) -> None:
        """Record a run that ended with a result and hand its verdict on."""
        ...


class Dispatch:
    """Runs on `pool` for what a source's search wants (see the module docstring)."""

    def __init__(self, pool: Pool, source: Source) -> None:
        self.pool = pool
        self.source = source

    def run(
        self, wanted: Callable[[], list[Any]], speculate: Callable[[int], list[Any]] | None = None
    ) -> str | None:
        """Drive until `wanted()` names nothing. Returns why it stopped early (a budget),
        or None."""
        pool, source = self.pool, self.source
        in_flight: dict[str, Task] = {}  # by run id: a variant wanted twice runs twice
        cancelled: set[str] = set()
        stop: str | None = None
        for _ in range(100_000):  # bounded: every pass records a verdict or waits for one
            want = wanted()
            need = Counter(want)
            have = Counter(t.key for r, t in in_flight.items() if r not in cancelled)
            missing = sum(max(0, c - have[v]) for v, c in need.items())
            ahead: list[Any] = []
            spare = len(pool.idle()) - missing
            if (
                speculate is not None
                and len(pool.healthy()) > 1
                and not stop
                and (spare > 0 or any(t.purpose == "speculative" for t in in_flight.values()))
            ):
                running = sum(1 for t in in_flight.values() if t.purpose == "speculative")
                ahead = speculate(max(spare, 0) + running)
            for rid, task in reversed(list(in_flight.items())):
                v = task.key
                if rid not in cancelled and have[v] > need[v] + (v in ahead):
                    pool.cancel(task)  # the round was decided without it (newest first)
                    cancelled.add(rid)
                    have[v] -= 1
            progressed = False
            for v in want:
                if have[v] >= need[v]:
                    continue
                if source.obtain(v):
                    progressed = True
                    break  # what is wanted may have changed
                stop = stop or source.budget(len(in_flight))
                if stop or not pool.idle():
                    break
                task = source.start(v)
                pool.submit(task)
                in_flight[task.run_id] = task
                have[v] += 1
            if progressed:
                continue
            for v in ahead:  # spare hosts run ahead; a verdict found later is reused
                if have[v] or not pool.idle() or source.blocked(v):
                    continue
                stop = stop or source.budget(len(in_flight))
                if stop or source.known(v):
                    break
                task = source.start_ahead(v)
                pool.submit(task)
                in_flight[task.run_id] = task
                have[v] += 1
            if not in_flight:
                return stop if want else None
            d = pool.wait()
            in_flight.pop(d.task.run_id, None)
            cancelled.discard(d.task.run_id)
            if d.result is None:
                if isinstance(d.error, RunCancelled):
                    continue
                if isinstance(d.error, FlagsRefused):
                    raise d.error  # about the config, not the host: no other host takes it
                # The last host stays in the pool whatever its error (a lock held by another
                # campaign, a missing unit): raise it, or the variant is resubmitted to the
                # same failing host again and again.
                if not pool.healthy() or d.host.name in {h.name for h in pool.healthy_hosts()}:
                    raise (
                        d.error
                        if isinstance(d.error, BaseException)
                        else RuntimeError("no host left in the pool")
                    )
                continue  # the host left the pool; another one takes the variant
            source.finished(d.task, d.result)
        raise RuntimeError("the campaign did not converge")


__all__ = ["Dispatch", "Source"]
