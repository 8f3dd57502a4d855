"""Host pools: run independent runs in parallel, one run per host at a time.

One worker thread per host owns that host's executor (its SSH connection, lock and
restore). The coordinator (the caller's thread) hands out tasks to idle hosts and
collects results; only the coordinator touches the results store. A host that fails
with host trouble several runs in a row is taken out of the pool for the campaign; its
task goes back to the queue for the others. Every host is restored when the pool closes.
A Slurm host (a cluster) has `max_jobs` slots, each a worker with one job at a time; the
cluster's scheduler decides where each job runs.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator import shield
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.diagnosis.verdicts import Signature, Verdict
from orchestrator.errors import ConfigError, InfraError, OrchestratorError
from orchestrator.events import Listener, Notice
from orchestrator.execution.contract import HostExecutor, RunCancelled, RunResult
from orchestrator.execution.inputs import LaunchInputs

UNHEALTHY_AFTER = 2  # infra verdicts in a row that take a host out of the pool
#: the longest a cache lookup waits for a host to read what would reach a server (opening
#: the host for the campaign included: lock, back-up, environment capture)
PROBE_WAIT_S = 600.0


class FlagsRefused(ConfigError):
    """A config's flags are refused by the server's own parser on a host (a dry parse:
    nothing was started). Every run of it would be `invalid`: the campaign stops before
    its first start, naming the file and what the server said."""

    campaign_status = "error"  # the campaign's record: stopped on a config error


def refused_flags(executor: HostExecutor, exp: Experiment) -> None:
    """Raise FlagsRefused when the host's server refuses `exp`'s flags, as the preflight
    decides it (orchestrator.execution.preflight: a trusted --help predicts, the server's
    own parser confirms); a help that is not trusted refuses nothing here."""
    pf = getattr(executor, "preflight", None)
    if pf is None:
        return
    # the build's own server is asked (its interpreter or image)
    check = pf.check(getattr(executor, "launch_of", lambda e: e)(exp))
    refusal = check.refusal
    if refusal is not None:
        raise FlagsRefused(
            f"on {executor.host.name}, before anything started: {refusal}",
            file=exp.source,
            # a deployment's check names the role whose own flags hold the refused one
            key=getattr(check, "key", "service.flags"),
            hint="correct the flag in the file (the server's own parser refused it)",
        )


@dataclass
class Task:
    key: Any  # what the caller uses to recognise the result (a variant, a sweep item)
    exp: Experiment
    label: str
    run_id: str
    target: Signature | None = None
    good_metric: float | None = None
    purpose: str = "search"  # why it runs: endpoint, search, confirm, speculative, ...
    attempts: int = 0
    #: configs whose flags the host's server must take before this host starts anything
    #: (a bisection's good and bad: every variant's flags are among theirs); checked once
    #: per host, see `refused_flags`
    precheck: tuple[Experiment, ...] = ()
    #: set by `cancel`: a cancel that comes before the host's worker has made its executor
    #: or cleared the executor's event for this task must still stop it
    cancelled: bool = False
    #: the repair move the start carries (`planner.repair.Applied.to_dict()`), recorded
    repair: dict[str, Any] | None = None
    #: configs whose builds must be installed on the host before it starts anything
    #: (an ordered search's builds; HostExecutor.check_build), checked once per host
    builds: tuple[Experiment, ...] = ()
    #: the answers check asks its prompts twice on this start (good's reference: the
    #: second pass measures the host's own disagreement)
    ask_twice: bool = False


@dataclass
class Done:
    task: Task
    host: Host
    result: RunResult | None
    error: BaseException | None = None
    worker: object = None  # the slot that ran it (a cluster host has several)


ExecutorFactory = Callable[[Host, str, str, Listener], HostExecutor]


@dataclass
class _Probe:
    """A question for a host's worker: what would reach this config's server now."""

    exp: Experiment
    reply: queue.Queue = field(default_factory=queue.Queue)


@dataclass
class _Worker:
    host: Host
    inbox: queue.Queue = field(default_factory=queue.Queue)
    thread: threading.Thread | None = None
    busy: Task | None = None
    infra_streak: int = 0
    healthy: bool = True
    opened: bool = False
    restored: list[str] = field(default_factory=list)
    left: list[str] | None = None  # what the restore read back as still there
    #: a deployment's executor: per host of its roles, what its restore read back
    left_by_host: dict[str, list[str] | None] | None = None
    executor: HostExecutor | None = None
    prechecked: set[str] = field(default_factory=set)  # fingerprints checked on this host


class Pool:
    def __init__(
        self,
        hosts: list[Host],
        *,
        service: str,
        campaign: str,
        executor_factory: ExecutorFactory,
        listener: Listener,
        env_keys: frozenset[str] = frozenset(),
    ) -> None:
        self.service = service
        self.campaign = campaign
        self.factory = executor_factory
        self.emit = listener
        self.env_keys = env_keys
        # A Slurm host is a cluster: `max_jobs` slots, each with one job at a time.
        self.workers = [
            _Worker(h) for h in hosts for _ in range(h.slurm.max_jobs if h.slurm is not None else 1)
        ]
        self.results: queue.Queue[Done] = queue.Queue()
        self.removed: list[tuple[str, str]] = []  # (host, why)
        self._lock = threading.Lock()

    # ---- lifecycle
    def __enter__(self) -> Pool:
        for w in self.workers:
            w.thread = threading.Thread(
                target=self._work, args=(w,), daemon=True, name=f"pool-{w.host.name}-{id(w):x}"
            )
            w.thread.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:
            self.cancel_all()  # Ctrl-C or an error: stop the runs in progress, then restore
        self.close()

    def close(self, timeout: float = 900.0) -> None:
        """Let each worker finish (restore its host and read it back). An interrupt that
        reaches this wait abandons the hosts as they are (the command line's signal handler
        lets only a third Ctrl-C through: see orchestrator.cli.signals); `left()` then says
        which hosts were not read back."""
        for w in self.workers:
            w.inbox.put(None)
        deadline = time.monotonic() + timeout
        with shield.shielded():  # a first interrupt now is raised once every host is restored
            for w in self.workers:
                while w.thread is not None and w.thread.is_alive() and time.monotonic() < deadline:
                    try:
                        w.thread.join(0.5)
                    except KeyboardInterrupt:
                        self.cancel_all()
                        raise

    def left(self) -> dict[str, list[str] | None]:
        """Per host that was opened: what its restore read back as still there (empty: as
        found), or None when it was not read back (abandoned, unreachable, still running)."""
        out: dict[str, list[str] | None] = {}
        for w in self.workers:
            if not w.opened:
                continue
            running = w.thread is not None and w.thread.is_alive()
            per_host = hosts_left(w.executor) if w.executor is not None else None
            if per_host is None or running:
                names = list(per_host) if per_host else [w.host.name]
                per_host = {h: None if running else w.left for h in names}
            for name, got in per_host.items():
                if name in out:
                    before = out[name]
                    got = None if before is None or got is None else before + got
                out[name] = got
        return out

    # ---- coordination
    def idle(self) -> list[_Worker]:
        return [w for w in self.workers if w.healthy and w.busy is None]

    def healthy(self) -> list[_Worker]:
        return [w for w in self.workers if w.healthy]

    def healthy_hosts(self) -> list[Host]:
        return [w.host for w in self.workers if w.healthy]

    def busy(self) -> list[Task]:
        return [w.busy for w in self.workers if w.busy is not None]

    def submit(self, task: Task) -> bool:
        """Give a task to an idle healthy host; False if none is idle."""
        idle = self.idle()
        if not idle:
            return False
        w = idle[0]
        w.busy = task
        task.attempts += 1
        task.cancelled = False
        w.inbox.put(task)
        return True

    def inputs_of(self, host: Host, exp: Experiment) -> LaunchInputs | None:
        """What would reach the server of `exp` on `host` if it started now, read on the
        host by its worker (opening the host for the campaign if it is not yet). None when
        no worker of the host is idle, or the host cannot tell: nothing is reused then."""
        w = next((w for w in self.idle() if w.host.name == host.name), None)
        if w is None:
            return None
        probe = _Probe(exp)
        w.inbox.put(probe)
        deadline = time.monotonic() + PROBE_WAIT_S
        while time.monotonic() < deadline:  # in slices: Ctrl-C gets through
            try:
                got = probe.reply.get(timeout=0.5)
            except queue.Empty:
                continue
            return got if isinstance(got, LaunchInputs) else None
        return None

    def cancel(self, task: Task) -> None:
        """Abandon a task in progress (its round was decided): the host stops the server at
        its next poll and reports RunCancelled."""
        task.cancelled = True  # before the executor is read: see `_work`
        for w in self.workers:
            if w.busy is task and w.executor is not None:
                w.executor.cancel_event.set()

    def cancel_all(self) -> None:
        for w in self.workers:
            if w.busy is not None:
                w.busy.cancelled = True
                if w.executor is not None:
                    w.executor.cancel_event.set()

    def wait(self) -> Done:
        """The next finished task (blocks, but lets Ctrl-C through). Marks its host idle."""
        while True:
            try:
                done = self.results.get(timeout=0.5)
                break
            except queue.Empty:
                continue
        w = next(
            w
            for w in self.workers
            if w is done.worker or (done.worker is None and w.host.name == done.host.name)
        )
        w.busy = None
        if done.result is not None and done.result.verdict is Verdict.INFRA:
            w.infra_streak += 1
            # A cluster's slot is no host of its own: its job's node failing says nothing
            # about the next job, which the scheduler places elsewhere.
            if (
                w.infra_streak >= UNHEALTHY_AFTER
                and len(self.healthy()) > 1
                and w.host.slurm is None
            ):
                w.healthy = False
                why = f"{w.infra_streak} runs in a row failed on host trouble: {done.result.detail}"
                self.removed.append((w.host.name, why))
                self.emit(
                    Notice(
                        host=w.host.name,
                        message=f"{w.host.name} taken out of the pool for this campaign: {why}",
                    )
                )
        elif done.result is not None:
            w.infra_streak = 0
        if isinstance(done.error, RunCancelled):
            return done
        # An error (not a verdict) would hit every run on this host: take it out, even the
        # last one, so that the caller stops instead of handing it the same task forever.
        if done.error is not None and w.healthy:
            w.healthy = False
            self.removed.append((w.host.name, str(done.error)))
            # A pool of one has nothing to take its host out of: its error stops the
            # campaign and is said once, as the error.
            if len({x.host.name for x in self.workers}) > 1:
                left = "" if self.healthy() else "; no host of the pool is left"
                self.emit(
                    Notice(
                        host=w.host.name,
                        message=f"{w.host.name} taken out of the pool: {done.error}{left}",
                    )
                )
        return done

    # ---- the worker thread
    def _answer(
        self, w: _Worker, executor: HostExecutor | None, probe: _Probe
    ) -> HostExecutor | None:
        """Answer a probe on the worker's thread (the only one that may use its host). It
        only reads: the host is not locked, prepared or restored for it (a campaign that
        reuses everything leaves the host's service alone)."""
        got: LaunchInputs | None = None
        try:
            if executor is None:
                executor = self.factory(w.host, self.service, self.campaign, self.emit)
                w.executor = executor
            read = getattr(executor, "inputs", None)  # a stand-in may not tell: unknown
            got = read(probe.exp) if read is not None else None
        except Exception:  # noqa: BLE001 (unknown inputs; the run that follows meets it)
            got = None
        finally:
            probe.reply.put(got)
        return executor

    def _work(self, w: _Worker) -> None:
        executor: HostExecutor | None = None
        try:
            while True:
                task = w.inbox.get()
                if task is None:
                    return
                if isinstance(task, _Probe):
                    executor = self._answer(w, executor, task)
                    continue
                try:
                    if executor is None:
                        executor = self.factory(w.host, self.service, self.campaign, self.emit)
                        w.executor = executor
                    if not w.opened:
                        executor.open()
                        w.opened = True
                    executor.cancel_event.clear()
                    # checked after the clear and after `w.executor` is set: a cancel either
                    # set the flag before this line or sets the event after the clear
                    if task.cancelled:
                        raise RunCancelled(f"run cancelled on {w.host.name} before its start")
                    for exp in (*task.builds, *task.precheck):
                        key = f"build:{exp.build}"
                        if (
                            exp.build is not None
                            and key not in w.prechecked
                            and hasattr(executor, "check_build")
                        ):
                            executor.check_build(exp)
                            w.prechecked.add(key)
                    for exp in task.precheck:
                        if exp.fingerprint() not in w.prechecked:
                            refused_flags(executor, exp)
                            w.prechecked.add(exp.fingerprint())
                    result = executor.run(
                        task.exp,
                        run_id=task.run_id,
                        label=task.label,
                        target=task.target,
                        env_keys=self.env_keys,
                        good_metric=task.good_metric,
                        # only when asked: an executor of another kind need not know it
                        **({"ask_twice": True} if task.ask_twice else {}),
                    )
                    self.results.put(Done(task, w.host, result, worker=w))
                except (OrchestratorError, InfraError, RunCancelled) as exc:
                    if executor is not None and not w.opened:
                        executor = None
                    self.results.put(Done(task, w.host, None, exc, worker=w))
                except BaseException as exc:  # noqa: BLE001 (reported to the coordinator)
                    self.results.put(Done(task, w.host, None, exc, worker=w))
        finally:
            if executor is not None and w.opened:
                try:
                    w.restored = executor.close()
                    w.left = getattr(executor, "left", None)
                    # a deployment restores each of its hosts on its own and goes on past
                    # one it cannot reach: the user must hear which, and how to finish
                    unread = [h for h, what in (hosts_left(executor) or {}).items() if what is None]
                    if unread:
                        failed = [d for d in w.restored or () if "restore failed" in d]
                        self.emit(
                            Notice(
                                host=w.host.name,
                                message=(
                                    f"{', '.join(unread)} could not be restored or read "
                                    "back: "
                                    + ("; ".join(failed) or "the restore was not read back")
                                    + "; once it is reachable: "
                                    + "; ".join(f"orchestrator restore --host {h}" for h in unread)
                                ),
                            )
                        )
                    elif w.left:  # the host read back shows what the restore did not undo
                        self.emit(
                            Notice(
                                host=w.host.name,
                                message=(
                                    f"{w.host.name} is not as it was found: "
                                    + "; ".join(w.left)
                                    + "; "
                                    + "; ".join(
                                        f"orchestrator restore --host {h}"
                                        for h in _unrestored(executor, w.host.name)
                                    )
                                    + " finishes it"
                                ),
                            )
                        )
                except BaseException as exc:  # noqa: BLE001
                    w.restored = [f"restore failed: {exc}"]
                    # The user must hear that the host is left as it is, and how to fix it.
                    self.emit(
                        Notice(
                            host=w.host.name,
                            message=(
                                f"{w.host.name} could not be restored: {exc}; "
                                "once it is reachable: "
                                + "; ".join(
                                    f"orchestrator restore --host {h}"
                                    for h in _unrestored(executor, w.host.name)
                                )
                            ),
                        )
                    )
            elif executor is not None:  # it only answered probes: nothing to restore
                try:
                    executor.close(restore=False)
                except Exception:  # noqa: BLE001 (a connection that is gone already)
                    pass


def hosts_left(executor: object) -> dict[str, list[str] | None] | None:
    """Per host, what an executor spread over several hosts (a deployment's) read back
    after its restore; None for an executor of one host."""
    got = getattr(executor, "hosts_left", None)
    return got() if callable(got) else None


def _unrestored(executor: object, host: str) -> list[str]:
    """The hosts an executor's restore left something on (or could not read): each needs
    its `restore --host`."""
    per_host = hosts_left(executor)
    if not per_host:
        return [host]
    return [h for h, what in per_host.items() if what is None or what] or [host]
