"""A cancel that comes before a host's worker has started the task still stops it.

The campaign cancels a run whose answer no longer matters (the good config failed while
the bad one starts on another host). The worker thread makes its executor on its first
task and clears the executor's cancel event before each run: a cancel that came before
either was lost, and the run went on to its end (minutes of a real host). Fast tier: the
scripted executor, the executor's creation held until the cancel is in.
"""

from __future__ import annotations

import threading
from pathlib import Path

from orchestrator.campaign.pool import Pool, Task
from orchestrator.config.loading import load_experiment
from orchestrator.execution.contract import RunCancelled
from tests.support.scripted import Faults, Oracle, ScriptedExecutor, host, write_pair


def test_a_cancel_before_the_executor_exists_stops_the_task(tmp_path: Path) -> None:
    good, _ = write_pair(tmp_path / "exp", 2)
    exp = load_experiment(good)
    made = threading.Event()
    release = threading.Event()
    executors: list[ScriptedExecutor] = []

    def factory(h, *_):  # type: ignore[no-untyped-def]
        made.set()
        assert release.wait(timeout=30), "the test never released the factory"
        ex = ScriptedExecutor(h, Oracle([]), Faults())
        executors.append(ex)
        return ex

    with Pool(
        [host("h0")],
        service="u.service",
        campaign="c",
        executor_factory=factory,
        listener=lambda e: None,
    ) as pool:
        task = Task(key="bad", exp=exp, label="bad", run_id="c.1")
        assert pool.submit(task)
        assert made.wait(timeout=30)
        pool.cancel(task)  # the worker is still making its executor
        release.set()
        done = pool.wait()
    assert done.result is None and isinstance(done.error, RunCancelled), done
    assert executors and executors[0].runs == 0


def test_a_cancel_after_the_task_was_given_but_before_its_run_stops_it(tmp_path: Path) -> None:
    """The executor exists (a second task on the host): the cancel comes before the worker
    cleared the event for the new task."""
    good, _ = write_pair(tmp_path / "exp", 2)
    exp = load_experiment(good)
    opened = threading.Event()
    release = threading.Event()

    class HeldOpen(ScriptedExecutor):
        def open(self) -> HeldOpen:
            opened.set()
            assert release.wait(timeout=30), "the test never released the open"
            return self

    ex = HeldOpen(host("h0"), Oracle([]), Faults())
    with Pool(
        [host("h0")],
        service="u.service",
        campaign="c",
        executor_factory=lambda h, *_: ex,
        listener=lambda e: None,
    ) as pool:
        task = Task(key="bad", exp=exp, label="bad", run_id="c.1")
        assert pool.submit(task)
        assert opened.wait(timeout=30)
        pool.cancel(task)  # the executor is made; its event is cleared after the open
        release.set()
        done = pool.wait()
    assert done.result is None and isinstance(done.error, RunCancelled), done
    assert ex.runs == 0
