"""Events the core emits while it works; the CLI renders them. The core never prints.

A listener is any callable taking an `Event`. Events are small frozen records so a
listener can also log them line by line (overnight logs, CI) or forward them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.verdicts import Phase, Signature, Verdict


@dataclass(frozen=True)
class Event:
    host: str = ""


@dataclass(frozen=True)
class RunStarted(Event):
    run_id: str = ""
    label: str = ""  # e.g. "good + --ep-size 8"
    deadline_s: float = 0.0


@dataclass(frozen=True)
class StepDone(Event):
    """One step of the run sequence (stop, drop-in, daemon-reload, start, ...)."""

    step: str = ""
    detail: str = ""


@dataclass(frozen=True)
class PhaseReached(Event):
    phase: Phase = Phase.INIT
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class Polled(Event):
    state: str = ""
    http_code: int = 0
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class ProbeStarted(Event):
    command: str = ""


@dataclass(frozen=True)
class RunFinished(Event):
    run_id: str = ""
    verdict: Verdict = Verdict.INFRA
    signature: Signature | None = None
    duration_s: float = 0.0
    detail: str = ""


@dataclass(frozen=True)
class Notice(Event):
    """Something the user should know that is not a failure (a reconnect, a cache hit)."""

    message: str = ""
    extra: dict[str, object] = field(default_factory=dict)


Listener = Callable[[Event], None]


def null_listener(_: Event) -> None:
    """The default listener: ignores everything."""


@dataclass(frozen=True)
class CampaignStarted(Event):
    campaign_id: str = ""
    kind: str = "bisect"
    n_deltas: int = 0
    strategy: str = ""
    expected_runs: float = 0.0
    resumed_runs: int = 0
    deadline_s: float | None = None
    #: one start's time when the configs declare it (`expect.run_time`), else None
    run_time_s: float | None = None


@dataclass(frozen=True)
class RunRecorded(Event):
    """A run's verdict is in the store (executed now, reused from the cache, or resumed)."""

    run_id: str = ""
    label: str = ""
    purpose: str = ""
    verdict: Verdict = Verdict.INFRA
    signature: Signature | None = None
    source: str = "run"  # run | cache | resume
    duration_s: float = 0.0
    done: int = 0  # runs with a verdict so far in this campaign
    #: what the run's record says of how it ended (for `infra`: the host trouble)
    detail: str = ""


@dataclass(frozen=True)
class CampaignFinished(Event):
    campaign_id: str = ""
    status: str = ""
    message: str = ""


@dataclass(frozen=True)
class SearchSwitched(Event):
    """The runs showed that the failure is flaky: the search became noise-aware."""

    campaign_id: str = ""
    reason: str = ""
    #: the runs the whole campaign is now expected to take (None: not estimated)
    expected_runs: float | None = None
    done: int = 0
