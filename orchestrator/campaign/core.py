"""What every campaign shares, whatever it searches: a bisection, a sweep, a single run.

One implementation of each concern: the campaign record created or resumed by its key, the
budgets (`--max-runs`, `--deadline`/`--until`), the streak of host trouble that stops a
campaign, a stored run presented again as a cache hit, the default executor, and the
handling of an interrupt or an error (the record's status, `Interrupted` carrying the
partial outcome, the campaign named on the error so that the CLI can print how to resume).
The kinds of campaign use it by composition: each holds a `CampaignCore`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from orchestrator.campaign import envwatch
from orchestrator.campaign.pool import Pool, hosts_left
from orchestrator.campaign.records import Status
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict
from orchestrator.errors import CampaignRef, InfraError, Interrupted, LockError, OrchestratorError
from orchestrator.events import CampaignFinished, Listener, RunRecorded, null_listener
from orchestrator.execution.backends import executor_for
from orchestrator.execution.contract import HostExecutor, RunResultLike
from orchestrator.execution.environment import HostEnvironment
from orchestrator.execution.hostlock import me
from orchestrator.execution.inputs import LaunchInputs
from orchestrator.store.store import CampaignRow, RunRow, Store

#: runs in a row that end in host trouble (per healthy host) before a campaign stops
MAX_INFRA_IN_A_ROW = 3

ExecutorFactory = Callable[[Host, str, str, Listener], HostExecutor]


class HostTrouble(InfraError):
    """Runs in a row ended in host trouble: the campaign stops, naming the host that was
    lost and the command that checks it (the CLI completes it with the files it ran
    with: the hosts file, a deployment's experiment)."""

    def __init__(self, message: str, *, host: str, deployment: bool = False) -> None:
        check = (
            "orchestrator hosts check --experiment CONFIG"
            if deployment
            else f"orchestrator hosts check {host}"
        )
        super().__init__(message, hint=f"check {host} with: {check}", host=host)
        #: the run was a deployment's: its hosts are checked with its config
        self.deployment = deployment


def default_executor(host: Host, service: str, campaign: str, listener: Listener) -> HostExecutor:
    return executor_for(host, service=service, campaign=campaign, listener=listener)


@dataclass(frozen=True)
class CachedResult:
    """A stored run presented as a RunResult, for recording a cache hit in a campaign."""

    experiment: Experiment
    label: str
    host: str
    host_class: str
    verdict: Verdict
    signature: Signature | None
    started_at: float
    duration_s: float
    phase_times: tuple[tuple[str, float], ...]
    last_phase: Phase | None
    log_tail: str
    rendered: str | None
    probe_metric: float | None
    detail: str
    #: the inputs of the campaign that reuses it (equal to its source's: its cache key)
    inputs: LaunchInputs | None = None
    #: what the run did on its host and the host's environment: the source run's, never
    #: recorded again for a reused run
    host_record: dict[str, object] | None = None
    environment: HostEnvironment | None = None

    @classmethod
    def from_row(
        cls,
        row: RunRow,
        label: str,
        host: Host,
        exp: Experiment | None = None,
        inputs: LaunchInputs | None = None,
    ) -> CachedResult:
        return cls(
            experiment=exp or row.experiment(),
            label=label,
            host=host.name,
            host_class=host.host_class,
            verdict=row.verdict,
            signature=row.signature,
            started_at=time.time(),
            duration_s=0.0,
            phase_times=tuple(row.phase_times.items()),
            last_phase=Phase(row.last_phase) if row.last_phase else None,
            log_tail="",
            rendered=row.rendered,
            probe_metric=row.probe_metric,
            detail=f"reused from run {row.id}" + (f": {row.detail}" if row.detail else ""),
            inputs=inputs,
        )


class CampaignCore:
    """One campaign's record and the rules every kind of campaign runs by."""

    def __init__(
        self,
        store: Store,
        *,
        kind: str,
        key: str,
        spec: Callable[[], dict[str, Any]],
        secrets: dict[str, str],
        command: str = "",
        resume_id: str | None = None,
        resumable: Callable[[CampaignRow], bool] | None = None,
        max_runs: int | None = None,
        deadline_s: float | None = None,
        listener: Listener = null_listener,
        executor_factory: ExecutorFactory = default_executor,
        find: bool = True,
    ) -> None:
        """Create the campaign record, or resume the one named (`resume_id`), or the
        unfinished one with the same key; `resumable` also accepts the newest campaign of
        the key when it says so (a sweep stopped by its budget goes on). Without `find`
        (`bisect --fresh`) only the one named is resumed: anything else starts anew."""
        self.store = store
        self.kind = kind
        self.max_runs = max_runs
        self.deadline_s = deadline_s
        self.emit = listener
        self.executor_factory = executor_factory
        store.add_secrets(secrets)
        cid = resume_id or (store.find_resumable(key) if find else None)
        if cid is None and resumable is not None and find:
            last = store.latest_campaign(key)
            if last is not None and resumable(last):
                cid = last.id
        self.resumed = cid is not None
        if cid is None:
            cid = store.create_campaign(kind=kind, key=key, command=command, spec=spec())
        # who runs it now: `runs --campaigns` calls a running campaign whose controller is
        # gone `dead`, and `runs --follow` finds its output
        self._previous_controller = store.campaign(cid).controller if self.resumed else None
        controller = {"owner": me(), "pid": os.getpid()} | store.controller_note
        store.update_campaign(cid, status="running", controller=controller)
        store.controlled.append(cid)
        self.cid: str = cid
        self.infra_streak = 0
        self._t0 = time.monotonic()
        #: what restores this campaign's hosts (pools, executors), read back after an interrupt
        self._restorers: list[Any] = []

    @property
    def ref(self) -> CampaignRef:
        """What names this campaign to whoever resumes it."""
        return CampaignRef(self.kind, self.cid)

    # ---- budgets
    def budget_spent(self, runs: int, *, deadline_reason: str | None = None) -> str:
        """Why no further run may start after `runs` counted ones, or ''."""
        if self.max_runs is not None and runs >= self.max_runs:
            return f"--max-runs {self.max_runs} reached"
        if self.deadline_s is not None and time.monotonic() - self._t0 >= self.deadline_s:
            return deadline_reason or f"--deadline {self.deadline_s:g}s reached"
        return ""

    # ---- host trouble
    def note_infra(
        self,
        verdict: Verdict,
        host: str,
        detail: str,
        healthy: int,
        *,
        deployment: bool = False,
    ) -> None:
        """Count runs in a row that ended in host trouble; too many stop the campaign.
        `host` is the host the run names (a deployment's: the role's host that was lost)."""
        if verdict is not Verdict.INFRA:
            self.infra_streak = 0
            return
        self.infra_streak += 1
        if self.infra_streak >= MAX_INFRA_IN_A_ROW * max(healthy, 1):
            raise HostTrouble(
                f"{self.infra_streak} runs in a row failed on host trouble; last on "
                f"{host}: {detail}",
                host=host,
                deployment=deployment,
            )

    # ---- running
    def pool(self, hosts: list[Host], *, service: str, env_keys: frozenset[str]) -> Pool:
        """The hosts as a pool: each host's executor opens (and restores first when a crashed
        controller left our drop-in behind) in its worker; leaving it restores every host."""
        pool = Pool(
            hosts,
            service=service,
            campaign=self.cid,
            executor_factory=self.executor_factory,
            listener=self.emit,
            env_keys=env_keys,
        )
        self._restorers.append(pool)
        return pool

    def track(self, executor: HostExecutor) -> HostExecutor:
        """An executor this campaign drives itself (no pool): its restore is read back too."""
        self._restorers.append(executor)
        return executor

    def left_on_hosts(self) -> dict[str, list[str] | None]:
        """Per host: what the restores read back as still there (None: not read back)."""
        out: dict[str, list[str] | None] = {}
        for r in self._restorers:
            per_host = hosts_left(r)
            if isinstance(r, Pool):
                out |= r.left()
            elif per_host is not None:
                out |= per_host
            elif getattr(r, "_opened", False):
                out[r.host.name] = None  # still open: its restore never ran
            else:
                out[r.host.name] = getattr(r, "left", None)
        return out

    @contextmanager
    def guard(self, partial: Callable[[], Any]) -> Iterator[None]:
        """Ctrl-C/SIGTERM/SIGHUP becomes `Interrupted` with `partial()` (the outcome so far)
        and what each host's restore read back; any of our errors marks the record (the
        error's `campaign_status`; `refused` when another campaign holds a host's lock;
        else `error`, host trouble included, which the same command resumes) and
        names this campaign on the error, so that the CLI can say how to resume it."""
        try:
            yield
        except KeyboardInterrupt:
            self.store.update_campaign(self.cid, status=Status.INTERRUPTED.value)
            self.emit(CampaignFinished(campaign_id=self.cid, status="interrupted"))
            raise Interrupted(self.ref, partial(), self.left_on_hosts()) from None
        except OrchestratorError as exc:
            if isinstance(exc, LockError):
                if exc.holder_campaign == self.cid:
                    # this campaign runs in another process: its record is that one's
                    self.store.update_campaign(
                        self.cid, status="running", controller=self._previous_controller
                    )
                    raise
                self.store.update_campaign(self.cid, status=Status.REFUSED.value)
                raise
            # host trouble is an error like any other (docs/verdicts.md): `interrupted` is
            # only what a signal (or a closed output) stopped
            self.store.update_campaign(
                self.cid, status=getattr(exc, "campaign_status", Status.ERROR.value)
            )
            if isinstance(exc, InfraError) and not isinstance(exc, envwatch.EnvironmentChanged):
                exc.resumable = self.ref  # the same command starts afresh after a change
            raise

    def record(self, result: RunResultLike, **how: Any) -> RunRow:
        """Store a run's result (an executed run: checked for a changed host environment);
        `how` is what `Store.add_run` takes besides the result (variant, purpose, ...)."""
        env_changed = None
        if how.get("cached_from") is None:
            result, env_changed = envwatch.check(self.store, self.cid, result)
        rid = self.store.add_run(self.cid, result=result, **how)
        if env_changed is not None:
            raise env_changed
        return self.store.run(rid)

    def recorded(
        self,
        row: RunRow,
        *,
        verdict: Verdict | None = None,
        purpose: str | None = None,
        source: str = "run",
        done: int,
    ) -> None:
        """Tell the listener about a recorded run (`done`: judged runs so far)."""
        self.emit(
            RunRecorded(
                host=row.host,
                run_id=row.id,
                label=row.label,
                purpose=purpose or row.purpose,
                verdict=verdict or row.verdict,
                signature=row.signature,
                source=source,
                duration_s=row.duration,
                done=done,
                detail=row.detail,
            )
        )

    def finish(
        self, status: str, *, message: str = "", stored_as: str | None = None, **fields: Any
    ) -> None:
        """Store how the campaign ended (`stored_as`, default `status`) and its answer, and
        tell the listener."""
        self.store.update_campaign(self.cid, status=str(stored_as or status), **fields)
        self.emit(CampaignFinished(campaign_id=self.cid, status=str(status), message=message))


__all__ = [
    "MAX_INFRA_IN_A_ROW",
    "CachedResult",
    "CampaignCore",
    "ExecutorFactory",
    "HostTrouble",
    "default_executor",
]
