"""The executor: runs one variant on one host, start to verdict. The only code that
touches hosts (through a transport and a service manager).

Per campaign and host: connect, lock the unit, prepare (back up, note its state),
preflight (the server's own `--help` says which flags it accepts; the port must be free
or ours). Per run: stop, install the variant, start, poll state + health + log in one
remote command with capped exponential backoff (tenacity) until ready, dead or past the
deadline, run the optional probe, check the server survived it, fetch the log, stop,
and judge. At the end (or on error, or Ctrl-C): restore the service as it was found.
"""

from __future__ import annotations

import os
import re
import shlex
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tenacity import RetryCallState, Retrying, retry_if_result, wait_exponential

from orchestrator import shield
from orchestrator.config import builds, containers
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.diagnosis.classify.judge import (
    LAUNCH_CLASS,
    ProbeOutcome,
    RunEvidence,
    judge,
    last_phase,
    launch_detail,
    outside_cause,
)
from orchestrator.diagnosis.logtail import keep_what_matters, last_log_line, probe_excerpt
from orchestrator.diagnosis.verdicts import PHASE_ORDER, Phase, Signature, Verdict, relative
from orchestrator.errors import (
    ConfigError,
    InfraError,
    OrchestratorError,
    ServiceError,
    TransportError,
)
from orchestrator.events import (
    Listener,
    Notice,
    PhaseReached,
    Polled,
    ProbeStarted,
    RunStarted,
    StepDone,
    null_listener,
)
from orchestrator.execution import answers as answers_mod
from orchestrator.execution import environment as envfacts
from orchestrator.execution import facts, preflight
from orchestrator.execution.contract import (
    LOG_FETCH_LINES,
    LOG_TAIL_LINES,
    HostExecutor,
    RunCancelled,
    RunResult,
)
from orchestrator.execution.helpcache import HelpCache, build_of
from orchestrator.execution.hostlock import HostLock, me
from orchestrator.execution.inputs import LaunchInputs
from orchestrator.execution.services import ServiceManager, Started, manager_for
from orchestrator.execution.transport import Transport, connect

BOOT_MARK = "@@BOOT"
#: how long a run waits, before its start, for GPU memory held by another process (a
#: server still exiting, someone's job) to be freed; then it is `infra` (three in a row
#: stop the campaign, saying who holds the GPUs): a start beside it would fail for it
GPU_FREE_WAIT_S = 180.0
GPU_FREE_POLL_S = 10.0
#: starts of one run whose process systemd could not set up, and the wait between them
SETUP_ATTEMPTS = 2
SETUP_RETRY_WAIT_S = 3.0


@dataclass
class _Watch:
    ready: bool = False
    died: bool = False
    timed_out: bool = False
    poll: object = None
    phase: Phase | None = None
    phase_times: dict[str, float] = field(default_factory=dict)
    polls: int = 0
    ready_at: float | None = None
    dead_at: float | None = None
    boot: str | None = None  # the host's boot id at the first poll

    @property
    def setup_failure(self) -> str | None:
        """systemd's status when it could not set the dead server's process up ('219/CGROUP')."""
        return getattr(self.poll, "setup_failure", None) if self.died else None


def service_name(exp: Experiment) -> str:
    return exp.unit or re.sub(r"[^A-Za-z0-9_.@-]", "_", exp.name)


class Executor(HostExecutor):
    """Runs variants of one service on one host (systemd or a detached process). Use as a
    context manager. A Slurm host's executor is SlurmExecutor; `executor_for` (in
    orchestrator.execution.backends) picks the one a host asks for."""

    def __init__(
        self,
        host: Host,
        *,
        service: str,
        campaign: str = "",
        listener: Listener = null_listener,
        transport: Transport | None = None,
        accept_new_host_key: bool = False,
        poll_min: float = 0.25,
        poll_max: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.host = host
        self.service = service
        self.campaign = campaign
        self.emit = listener
        self._own_transport = transport is None
        self.t = (
            transport or connect(host, accept_new_host_key=accept_new_host_key)
            if not host.is_local
            else (transport or connect(host))
        )
        self.manager: ServiceManager = manager_for(host, self.t, name=service, campaign=campaign)
        self.lock = HostLock(host, self.t, service, campaign)
        self.poll_min = poll_min
        self.poll_max = poll_max
        #: the run's clocks and its sleep, injected together so that a test can drive the
        #: watch loop (backoff, deadline, settle) on a scripted clock that advances only
        #: when the executor sleeps: `clock` measures runs and deadlines, `wall_clock`
        #: dates them
        self.sleep = sleep
        self.clock = clock
        self.wall_clock = wall_clock
        #: before the second start of a process systemd could not set up
        self.setup_retry_wait = SETUP_RETRY_WAIT_S
        #: seconds a run waits for GPU memory held by another process (GPU_FREE_WAIT_S)
        self.gpu_wait = GPU_FREE_WAIT_S
        self._opened = False
        #: what close() read back as left on the host (see close)
        self.left: list[str] | None = None
        #: the flag preflight: each executable's help read once, trusted until contradicted
        self.preflight = preflight.Preflight(
            lambda cmd, timeout, stdin: self.t.run(cmd, timeout=timeout, stdin=stdin),
            lambda message, extra: self.emit(
                Notice(host=self.host.name, message=message, extra=extra)
            ),
            # the same name may be another machine in another hosts file: keyed by address
            cache=HelpCache(),
            host=f"{host.name} {host.user}@{host.address}:{host.port}",
        )
        #: set from another thread to abandon the run in progress (a pool's decided round,
        #: Ctrl-C): checked at every poll; the server is stopped and RunCancelled raised
        self.cancel_event = threading.Event()
        #: what `inputs` read since the last run, by environment capture command
        self._inputs_memo: dict[str, LaunchInputs] = {}
        #: the container runtimes this executor's launches ran (`docker`, `sudo podman`):
        #: their containers of this service are removed after each run and at the end
        self._runtimes: set[tuple[str, ...]] = set()
        self._containers_left: list[str] = []

    # ---- campaign scope
    def open(self) -> Executor:
        """Lock the unit and prepare it (back-up, state as found)."""
        self.lock.acquire()
        try:
            self.manager.prepare()
        except BaseException:
            self.lock.release()
            raise
        self._opened = True
        self.emit(StepDone(host=self.host.name, step="prepared", detail=self.service))
        return self

    def close(self, *, restore: bool = True) -> list[str]:
        """Restore the service and release the lock; then read the host back (`left`: what
        of ours is still there, None when that could not be read)."""
        done: list[str] = []
        opened, self.left = self._opened, None
        with shield.shielded():  # an interrupt now waits until the host is restored
            try:
                if restore and self._opened:
                    done = self.manager.restore()
                    done += self._remove_containers()
                    if self.__dict__.get("_overlays_made"):
                        done += self._remove_overlays()
                    for d in done:
                        self.emit(StepDone(host=self.host.name, step="restore", detail=d))
            finally:
                try:
                    self.lock.release()
                finally:
                    try:
                        self.left = (
                            self._read_back()
                            if opened and restore
                            else ([] if not opened else None)
                        )
                    finally:
                        if self._own_transport:
                            self.t.close()
                        self._opened = False
        return done

    def _read_back(self) -> list[str] | None:
        """What of this campaign the host still shows: our files, the unit's state against
        the one it was found in, a server of ours, our lock. None: it could not be read."""
        try:
            left = self.manager.left_over()
            if left is None:
                return None
            left += self._containers_left
            if self.__dict__.get("_overlays_made"):
                left += self._overlays_left()
            holder = self.lock.read()
        except OrchestratorError:
            return None
        if (
            holder is not None
            and holder.campaign == self.campaign
            and holder.owner == me()
            and holder.pid == os.getpid()
        ):
            left.append(f"the lock {self.lock.path} is still held")
        return left

    def _stop(self) -> None:
        """Stop the server; and the containers a run of ours started (a runtime's daemon
        keeps a container running after its command is stopped)."""
        self.manager.stop()
        self._remove_containers()
        if self._containers_left:
            raise ServiceError(
                f"{self.host.describe()}: " + "; ".join(self._containers_left),
                hint="remove it by hand (`docker rm -f ID` / `podman rm -f ID`)",
            )

    def _remove_containers(self) -> list[str]:
        """Stop and remove the containers labelled for this service, with each runtime
        its launches ran; what was removed, in words (what could not be, in
        `_containers_left`)."""
        done: list[str] = []
        self._containers_left = []
        for runtime in sorted(self._runtimes):
            r = self.t.run(containers.remove_command(runtime, self.service), timeout=60)
            for what, cid in containers.parse_marked(r.stdout):
                if what == "removed":
                    done.append(f"stopped and removed container {cid} ({shlex.join(runtime)})")
                else:
                    self._containers_left.append(
                        f"container {cid} of {self.service} ({shlex.join(runtime)}) is "
                        "still there after its removal"
                    )
        return done

    def check_port(self, exp: Experiment) -> None:
        """Refuse to go on when the config's port is held by something not ours."""
        for pid, name in self.manager.listeners_on(exp.port):
            if pid is not None and self.manager.owns_pid(pid):
                continue
            raise ServiceError(
                f"{self.host.describe()}: port {exp.port} is already in use by "
                f"{name} (pid {pid}), which is not {self.service}",
                hint="stop that process, or check the port in the experiment config "
                "(the health check uses the config's --port)",
            )

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
        if exp.roles:  # its shared flags alone on one unit would not be the deployment
            raise ConfigError(
                "a deployment of several roles runs through the deployment's executor, "
                "one unit per role, never as one unit",
                file=exp.source,
                key="roles",
            )
        # The launch removes the campaign's other variables too; run and recorded as such
        # (its fingerprint says so), whichever command asked for it.
        exp = exp.unsetting(env_keys)
        # the run is recorded under its config (its build by name); the host runs the
        # build's interpreter or image
        config, exp = exp, self.launch_of(exp)
        cc = builds.container_split(exp.exec)
        if cc is not None:
            self._runtimes.add(containers.runtime_prefix(cc))
        # Before the clock starts: the capture is not part of the run's time or deadline.
        self._inputs_memo.clear()  # a run reads the host afresh
        environment: envfacts.HostEnvironment | None = None
        env_error: TransportError | InfraError | None = None
        refused: str | None = None
        try:
            refused = self.prepare_packages(config)
            environment = self.environment(exp)
        except (TransportError, InfraError) as exc:
            env_error = exc  # host trouble: judged below as this run's `infra`
        if environment is not None and config.build is not None and not config.packages:
            # what runs is read from inside the build, not taken from its name
            served = builds.read_back(
                config.build,
                dict(self.host.builds).get(config.build),
                environment.server_version,
                environment.server,
            )
            if served is not None:
                env_error = InfraError(served)
        started_at = self.wall_clock()
        t0 = self.clock()
        self.emit(
            RunStarted(
                host=self.host.name, run_id=run_id, label=label, deadline_s=exp.health.timeout
            )
        )
        watch = _Watch()
        ports: list[int] | None = None
        log = ""
        started: Started | None = None
        metric: float | None = None
        rendered: str | None = None
        evidence: RunEvidence
        flagcheck = preflight.Check()
        probe_record: dict[str, object] | None = None
        answers_record: dict[str, object] | None = None
        try:
            if env_error is not None:
                raise env_error
            flagcheck = self.preflight.check(exp, build=build_of(environment))
            if refused is not None:  # a set of packages the resolver does not accept
                evidence = RunEvidence(invalid_reason=refused)
            elif flagcheck.refusal is not None:
                evidence = RunEvidence(invalid_reason=flagcheck.refusal)
            else:
                self._stop()
                self._step("stopped", self.service)
                reason = self.manager.install(exp, env_keys=frozenset(env_keys), run_id=run_id)
                rendered = self.manager.rendered()
                self._step(
                    "installed",
                    "drop-in written, read back"
                    if self.manager.kind == "systemd"
                    else "launch script written",
                )
                if reason is not None:
                    evidence = RunEvidence(invalid_reason=reason)
                else:
                    self.check_port(exp)
                    waited = self._wait_for_gpus(exp)
                    # the deadline's own time
                    started = self._start_and_watch(exp, run_id, t0 + waited, watch)
                    if watch.timed_out and not watch.died:
                        ports = self._ports(started)
                    check = exp.answers
                    if (
                        watch.ready
                        and check is not None
                        and (check.enabled or check.ready_completion)
                        and not watch.died
                    ):
                        answers_record = self._ask(exp, ask_twice)
                        if answers_mod.unanswered(answers_record):
                            self._look_alive(exp, started, watch)  # died while asked?
                    probe = None
                    if watch.ready and exp.probe is not None and not watch.died:
                        probe, metric, probe_record = self._probe(exp, started, good_metric, watch)
                    log = keep_what_matters(
                        self.manager.logs(started, lines=LOG_FETCH_LINES), LOG_TAIL_LINES
                    )
                    # before our own stop below: a stop job now would be someone else's
                    stopped_by = self.manager.stopped_from_outside(started) if watch.died else None
                    if watch.died:
                        self._host_stayed_up(watch)
                        self._server_ran(watch)
                    p = watch.poll
                    evidence = RunEvidence(
                        log_tail=log,
                        became_ready=watch.ready,
                        died_after_ready=watch.ready and watch.died,
                        exit_code=getattr(p, "exit_code", None) if watch.died else None,
                        exit_signal=getattr(p, "exit_signal", None) if watch.died else None,
                        unit_result=getattr(p, "unit_result", None) if watch.died else None,
                        timed_out=watch.timed_out,
                        stopped_by=stopped_by,
                        last_phase=watch.phase,
                        probe=probe,
                    )
                    self._stop()
                    self._step("stopped", "after the run")
        except RunCancelled:
            self._stop()
            self._step("stopped", "run cancelled")
            raise
        except ServiceError:
            raise  # host or unit trouble that every run would hit: the campaign stops
        except (TransportError, InfraError) as exc:
            evidence = RunEvidence(infra_error=str(exc), log_tail=log)
        verdict, sig = judge(evidence, target)
        detail = evidence.invalid_reason or evidence.infra_error or ""
        if verdict is Verdict.PASS and answers_record is not None:
            no_answer = answers_mod.not_ready(answers_record)
            if no_answer is not None:  # /health passed, yet no real completion returned
                sig = answers_mod.NO_COMPLETION
                verdict = relative(Verdict.FAIL, sig, target)
                detail = no_answer
        if verdict is Verdict.INFRA and not detail:  # judged host trouble from the log: why
            detail = outside_cause(evidence) or ""
        if verdict is Verdict.INVALID and sig is not None and sig.error_class == LAUNCH_CLASS:
            detail = launch_detail(sig, evidence.exit_code, config.build)
        if (
            config.build is not None
            and sig is not None
            and verdict in (Verdict.FAIL, Verdict.OTHER)
            and builds.broken(sig.error_class, sig.message)
        ):
            # the build cannot start the server at all: it never ran the config
            verdict = Verdict.INVALID
            detail = (
                f"build '{config.build}' cannot start the server ({sig.error_class}: "
                f"{sig.message}); not a verdict about the config"
            )
        if preflight.is_args_failure(verdict, sig) and not detail:
            detail = preflight.args_detail(log, sig, flagcheck)
        self.preflight.settle(exp, flagcheck, verdict, sig, run_id)
        if verdict is Verdict.TIMEOUT or (watch.timed_out and verdict is Verdict.FAIL):
            detail = f"not ready after {exp.health.timeout:g}s; last phase: " + (
                watch.phase.value if watch.phase else "none seen"
            )
            detail += _port_hint(exp.port, ports)
            last = last_log_line(log)
            if last and not watch.died:  # alive, never healthy: what it was last doing
                detail += f"; last log line: {last}"
        duration = self.clock() - t0
        host_record = self.manager.host_record(started) if rendered is not None else None
        if probe_record is not None:  # kept whatever the manager records of its own
            host_record = {
                "manager": self.manager.kind,
                **(host_record or {}),
                "probe": probe_record,
            }
        if host_record is not None:
            host_record["host"] = self.host.name
            if not self.host.is_local:  # how to get there from this controller
                h = self.host
                ssh = ["ssh", "-p", str(h.port)]
                ssh += ["-i", h.identity_file] if h.identity_file else []
                ssh += ["-o", f"UserKnownHostsFile={h.known_hosts}"] if h.known_hosts else []
                host_record["ssh"] = shlex.join(
                    [*ssh, f"{h.user}@{h.address}" if h.user else h.address]
                )
        return self._finish(
            config,
            run_id,
            label,
            verdict,
            sig,
            detail,
            duration,
            started_at=started_at,
            phase_times=tuple(watch.phase_times.items()),
            last_phase=watch.phase,
            log_tail=log,
            rendered=rendered,
            probe_metric=metric,
            polls=watch.polls,
            ready_s=watch.ready_at,
            invocation=started.invocation if started else None,
            host_record=host_record,
            environment=environment,
            answers=answers_record,
        )

    def _ask(self, exp: Experiment, twice: bool) -> dict[str, object]:
        """Ask the ready server the answers check's prompts on the host (the port stays
        private to it); `twice`: the first mode once more, on the same start (good's
        second pass, the host's own disagreement)."""
        check = exp.answers
        assert check is not None
        self._step("answers", f"asking the server ({check.rule}, {', '.join(check.modes)})")
        try:
            record = answers_mod.ask_check(
                self.t, check, exp.port, twice=twice, cancel=self.cancel_event
            )
        except answers_mod.AskCancelled:
            raise RunCancelled(f"run cancelled on {self.host.name}") from None
        self._step("answers", answers_mod.summary(record))
        return record

    def _look_alive(self, exp: Experiment, started: Started, w: _Watch) -> None:
        """After prompts went unanswered: a server that died meanwhile (a crash, a kill
        from outside) is judged by how it ended, never by the answers it could not give."""
        res = self.t.run(self.manager.poll_command(exp, started), timeout=30)
        poll = self.manager.parse_poll(res.stdout, started)
        w.polls += 1
        w.poll = poll
        if not poll.alive:
            w.died = True

    def _ports(self, started: Started) -> list[int] | None:
        """The ports the (still running) server listens on; None if that cannot be told."""
        try:
            return self.manager.listening_ports(started)
        except InfraError:
            return None

    def _watch(self, exp: Experiment, started: Started, t0: float, w: _Watch) -> None:
        """Poll until ready, dead or past the deadline (capped exponential backoff)."""
        # The host's boot id rides along: a host rebooted under the run (a reconnect that
        # succeeded) shows a unit that never ran our variant, which is no verdict at all.
        cmd = (
            f"echo {BOOT_MARK} $(cat /proc/sys/kernel/random/boot_id 2>/dev/null); "
            + self.manager.poll_command(exp, started)
        )
        streak = 0

        def once() -> str | None:
            nonlocal streak
            if self.cancel_event.is_set():
                raise RunCancelled(f"run cancelled on {self.host.name}")
            res = self.t.run(cmd, timeout=30)
            w.polls += 1
            first, _, text = res.stdout.partition("\n")
            seen_boot = first.removeprefix(BOOT_MARK).strip()
            if w.boot is None:
                w.boot = seen_boot or None
            elif seen_boot and seen_boot != w.boot:
                raise InfraError(
                    f"{self.host.describe()} rebooted during the run (its boot id "
                    "changed); the run says nothing about the config"
                )
            try:
                poll = self.manager.parse_poll(text, started)
            except InfraError:
                # A host going down answers half (systemd's bus closes before the boot id
                # changes): say the shutdown, when that is what it was, not the half answer.
                self._host_stayed_up(w)
                raise
            w.poll = poll
            elapsed = self.clock() - t0
            seen = last_phase(poll.log_tail.splitlines())
            if seen is not None and (w.phase is None or PHASE_ORDER[seen] > PHASE_ORDER[w.phase]):
                w.phase = seen
                w.phase_times.setdefault(seen.value, round(elapsed, 3))
                self.emit(PhaseReached(host=self.host.name, phase=seen, elapsed_s=elapsed))
            self.emit(
                Polled(
                    host=self.host.name,
                    state=poll.state,
                    http_code=poll.http_code,
                    elapsed_s=elapsed,
                )
            )
            if not poll.alive:
                w.died, w.dead_at = True, elapsed
                return "dead"
            streak = streak + 1 if poll.http_code == 200 else 0
            if streak >= exp.health.ready_after:
                w.ready = True
                w.ready_at = elapsed if w.ready_at is None else w.ready_at
                w.phase_times.setdefault(Phase.SERVING.value, round(elapsed, 3))
                return "ready"
            return None

        # The deadline is the config's, counted from the run's start (at least one look
        # when the start itself took that long); the last wait is cut short to end on it,
        # so a server not ready by then is judged at the deadline, not a backoff later.
        deadline = max(t0 + exp.health.timeout, self.clock() + 0.1)
        backoff = wait_exponential(multiplier=self.poll_min, min=self.poll_min, max=self.poll_max)

        def wait(state: RetryCallState) -> float:
            if exp.health.interval is not None:
                pause = exp.health.interval
            elif streak > 0:
                # Healthy once: confirm the next `ready_after` 200s at once instead of
                # waiting out the backoff (it saved nothing: the server is up, and the
                # verdict waits).
                pause = self.poll_min
            else:
                pause = backoff(state)
            return max(min(pause, deadline - self.clock()), 0.0)

        def past_deadline(state: RetryCallState) -> bool:
            return self.clock() >= deadline

        retrying = Retrying(
            stop=past_deadline,
            wait=wait,
            retry=retry_if_result(lambda r: r is None),
            sleep=self.sleep,
            retry_error_callback=lambda _state: "timeout",
        )
        outcome = retrying(once)
        if outcome == "timeout":
            w.timed_out = True
        elif outcome == "ready":
            # The settle (health.settle): one more poll after it catches a server that
            # answers /health a few times and then dies (it must not be judged `pass`).
            self.sleep(exp.health.settle)
            once()  # marks the run dead if the server did not survive the settle

    def _wait_for_gpus(self, exp: Experiment) -> float:
        """Seconds waited until no process holds memory on the GPUs the server will use
        (CUDA_VISIBLE_DEVICES of the config or the host, else all); 0 on a host without
        nvidia-smi. Still held after `gpu_wait` seconds: InfraError naming the holders,
        because a server started beside them fails for them, not for its config."""
        visible = exp.env_map().get(
            "CUDA_VISIBLE_DEVICES", dict(self.host.env).get("CUDA_VISIBLE_DEVICES")
        )
        t = self.clock()
        told = False
        for k in range(10_000):  # bounded by the wait below as well
            if self.cancel_event.is_set():
                raise RunCancelled(f"run cancelled on {self.host.name}")
            r = self.t.run(facts.GPU_HOLDERS_COMMAND, timeout=60)
            held = facts.holders_on(facts.parse_gpu_holders(r.stdout), visible) if r.ok else []
            waited = self.clock() - t
            if not held:
                if told:
                    self._step("waiting", f"the GPUs are free after {waited:.0f}s")
                return waited
            who = "; ".join(h.describe() for h in held[:4]) + (
                f"; and {len(held) - 4} more" if len(held) > 4 else ""
            )
            if waited >= self.gpu_wait:
                raise InfraError(
                    f"{self.host.describe()}: {who}, still after {waited:.0f}s: "
                    "not this run's server, so a start would fail for it, not "
                    "for the config (stop it, or set CUDA_VISIBLE_DEVICES in the "
                    "config to GPUs it does not use)"
                )
            if not told:
                self._step(
                    "waiting",
                    f"{who}: waiting up to {self.gpu_wait:.0f}s for it to "
                    "be freed before the start",
                )
                told = True
            # soon at first (a server just stopped frees its memory in seconds), then
            # every GPU_FREE_POLL_S
            self.sleep(min(2.0 * 2 ** min(k, 8), GPU_FREE_POLL_S, max(self.gpu_wait - waited, 0.0)))
        return self.clock() - t

    def _host_stayed_up(self, w: _Watch) -> None:
        """A server seen dead while its host went down (a reboot or shutdown under the
        run: the unit stopped by the system, its log gone with the old boot) died of
        nothing in its config: raise the run's `infra` instead of letting it be judged.
        Asked after the death's evidence was read, so a reboot that lands between the
        last poll and that read is seen too."""
        r = self.t.run(
            "cat /proc/sys/kernel/random/boot_id 2>/dev/null; "
            "systemctl is-system-running 2>/dev/null || true",
            timeout=30,
        )
        lines = [ln.strip() for ln in r.stdout.splitlines() if ln.strip()]
        boot = lines[0] if lines else ""
        if w.boot and boot and boot != w.boot:
            raise InfraError(
                f"{self.host.describe()} rebooted during the run (its boot id "
                "changed); the run says nothing about the config"
            )
        if "stopping" in lines[1:]:
            raise InfraError(
                f"{self.host.describe()} was shutting down when the server died "
                "(systemd: stopping); the run says nothing about the config"
            )

    def _start_and_watch(self, exp: Experiment, run_id: str, t0: float, watch: _Watch) -> Started:
        """Start the server and watch it until it is ready, dies or times out. A start
        whose process systemd could not set up (`setup_failure`: its command never ran, so
        nothing of the server was tried) is started once more after SETUP_RETRY_WAIT_S: a
        cgroup that was not there to join is there a moment later; a missing working
        directory is missing again, and `_server_ran` makes that run `infra`."""
        for attempt in range(SETUP_ATTEMPTS):
            if attempt:
                vars(watch).update(vars(_Watch()))  # what the first start saw is no more
            started = self.manager.start(exp, run_id=run_id)
            self._step("started", started.invocation or f"pid {started.pid}")
            self._watch(exp, started, t0, watch)
            failure = watch.setup_failure
            if not failure or attempt + 1 == SETUP_ATTEMPTS:
                break
            self._step(
                "restarting",
                f"systemd could not set the server's process up ({failure}); "
                f"starting it once more in {self.setup_retry_wait:g}s",
            )
            self.sleep(self.setup_retry_wait)
        return started

    def _server_ran(self, w: _Watch) -> None:
        """A start whose process systemd could not set up (`219/CGROUP`: its cgroup was not
        there to join; `203/EXEC`) never ran the server's command: its status is systemd's,
        not the server's, and says nothing about the config. Raise the run's `infra` (the
        campaign starts it again, and stops if every start fails so)."""
        failure = w.setup_failure
        if failure:
            raise InfraError(
                f"systemd could not start {self.service} on {self.host.describe()}: its "
                f"process failed to set up before the server ran (status {failure}); the run "
                f"says nothing about the config (`journalctl -u {self.service}` says which step)"
            )

    def _probe(
        self, exp: Experiment, started: Started, good_metric: float | None, w: _Watch
    ) -> tuple[ProbeOutcome, float | None, dict[str, object]]:
        probe = exp.probe
        assert probe is not None
        command = probe.command(exp.port)
        self.emit(ProbeStarted(host=self.host.name, command=command))
        # warm-up and repeats inside this one start: a start costs minutes, a run seconds;
        # the first run that fails to give a figure ends them (the probe's own failure), and
        # so does one that served nothing (its output, kept below, tells why)
        values: list[float] = []
        exit_code, out, missing = 0, "", False
        for _ in range(probe.runs):
            try:
                r = self.t.run(command, timeout=probe.timeout)
                exit_code, out = r.exit_code, r.stdout + "\n" + r.stderr
            except TransportError as exc:
                if "timed out" not in str(exc):
                    raise
                exit_code, out = 124, str(exc)
            figure, _ = probe.read(out, None)
            if exit_code != 0:
                break
            if figure is None:
                missing = probe.metric is not None
                break
            values.append(figure)
            if figure == 0:
                break  # nothing was served: more runs would measure a broken server
        metric, passed = probe.judge(values, good_metric) if not missing else (None, None)
        # A crash under load takes a moment to show: look twice, a moment apart (half a
        # second, or the settle when that is shorter), before calling it alive.
        alive = True
        for look in range(2):
            if look:
                self.sleep(min(0.5, exp.health.settle))
            res = self.t.run(self.manager.poll_command(exp, started), timeout=30)
            poll = self.manager.parse_poll(res.stdout, started)
            w.polls += 1
            w.poll = poll
            if not poll.alive:
                alive = False
                w.died = True
                break
        outcome = ProbeOutcome(
            exit_code=exit_code,
            metric=metric,
            passed=passed if exit_code == 0 else None,
            condition=probe.pass_if,
            server_alive=alive,
            no_metric=missing,
        )
        # kept with the run: `show` tells what the probe did, whatever the server logged
        record: dict[str, object] = {
            "command": command,
            "exit_code": exit_code,
            "metric": metric,
            "bar": probe.pass_if,
            "passed": passed,
            # every run's figure, warm-up first: the measured search reads the sample
            "values": values,
            "warmup": probe.warmup,
            "server_alive": alive,
            "output": probe_excerpt(out, probe.metric),
        }
        return outcome, metric, record


def _port_hint(port: int, ports: list[int] | None) -> str:
    """What a timed-out server listens on, when that tells the user what to fix."""
    if ports is None or port in ports:
        return ""
    if not ports:
        return f"; the server listens on no TCP port (the health check polls port {port})"
    seen = ", ".join(str(p) for p in ports)
    return (
        f"; the server listens on {seen} but the health check polls port {port}: check "
        "--port and health.port in the experiment config"
    )
