"""A submitted job watched until it ends, then what it left read back.

One command per poll (`scontrol show job`, the job's result so far, the server's log
tail; `sacct` when the controller has forgotten the job) with capped backoff. Time spent
pending is shown, never counted against the health deadline (the job script counts that
from the server's start); a job that can never start as asked is the campaign's
SchedulerError, one pending past `pending_timeout` or running past any bound is `infra`.
A cancel is honoured after one more look at the job. When the job has ended, its result
file, log, probe output, the node's environment and each node rank's log are read in one
command (`collect`).
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.diagnosis.classify.judge import last_phase
from orchestrator.diagnosis.logtail import keep_what_matters
from orchestrator.diagnosis.verdicts import PHASE_ORDER, Phase
from orchestrator.errors import InfraError, SchedulerError
from orchestrator.events import Listener, PhaseReached, Polled, StepDone
from orchestrator.execution.contract import LOG_FETCH_LINES, LOG_TAIL_LINES, RunCancelled
from orchestrator.execution.slurm import facts, jobscript, multinode
from orchestrator.execution.slurm.jobscript import JobFiles
from orchestrator.execution.transport import CommandResult, Transport

#: runs a Slurm client command on the login node: (command, timeout=...) -> its result
SlurmRunner = Callable[..., CommandResult]


@dataclass
class JobProgress:
    """What the watch saw of one job besides how it ended."""

    #: when the job was submitted (monotonic clock)
    t_submit: float
    #: seconds it waited in the queue (until it started, or so far)
    pending_s: float = 0.0
    polls: int = 0
    #: the furthest startup phase its server's log reached, and when (s after the start)
    phase: Phase | None = None
    phase_times: dict[str, float] = field(default_factory=dict)


@dataclass
class JobWatch:
    """The watch of one slot's jobs: the cluster's commands, the events, the pace."""

    host: Host
    slurm: SlurmRunner
    emit: Listener
    sleep: Callable[[float], None]
    cancel_event: threading.Event
    poll_min: float = 0.25
    poll_max: float = 1.0

    def watch(
        self, exp: Experiment, job: str, files: JobFiles, progress: JobProgress
    ) -> facts.JobState:
        """Poll until the job has ended; returns its final state (`progress` filled in)."""
        q = shlex.quote
        cmd = (
            f"scontrol show job -o {job} 2>&1 | grep -o "
            r"'\(JobState\|Reason\|NodeList\|ExitCode\|Restarts\)=[^ ]*'; "
            f"echo {facts.RESULT_MARK}; cat {q(files.path('result.tmp'))} "
            f"{q(files.result)} 2>/dev/null; echo {facts.LOG_MARK}; "
            f"tail -n 150 {q(files.log)} 2>/dev/null"
        )
        # A generous bound: the job's own time limit ends it first; this catches a
        # scheduler that lost the job's end.
        run_cap = exp.health.timeout + (exp.probe.timeout if exp.probe else 0) + 900
        opts = self.host.slurm
        assert opts is not None
        t_run: float | None = None
        delay = self.poll_min
        unknown = 0
        state = facts.JobState("")
        for _ in range(10_000_000):  # bounded by the deadlines below
            # a cancel is honoured after one more look at the job: one that has ended by
            # now is collected and recorded (a job of the campaign that completed is a run
            # of it), one that still runs is cancelled
            cancelled = self.cancel_event.is_set()
            r = self.slurm(cmd, timeout=60)
            progress.polls += 1
            parts = facts.split(r.stdout, facts.RESULT_MARK, facts.LOG_MARK)
            now = time.monotonic()
            got = facts.parse_scontrol(parts.get("", ""))
            if got is None:
                got = self.sacct(job)
            if got is None:
                unknown += 1  # just submitted, or purged: a few tries before giving up
                if unknown >= 5:
                    raise InfraError(f"the scheduler no longer knows job {job}")
            else:
                state = got
            result = jobscript.parse_result(parts.get(facts.RESULT_MARK, ""))
            if state.pending or not state.state:
                progress.pending_s = now - progress.t_submit
                self.emit(
                    Polled(
                        host=self.host.name,
                        state=f"pending {progress.pending_s:.0f}s ({state.reason or 'submitted'})",
                        elapsed_s=0.0,
                    )
                )
                if state.reason.replace(" ", "_") in facts.NEVER:
                    self.slurm(f"scancel {job}", timeout=60)
                    raise SchedulerError(
                        f"{self.host.describe()}: job {job} can never start as asked "
                        f"(Slurm: {state.reason})",
                        hint="check the slurm: options of this host in the hosts file",
                    )
                if progress.pending_s > opts.pending_timeout:
                    self.slurm(f"scancel {job}", timeout=60)
                    raise InfraError(
                        f"job {job} still pending after {opts.pending_timeout:g}s ({state.reason})"
                    )
            elif t_run is None:
                t_run = now
                progress.pending_s = now - progress.t_submit
                self.emit(
                    StepDone(
                        host=self.host.name,
                        step="started",
                        detail=f"job {job} on {state.node or '?'} after "
                        f"{progress.pending_s:.1f}s pending",
                    )
                )
            if t_run is not None:
                elapsed = now - t_run
                seen = last_phase(parts.get(facts.LOG_MARK, "").splitlines())
                if seen is not None and (
                    progress.phase is None or PHASE_ORDER[seen] > PHASE_ORDER[progress.phase]
                ):
                    progress.phase = seen
                    progress.phase_times.setdefault(seen.value, round(elapsed, 3))
                    self.emit(PhaseReached(host=self.host.name, phase=seen, elapsed_s=elapsed))
                ready = result.get("state") == "ready"
                self.emit(
                    Polled(
                        host=self.host.name,
                        state=state.state.lower(),
                        http_code=200 if ready else 0,
                        elapsed_s=elapsed,
                    )
                )
                if elapsed > run_cap and state.running:
                    self.slurm(f"scancel {job}", timeout=60)
                    raise InfraError(f"job {job} ran {elapsed:.0f}s, past its time limit")
            if state.state and not state.active:
                return state
            if cancelled:
                raise RunCancelled(f"run cancelled on {self.host.name}")
            self.sleep(delay)
            delay = min(delay * 1.5, self.poll_max)
        raise InfraError(f"job {job}: gave up watching")

    def sacct(self, job: str) -> facts.JobState | None:
        """The job's state from the accounting, once the controller has forgotten it."""
        r = self.slurm(
            f"sacct -n -P -X -j {job} -o State,ExitCode,NodeList,Reason 2>/dev/null", timeout=60
        )
        return facts.parse_sacct(r.stdout) if r.ok else None


def collect(t: Transport, host: Host, base: str, files: JobFiles, ranks: int = 0) -> dict[str, str]:
    """What an ended job left, read in one command: `result`, `log` (the tail and the
    tracebacks above it), `probe`, `env`, and `rank-K` for each of `ranks` node ranks.
    The secrets file goes, and only the newest `keep_runs` run directories under `base`
    stay on the cluster."""
    q = shlex.quote
    # Once copied, only the newest `keep_runs` run directories stay on the cluster (the
    # server's log holds its arguments, API keys included; the store keeps every run).
    keep = max(int(host.keep_runs), 1)
    r = t.run(
        f"cat {q(files.result)} 2>/dev/null || cat {q(files.path('result.tmp'))} "
        f"2>/dev/null; echo {facts.LOG_MARK}; tail -n {LOG_FETCH_LINES} {q(files.log)} "
        f"2>/dev/null; echo {facts.PROBE_MARK}; cat {q(files.probe)} 2>/dev/null; "
        f"echo {facts.ENV_MARK}; cat {q(files.environment)} 2>/dev/null; "
        + "".join(
            f"echo {multinode.rank_mark(k)}; tail -n {LOG_FETCH_LINES} "
            f"{q(files.path(f'rank-{k}.log'))} 2>/dev/null; "
            for k in range(ranks)
        )
        + f"rm -f {q(files.secrets)}; ls -1dt {q(base)}/*/ 2>/dev/null | "
        f'tail -n +{keep + 1} | while IFS= read -r d; do rm -rf -- "$d"; done; true',
        timeout=60,
    )
    marks = [multinode.rank_mark(k) for k in range(ranks)]
    parts = facts.split(r.stdout, facts.LOG_MARK, facts.PROBE_MARK, facts.ENV_MARK, *marks)
    # the tail, and the tracebacks above it (a server's shutdown noise can bury them)
    log = keep_what_matters(parts.get(facts.LOG_MARK, ""), LOG_TAIL_LINES)
    out = {
        "result": parts.get("", ""),
        "log": log,
        "probe": parts.get(facts.PROBE_MARK, ""),
        "env": parts.get(facts.ENV_MARK, ""),
    }
    for k, mark in enumerate(marks):
        out[f"rank-{k}"] = keep_what_matters(parts.get(mark, ""), LOG_TAIL_LINES)
    return out
