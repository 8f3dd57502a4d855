"""A scripted host whose state the test reads back, and signals to the controller at steps.

`HostTruth` is what a host shows (our drop-in, the unit's state against the one it was
found in, our lock). `RestoringExecutor` changes it step by step as the real executor
changes a systemd host (lock, drop-in, start; restore: stop, remove the drop-in, reload,
start again if it was running, release the lock) and reads it back after the restore as
the real one does (`left`). Before each step, `SignalPlan` may send this process a signal
(SIGINT, SIGHUP, SIGTERM) as a user or a closing terminal would, at a moment drawn by the
test: the signal reaches the main thread, where the command line's handler runs, while the
host's worker thread goes on, as on a real controller.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.diagnosis.verdicts import Signature, Verdict
from orchestrator.events import Listener
from orchestrator.execution.contract import RunResult
from tests.support.scripted import Faults, Oracle, ScriptedExecutor


@dataclass
class HostTruth:
    """One scripted host as it is, for the test to read back."""

    found: str = "active"  # the unit's state when the campaign found it
    unit: str = "active"
    dropin: bool = False
    lock: bool = False
    lock_: threading.Lock = field(default_factory=threading.Lock)

    def as_found(self) -> bool:
        with self.lock_:
            return not self.dropin and not self.lock and self.unit == self.found

    def left(self) -> list[str]:
        with self.lock_:
            out = ["drop-in"] if self.dropin else []
            out += [f"unit {self.unit}, found {self.found}"] if self.unit != self.found else []
            return out + (["lock"] if self.lock else [])


@dataclass
class SignalPlan:
    """Signals to send this process before given steps (steps counted over every host)."""

    at: dict[int, list[signal.Signals]]
    pause_s: float = 0.001  # each step's time on the "host": lets signals land in between
    sent: list[signal.Signals] = field(default_factory=list)
    armed: bool = True
    steps: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def step(self) -> None:
        with self.lock:
            self.steps += 1
            due = self.at.get(self.steps, []) if self.armed else []
            for sig in due:
                self.sent.append(sig)
                os.kill(os.getpid(), sig)
        time.sleep(self.pause_s)

    def disarm(self) -> None:
        """No signal after this (a restore abandoned in the background goes on quietly)."""
        with self.lock:
            self.armed = False


class RestoringExecutor(ScriptedExecutor):
    """A scripted executor over a `HostTruth`, stepping through what the real one does."""

    def __init__(
        self,
        host: Host,
        oracle: Oracle,
        faults: Faults,
        truth: HostTruth,
        plan: SignalPlan,
        listener: Listener | None = None,
    ) -> None:
        super().__init__(host, oracle, faults, listener)
        self.truth = truth
        self.plan = plan
        self.left: list[str] | None = None
        self._opened = False

    def _set(self, **state: object) -> None:
        self.plan.step()
        with self.truth.lock_:
            for k, v in state.items():
                setattr(self.truth, k, v)

    def open(self) -> RestoringExecutor:
        self._set(lock=True)
        self._opened = True
        return self

    def run(
        self,
        exp: Experiment,
        *,
        run_id: str,
        label: str = "",
        target: Signature | None = None,
        env_keys: Iterable[str] = (),
        good_metric: float | None = None,
    ) -> RunResult:
        self._set(unit="inactive")  # stop, reset-failed
        self._set(dropin=True)  # the variant's drop-in, daemon-reload
        self._set(unit="active")  # started
        result = super().run(
            exp,
            run_id=run_id,
            label=label,
            target=target,
            env_keys=env_keys,
            good_metric=good_metric,
        )
        self._set(unit="active" if result.verdict is Verdict.PASS else "failed")
        return result

    def close(self, *, restore: bool = True) -> list[str]:
        self.left = None
        if not self._opened:
            self.left = []
            return []
        if restore:
            self._set(unit="inactive")  # stop
            self._set(dropin=False)  # rm, daemon-reload, reset-failed
            if self.truth.found == "active":
                self._set(unit="active")  # started again with its own configuration
        self._set(lock=False)
        self.plan.step()  # the read-back
        self.left = self.truth.left()
        self._opened = False
        return ["restored"]


def factory(
    oracle: Oracle,
    truths: dict[str, HostTruth],
    plan: SignalPlan,
) -> Callable[..., RestoringExecutor]:
    def make(host: Host, service: str, campaign: str, listener: Listener) -> RestoringExecutor:
        return RestoringExecutor(host, oracle, Faults(), truths[host.name], plan, listener)

    return make


__all__ = ["HostTruth", "RestoringExecutor", "SignalPlan", "factory"]
