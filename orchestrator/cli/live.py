"""Rendering campaign and run events: a live status line on a terminal, plain lines otherwise.

The core only emits events; this listener is the campaign's face. Each finished run gets
one permanent line (verdict, variant, signature, duration); while a run is in progress a
terminal shows its variant, startup phase and elapsed time against the deadline.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape

from orchestrator.campaign.timing import duration_text
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.events import (
    CampaignStarted,
    Event,
    Notice,
    PhaseReached,
    Polled,
    ProbeStarted,
    RunFinished,
    RunRecorded,
    RunStarted,
    SearchSwitched,
    StepDone,
)

COLORS = {
    Verdict.PASS: "green",
    Verdict.FAIL: "red",
    Verdict.OTHER: "magenta",
    Verdict.TIMEOUT: "yellow",
    Verdict.INVALID: "cyan",
    Verdict.INFRA: "yellow",
}


def verdict_text(v: Verdict) -> str:
    return f"[{COLORS[v]}]{v.value:<7}[/]"


class LiveView:
    def __init__(self, console: Console, *, verbose: bool = False) -> None:
        self.c = console
        self.verbose = verbose
        self.tty = console.is_terminal
        self.status = None
        self.expected = 0.0
        self.done = 0
        self.deadline: float | None = None
        self.t0 = time.monotonic()
        self.label = ""
        self.phase = ""
        self.run_t0 = 0.0
        self.run_deadline = 0.0
        #: one start's time as known before the campaign (declared or learned), else None
        self.run_time_s: float | None = None
        #: the times of the starts executed in this campaign (not reused, not resumed)
        self.took: list[float] = []

    def per_start(self) -> float | None:
        """One start's time: the mean of this campaign's starts, else what was known."""
        if self.took:
            return sum(self.took) / len(self.took)
        return self.run_time_s

    def to_answer(self) -> str:
        """The revised estimate of the time left to the answer, in words ('' if unknown)."""
        each = self.per_start()
        if each is None or not self.expected:
            return ""
        left = max(self.expected - self.done, 1.0) * each
        return f"~{duration_text(left)} to the answer"

    def __call__(self, e: Event) -> None:
        if isinstance(e, CampaignStarted):
            self.expected = e.expected_runs
            self.deadline = e.deadline_s
            self.run_time_s = e.run_time_s or self.run_time_s
            resumed = f", resuming with {e.resumed_runs} recorded runs" if e.resumed_runs else ""
            if e.kind == "sweep":  # n_deltas counts the sweep's configs
                self.c.print(
                    f"sweep campaign [bold]{e.campaign_id}[/]: {e.n_deltas} configs, "
                    f"{e.expected_runs:.0f} runs{resumed}",
                    highlight=False,
                )
                return
            each = self.per_start()
            hours = (
                f" (about {duration_text(e.expected_runs * each)} at {duration_text(each)} a start)"
                if each
                else ""
            )
            self.c.print(
                f"campaign [bold]{e.campaign_id}[/]: {e.n_deltas} "
                f"{'delta' if e.n_deltas == 1 else 'deltas'}, strategy {e.strategy}, "
                f"about {e.expected_runs:.0f} runs expected{hours}{resumed}",
                highlight=False,
            )
        elif isinstance(e, RunStarted):
            self.label, self.phase = e.label, "starting"
            self.run_t0, self.run_deadline = time.monotonic(), e.deadline_s
            if self.tty:
                if self.status is None:
                    self.status = self.c.status("")
                    self.status.start()
                self._refresh()
            else:
                self.c.print(f"  run {e.run_id} on {e.host}: {escape(e.label)}", highlight=False)
        elif isinstance(e, PhaseReached):
            self.phase = e.phase.value
            if self.tty:
                self._refresh()
            elif self.verbose:
                self.c.print(f"    phase {e.phase.value} at {e.elapsed_s:.1f}s", highlight=False)
        elif isinstance(e, Polled):
            if e.state.startswith("pending"):
                # a queued job (Slurm): shown, and its clock against the health deadline
                # starts only when the job does
                self.phase, self.run_t0 = e.state, time.monotonic()
            if self.tty:
                self._refresh()
        elif isinstance(e, ProbeStarted):
            self.phase = "probe"
            if self.tty:
                self._refresh()
            elif self.verbose:
                self.c.print(f"    probe: {escape(e.command)}", highlight=False)
        elif isinstance(e, StepDone):
            if e.step == "started" and self.phase.startswith("pending"):
                self.phase, self.run_t0 = "starting", time.monotonic()
            if self.tty:
                self._refresh(step=e.step)
            if e.step in ("restore", "waiting", "restarting") or self.verbose:
                self.c.print(f"  {e.host}: {escape(e.step)}: {escape(e.detail)}", highlight=False)
        elif isinstance(e, RunFinished):
            self._stop_status()
        elif isinstance(e, RunRecorded):
            self._stop_status()
            self.done = e.done
            if e.source == "run" and e.duration_s > 0:
                self.took.append(e.duration_s)
            sig = f"  {escape(str(e.signature))}" if e.signature else ""
            src = {"cache": " (cached)", "resume": " (recorded)"}.get(e.source, "")
            # the run's number as stored (a resumed campaign shows its recorded runs again)
            seq = e.run_id.rpartition(".")[2] if e.run_id else str(e.done)
            self.c.print(
                f"{seq:>3}. {verdict_text(e.verdict)} {escape(e.label)}"
                f"[dim]{sig}  {e.duration_s:.0f}s {e.run_id}{src}[/]",
                highlight=False,
            )
            if e.verdict is Verdict.INFRA and e.detail and e.source == "run":
                # said as it happens: a lost host's runs end long before the campaign does
                self.c.print(f"     host trouble on {e.host}: {escape(e.detail)}", highlight=False)
        elif isinstance(e, Notice):
            self.c.print(f"  note: {escape(e.message)}", highlight=False)
        elif isinstance(e, SearchSwitched):
            self.c.print(f"[bold yellow]flaky[/]: {escape(e.reason)}", highlight=False)
            if e.expected_runs is not None:
                was = self.expected
                self.expected = e.expected_runs
                more = max(e.expected_runs - e.done, 1.0)
                each = self.per_start()
                cost = f", about {duration_text(more * each)}" if each else ""
                self.c.print(
                    f"  the noise-aware search costs about {more:.0f} more runs{cost} "
                    f"(about {e.expected_runs:.0f} in all, was {was:.0f})",
                    highlight=False,
                )

    def _refresh(self, step: str = "") -> None:
        if self.status is None:
            return
        now = time.monotonic()
        total = f" | campaign {duration_text(now - self.t0)}" + (
            f"/{duration_text(self.deadline)}" if self.deadline else ""
        )
        left = self.to_answer()
        total += f", {left}" if left else ""
        self.status.update(
            f"run {self.done + 1}/~{max(self.expected, self.done + 1):.0f}: {escape(self.label)}"
            f" | {self.phase or step} {now - self.run_t0:.0f}s/{self.run_deadline:.0f}s{total}"
        )

    def _stop_status(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None

    def close(self) -> None:
        self._stop_status()
