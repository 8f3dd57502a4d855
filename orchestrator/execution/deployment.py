"""A deployment's executor: one run of an experiment whose roles are units on several hosts.

`DeploymentExecutor` is composed of one ordinary `Executor` per role (its host: the role's
`host:` in the hosts file, else the campaign's host; its service: the role's `unit:`, else
`<service>-<role>`). Each member keeps what it owns: its transport, service manager, lock,
back-up, preflight and restore; this module only orders them and judges the whole:

- `open()`: every member opens in start order (those opened are restored when one fails),
  then each host's clock offset is measured over its own transport (host clock minus
  controller clock, at the midpoint of a `date` round trip);
- `run()`: a variant whose roles split a flag they must agree on is `invalid`, never
  started; else every role is stopped (stop order), installed by its own member (its port
  checked when it serves one: `config.deployment.listens`), started in start order and
  polled each round (one command per host); health and readiness are read on the health
  role only, which also takes the answers check and the probe; after them every role is
  polled once more (a role that died under their requests failed first, whatever the
  router answered meanwhile). When a
  role dies, the others get a short bounded grace for their last lines; then every role
  is stopped, every role's log fetched and judged alone, and `first_failure` names the
  role that failed first on the controller's clock (`roles.py` builds the record);
- `close()`: every member restores its host in stop order.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from orchestrator import shield
from orchestrator.config.deployment import launch, listens, refusal
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host, Inventory
from orchestrator.diagnosis.classify.judge import RunEvidence, last_phase
from orchestrator.diagnosis.logtail import keep_what_matters
from orchestrator.diagnosis.verdicts import PHASE_ORDER, Signature, Verdict
from orchestrator.errors import InfraError, ServiceError, TransportError
from orchestrator.events import (
    Listener,
    PhaseReached,
    Polled,
    RunStarted,
    StepDone,
    null_listener,
)
from orchestrator.execution.contract import (
    LOG_FETCH_LINES,
    LOG_TAIL_LINES,
    HostExecutor,
    RunCancelled,
    RunResult,
)
from orchestrator.execution.deployment_sites import (
    RoleSite,
    deployment_hosts,
    port_clash,
    same_layout,
    sites,
)
from orchestrator.execution.executor import Executor, _Watch
from orchestrator.execution.roles import (
    RoleOutcome,
    judge_roles,
    offset_command,
    parse_now,
    poll_sections,
)
from orchestrator.execution.services import Started

#: seconds the other roles are still watched after one died: their last lines (a
#: watchdog's report, a peer's loss) are part of the story, not the cause
DEATH_GRACE_S = 5.0
#: the poll's pace (seconds), as a single executor's
POLL_MIN_S, POLL_MAX_S = 0.25, 1.0

MemberFactory = Callable[[Host, str], Executor]


@dataclass
class _Member:
    site: RoleSite
    ex: Executor
    launch: Experiment | None = None
    started: Started | None = None
    watch: _Watch = field(default_factory=_Watch)
    #: why it never joined (start failed), and whether that was host trouble
    absent: str | None = None
    infra: bool = False
    died_host_time: float | None = None
    rendered: str | None = None
    log: str = ""

    @property
    def name(self) -> str:
        return self.site.role.name


class _RolesCheck:
    """The preflight's answer over every role: the first refusal, named by its role, and
    the config key that holds the refused flag (the role's own flags, else the shared)."""

    def __init__(self, refusal: str | None, key: str = "service.flags") -> None:
        self.refusal = refusal
        self.key = key


class _RolesPreflight:
    """`preflight.check(exp)` for a deployment: each role's launch put to its own
    member's preflight (the server on that role's host)."""

    def __init__(self, owner: DeploymentExecutor) -> None:
        self.owner = owner

    def check(self, exp: Experiment, build: object = None) -> _RolesCheck:
        for m in self.owner.members:
            one = launch(exp, m.name)
            got = m.ex.preflight.check(m.ex.launch_of(one))
            if got.refusal is not None:
                own = {k for k, _ in exp.deployment().role(m.name).flags}
                refused = {p.flag.lstrip("-").split("=", 1)[0] for p in got.predicted}
                key = f"roles.{m.name}.flags" if refused & own else "service.flags"
                return _RolesCheck(f"role {m.name} on {m.site.host.name}: {got.refusal}", key)
        return _RolesCheck(None)


class DeploymentExecutor(HostExecutor):
    """Runs the variants of a deployment: one member executor per role."""

    def __init__(
        self,
        host: Host,
        roles: tuple[RoleSite, ...],
        *,
        health_role: str,
        service: str,
        make_member: MemberFactory,
        campaign: str = "",
        listener: Listener = null_listener,
        start_mismatched: bool | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.host = host
        self.service = service
        self.campaign = campaign
        self.emit = listener
        self.health_role = health_role
        #: None: each variant's own `mismatched_roles`; True/False: the campaign's choice
        self.start_mismatched = start_mismatched
        self.sleep, self.clock, self.wall_clock = sleep, clock, wall_clock
        self.grace_s = DEATH_GRACE_S
        self.members = [_Member(s, make_member(s.host, s.service)) for s in roles]
        health = self._member(health_role)
        self.t = health.ex.t
        self.preflight = _RolesPreflight(self)  # type: ignore[assignment]
        self.cancel_event = threading.Event()
        self.left: list[str] | None = None
        #: per host: what its members' restores read back as left (None: not read back)
        self.left_by_host: dict[str, list[str] | None] = {}
        #: host name -> host clock minus controller clock, seconds (measured at open)
        self.offsets: dict[str, float] = {}
        #: host name -> its UTC offset, seconds (its log stamps are local time)
        self.utc_offsets: dict[str, float] = {}
        self._inputs_memo = {}
        self._opened: list[_Member] = []
        self._mark = "@@ROLE-" + secrets.token_hex(4)

    def hosts_left(self) -> dict[str, list[str] | None]:
        """Per host of the roles: what its restore read back (None: not read back, or
        still open)."""
        names = list(dict.fromkeys(m.site.host.name for m in self.members))
        if self._opened:
            return dict.fromkeys(names)
        return {h: self.left_by_host.get(h, []) for h in names}

    def _member(self, name: str) -> _Member:
        return next(m for m in self.members if m.name == name)

    # ---- campaign scope
    def open(self) -> DeploymentExecutor:
        """Open every member in start order; on a failure restore those opened. Then
        measure each host's clock offset over its transport."""
        try:
            for m in self.members:
                m.ex.open()
                self._opened.append(m)
            for m in self.members:
                if m.site.host.name not in self.offsets:
                    self.offsets[m.site.host.name] = self._offset(m.ex)
        except BaseException:
            self.close()
            raise
        return self

    def _offset(self, ex: Executor) -> float:
        before = self.wall_clock()
        r = ex.t.run(offset_command(), timeout=30)
        after = self.wall_clock()
        got = parse_now(r.stdout)
        if got is None:
            raise InfraError(
                f"{ex.host.describe()}: cannot read its clock (`date +%s.%N`): "
                f"{(r.stderr or r.stdout).strip()[-200:]}"
            )
        self.utc_offsets[ex.host.name] = got[1]
        return got[0] - (before + after) / 2

    def close(self, *, restore: bool = True) -> list[str]:
        """Restore every member in stop order; `left` is the union of what each read
        back, each line prefixed with its host (None when a host could not be read)."""
        done: list[str] = []
        by_host: dict[str, list[str] | None] = {}
        with shield.shielded():
            for m in reversed(self.members):
                opened = m in self._opened
                try:
                    if opened or not restore:
                        done += [f"{m.site.host.name}: {d}" for d in m.ex.close(restore=restore)]
                    else:
                        m.ex.close(restore=False)
                except Exception as exc:  # noqa: BLE001 (the others are restored still)
                    done.append(f"{m.site.host.name}: restore failed: {exc}")
                    m.ex.left = None
                if not opened:
                    continue
                name = m.site.host.name
                got = m.ex.left
                before = by_host.get(name, [])
                by_host[name] = (
                    None
                    if got is None or before is None
                    else before + [f"{m.name}: {x}" for x in got]
                )
        self._opened = []
        self.left_by_host = by_host
        if any(v is None for v in by_host.values()):
            self.left = None
        else:
            self.left = [f"{h}: {line}" for h, lines in by_host.items() for line in lines or []]
        return done

    # ---- reads and checks, role by role
    def launch_of(self, exp: Experiment) -> Experiment:
        return exp  # each member applies its role's build to its own launch

    def check_build(self, exp: Experiment) -> None:
        for m in self.members:
            m.ex.check_build(launch(exp, m.name))

    def check_port(self, exp: Experiment) -> None:
        for m in self.members:
            if listens(exp, m.name):
                m.ex.check_port(m.ex.launch_of(launch(exp, m.name)))

    def environment(self, exp: Experiment):  # noqa: ANN201 (the member's type)
        return self._member(self.health_role).ex.environment(launch(exp, self.health_role))

    def inputs(self, exp: Experiment):  # noqa: ANN201
        return self._member(self.health_role).ex.inputs(launch(exp, self.health_role))

    def parser_facts(self, exp: Experiment):  # noqa: ANN201
        return self._member(self.health_role).ex.parser_facts(launch(exp, self.health_role))

    # ---- one run
    def run(
        self,
        exp: Experiment,
        *,
        run_id: str,
        label: str = "",
        target: Signature | None = None,
        env_keys: Iterable[str] = (),
        good_metric: float | None = None,
        ask_twice: bool = False,
    ) -> RunResult:
        exp = exp.unsetting(env_keys)
        keys = frozenset(env_keys)
        for m in self.members:
            vars(m).update(vars(_Member(m.site, m.ex)))  # a run starts with a clean slate
            m.launch = launch(exp, m.name)
        health = self._member(self.health_role)
        started_at = self.wall_clock()
        t0 = self.clock()
        self.emit(
            RunStarted(
                host=self.host.name, run_id=run_id, label=label, deadline_s=exp.health.timeout
            )
        )
        refused = refusal(exp, start=self.start_mismatched)
        if refused is not None:
            return self._end(exp, run_id, label, t0, started_at, invalid=refused.reason)
        clash = port_clash(exp, (m.site for m in self.members))
        if clash is not None:  # the config's own doing, not the host's: never started
            return self._end(exp, run_id, label, t0, started_at, invalid=clash)
        #: host name -> its environment, read on each host of the roles: the run is
        #: recorded with the environment of the host that names it (the failing role's)
        environments: dict[str, object] = {}
        answers: dict[str, object] | None = None
        probe = None
        metric: float | None = None
        probe_record: dict[str, object] | None = None
        try:
            try:
                for m in self._env_readers(health):
                    environments[m.site.host.name] = m.ex.environment(m.launch)  # type: ignore[arg-type]
            except (TransportError, InfraError) as exc:
                return self._end(exp, run_id, label, t0, started_at, infra=str(exc), lost=exc.host)
            why = self.preflight.check(exp).refusal
            if why is not None:
                return self._end(exp, run_id, label, t0, started_at, invalid=why)
            self._stop_all()
            for m in self.members:
                assert m.launch is not None
                run_launch = m.ex.launch_of(m.launch)
                reason = m.ex.manager.install(run_launch, env_keys=keys, run_id=run_id)
                m.rendered = m.ex.manager.rendered()
                self._step(m, "installed", "drop-in written, read back")
                if reason is not None:
                    self._stop_all()
                    return self._end(
                        exp, run_id, label, t0, started_at, invalid=f"role {m.name}: {reason}"
                    )
                if listens(exp, m.name):  # a rank that serves no port holds none
                    m.ex.check_port(run_launch)
            waited = max(m.ex._wait_for_gpus(m.ex.launch_of(m.launch)) for m in self.members)  # type: ignore[arg-type]
            self._start_all(run_id)
            deadline = t0 + waited + exp.health.timeout
            self._watch(exp, health, deadline)
            alive_health = health.watch.ready and not health.watch.died
            check = exp.answers
            if alive_health and check is not None and (check.enabled or check.ready_completion):
                answers = health.ex._ask(health.launch, ask_twice)  # type: ignore[arg-type]
            if alive_health and exp.probe is not None and not self._any_died():
                assert health.started is not None
                probe, metric, probe_record = health.ex._probe(
                    health.launch,  # type: ignore[arg-type]
                    health.started,
                    good_metric,
                    health.watch,
                )
            if answers is not None or probe is not None:
                self._look_alive()
            for m in self.members:
                if m.started is not None:
                    m.log = keep_what_matters(
                        m.ex.manager.logs(m.started, lines=LOG_FETCH_LINES), LOG_TAIL_LINES
                    )
            self._stop_all()
        except RunCancelled:
            self._stop_all()
            raise
        except ServiceError:
            self._stop_all()
            raise
        except (TransportError, InfraError) as exc:
            self._stop_all(quiet=True)
            return self._end(exp, run_id, label, t0, started_at, infra=str(exc), lost=exc.host)
        outcome = judge_roles(
            [self._evidence(m, probe) for m in self.members],
            target=target,
            answers=answers,
            health_role=self.health_role,
        )
        return self._end(
            exp,
            run_id,
            label,
            t0,
            started_at,
            outcome=outcome,
            environments=environments,
            answers=answers,
            metric=metric,
            probe_record=probe_record,
        )

    # ---- the parts of a run
    def _env_readers(self, health: _Member) -> list[_Member]:
        """One role per host whose environment is read: the health role on its host, else
        the host's first server role (a router's command may be another interpreter)."""
        chosen: dict[str, _Member] = {health.site.host.name: health}
        for m in sorted(self.members, key=lambda m: not m.site.role.serving):
            chosen.setdefault(m.site.host.name, m)
        return list(chosen.values())

    def _step(self, m: _Member, step: str, detail: str) -> None:
        self.emit(StepDone(host=m.site.host.name, step=step, detail=f"{m.name}: {detail}"))

    def _stop_all(self, *, quiet: bool = False) -> None:
        """Stop every role in stop order (each on its own host)."""
        for m in reversed(self.members):
            try:
                m.ex._stop()
            except (TransportError, InfraError):
                if not quiet:
                    raise
            else:
                self._step(m, "stopped", m.ex.service)

    def _start_all(self, run_id: str) -> None:
        for m in self.members:
            if self.cancel_event.is_set():
                raise RunCancelled(f"run cancelled on {m.site.host.name}")
            try:
                m.started = m.ex.manager.start(m.ex.launch_of(m.launch), run_id=run_id)  # type: ignore[arg-type]
            except (TransportError, InfraError) as exc:
                m.absent, m.infra = f"its host failed: {exc}", True
                continue
            self._step(m, "started", m.started.invocation or f"pid {m.started.pid}")

    def _any_died(self) -> bool:
        return any(m.watch.died or m.absent is not None for m in self.members)

    def _poll_round(self, t0: float) -> None:
        """Poll every started role: one command per host (its roles' polls in a row)."""
        by_host: dict[str, list[_Member]] = {}
        for m in self.members:
            if m.started is not None and not m.watch.died:
                by_host.setdefault(m.site.host.name, []).append(m)
        for ms in by_host.values():
            parts = [offset_command()]
            for m in ms:
                assert m.started is not None and m.launch is not None
                parts.append(f"echo '{self._mark} {m.name}'")
                parts.append(m.ex.manager.poll_command(m.ex.launch_of(m.launch), m.started))
            res = ms[0].ex.t.run("; ".join(parts), timeout=30)
            got = parse_now(res.stdout)
            now = got[0] if got else None
            sections = poll_sections(res.stdout, self._mark)
            for m in ms:
                if m.name not in sections:
                    raise InfraError(
                        f"{m.site.host.describe()}: the poll of role {m.name} gave no answer",
                        host=m.site.host.name,
                    )
                assert m.started is not None
                poll = m.ex.manager.parse_poll(sections[m.name], m.started)
                m.watch.poll = poll
                m.watch.polls += 1
                self._phase(m, poll.log_tail, t0)
                if not poll.alive:
                    m.watch.died, m.watch.dead_at = True, self.clock() - t0
                    m.died_host_time = now
                    if poll.setup_failure:
                        m.absent = f"its unit failed to start (status {poll.setup_failure})"
                        m.infra = True

    def _phase(self, m: _Member, log_tail: str, t0: float) -> None:
        """The startup phase a role's log has reached; the health role's is told."""
        seen = last_phase(log_tail.splitlines())
        w = m.watch
        if seen is None or (w.phase is not None and PHASE_ORDER[seen] <= PHASE_ORDER[w.phase]):
            return
        elapsed = self.clock() - t0
        w.phase = seen
        w.phase_times.setdefault(seen.value, round(elapsed, 3))
        if m.name == self.health_role:
            self.emit(PhaseReached(host=m.site.host.name, phase=seen, elapsed_s=elapsed))

    def _watch(self, exp: Experiment, health: _Member, deadline: float) -> None:
        """Poll until the health role is ready (and settled), a role dies (then the
        others' grace), or the deadline."""
        t0 = self.clock()
        pause = POLL_MIN_S
        streak = 0
        died_at: float | None = None
        while True:
            if self.cancel_event.is_set():
                self._stop_all(quiet=True)
                raise RunCancelled(f"run cancelled on {self.host.name}")
            self._poll_round(t0)
            poll = health.watch.poll
            if poll is not None:
                self.emit(
                    Polled(
                        host=health.site.host.name,
                        state=poll.state,
                        http_code=poll.http_code,
                        elapsed_s=self.clock() - t0,
                    )
                )
            if self._any_died():
                if died_at is None:
                    died_at = self.clock()
                running = [m for m in self.members if m.started is not None and not m.watch.died]
                if not running or self.clock() - died_at >= self.grace_s:
                    return
                self.sleep(POLL_MIN_S)
                continue
            if health.watch.ready:
                return  # settled: alive one settle after its ready answers
            streak = streak + 1 if poll is not None and poll.http_code == 200 else 0
            if streak >= exp.health.ready_after:
                health.watch.ready = True
                health.watch.ready_at = self.clock() - t0
                self.sleep(exp.health.settle)
                continue  # one more round: a role that died in the settle is seen
            if self.clock() >= deadline:
                for m in self.members:
                    m.watch.timed_out = m.started is not None and not m.watch.died
                return
            wait = exp.health.interval if exp.health.interval is not None else pause
            self.sleep(max(min(wait, deadline - self.clock()), 0.0))
            pause = min(pause * 2, POLL_MAX_S)

    def _look_alive(self) -> None:
        """After the answers check and the probe: a role that died under their requests
        (prefill crashing while the router answers 502 for it) is seen dead and judged by
        how it ended, never by the answers the deployment could not give; the others get
        the grace for their last lines, as in the watch."""
        t0 = self.clock()
        self._poll_round(t0)
        if not self._any_died():
            return
        while any(m.started is not None and not m.watch.died for m in self.members):
            if self.clock() - t0 >= self.grace_s:
                return
            self.sleep(POLL_MIN_S)
            self._poll_round(t0)

    def _evidence(self, m: _Member, probe: object) -> RoleOutcome:
        w = m.watch
        p = w.poll
        health = m.name == self.health_role
        ready = self._member(self.health_role).watch.ready
        evidence = RunEvidence(
            log_tail=m.log,
            # the deployment served: a role alive then did its part
            became_ready=ready,
            died_after_ready=ready and w.died,
            exit_code=getattr(p, "exit_code", None) if w.died else None,
            exit_signal=getattr(p, "exit_signal", None) if w.died else None,
            unit_result=getattr(p, "unit_result", None) if w.died else None,
            # a role still running when the run ended without serving was blocked
            timed_out=not ready and not w.died,
            last_phase=w.phase,
            probe=probe if health else None,  # type: ignore[arg-type]
        )
        return RoleOutcome(
            role=m.site.role,
            host=m.site.host.name,
            unit=m.ex.service,
            evidence=evidence,
            offset=self.offsets.get(m.site.host.name, 0.0),
            utc_offset=self.utc_offsets.get(m.site.host.name, 0.0),
            died_host_time=m.died_host_time,
            absent=m.absent,
            infra=m.infra,
            rendered=m.rendered,
            invocation=m.started.invocation if m.started else None,
            health_code=p.http_code if p is not None and p.alive and not w.died else 0,
            # alive and not ready when another role's failure ended the watch early
            cut_short=not ready and not w.died and not w.timed_out and m.started is not None,
        )

    def _end(
        self,
        exp: Experiment,
        run_id: str,
        label: str,
        t0: float,
        started_at: float,
        *,
        invalid: str | None = None,
        infra: str | None = None,
        lost: str | None = None,
        outcome: object = None,
        environments: dict[str, object] | None = None,
        answers: dict[str, object] | None = None,
        metric: float | None = None,
        probe_record: dict[str, object] | None = None,
    ) -> RunResult:
        from orchestrator.execution.roles import ABSENT, Judged, RoleRecord

        duration = self.clock() - t0
        health = self._member(self.health_role)
        if outcome is None:
            verdict = Verdict.INVALID if invalid is not None else Verdict.INFRA
            # every role is still named with its host and unit (show, --role, reports):
            # absent when it never started, else cut short by the host trouble
            records = tuple(
                RoleRecord(
                    self._evidence(m, None),
                    ABSENT if m.started is None else Verdict.INFRA.value,
                    None,
                    None,
                )
                for m in self.members
            )
            # host trouble names the role's host that was lost, not the health role's
            named = lost if lost in {m.site.host.name for m in self.members} else None
            outcome = Judged(verdict, None, invalid or infra or "", named, records)
        assert isinstance(outcome, Judged)
        host = outcome.host or health.site.host.name
        record: dict[str, object] = {
            "manager": "deployment",
            "roles": [r.to_record() for r in outcome.roles],
            "first_failure": outcome.first_failure,
        }
        if probe_record is not None:  # on the health role, as a single unit's
            record["probe"] = probe_record
        tail = outcome.log_tail if outcome.roles else ""
        rendered = "\n".join(
            f"# role {m.name} on {m.site.host.name} ({m.ex.service})\n{m.rendered}"
            for m in self.members
            if m.rendered is not None
        )
        result = self._finish(
            exp,
            run_id,
            label,
            outcome.verdict,
            outcome.signature,
            outcome.detail,
            duration,
            started_at=started_at,
            phase_times=tuple(health.watch.phase_times.items()),
            last_phase=outcome.signature.phase if outcome.signature else health.watch.phase,
            log_tail=tail,
            rendered=rendered or None,
            probe_metric=metric,
            polls=sum(m.watch.polls for m in self.members),
            ready_s=health.watch.ready_at,
            invocation=health.started.invocation if health.started else None,
            host_record=record,
            # the host that names the run: its own environment, never another role's
            environment=(environments or {}).get(host),
            answers=answers,
            inputs=None,
        )
        if result.host != host:  # the failing role's host names the run
            from dataclasses import replace

            result = replace(result, host=host)
        return result


def deployment_factory(
    base: Callable[..., HostExecutor],
    exp: Experiment,
    inventory: Inventory | None,
    *,
    start_mismatched: bool | None = None,
) -> Callable[[Host, str, str, Listener], HostExecutor]:
    """A campaign's executor factory for the deployment of `exp` (good's roles: every
    variant has the same roles, hosts and units): members are made by `base` (keyword
    arguments as `executor_for`'s)."""

    def make(host: Host, service: str, campaign: str, listener: Listener) -> HostExecutor:
        roles = sites(exp, host, inventory)
        if host.service_manager == "slurm":  # one job over the cluster's nodes
            return base(
                host,
                service=service,
                campaign=campaign,
                listener=listener,
                start_mismatched=start_mismatched,
            )

        def member(h: Host, svc: str) -> Executor:
            ex = base(h, service=svc, campaign=campaign, listener=listener)
            assert isinstance(ex, Executor)
            return ex

        return DeploymentExecutor(
            host,
            roles,
            health_role=exp.deployment().health_role,
            service=service,
            make_member=member,
            campaign=campaign,
            listener=listener,
            start_mismatched=start_mismatched,
        )

    return make


__all__ = [
    "DeploymentExecutor",
    "RoleSite",
    "deployment_factory",
    "deployment_hosts",
    "same_layout",
    "sites",
]
