"""The Slurm executor: one variant = one `sbatch` job, watched until it ends, then judged.

It honours the executor's contract (open, run -> RunResult, close, `cancel_event`), so
bisections and sweeps drive a cluster as they drive an SSH host; the pool gives a Slurm
host `max_jobs` slots, each an executor like this one with one job at a time, and the
scheduler decides where and when each job runs.

Per campaign (`open`): ask `sinfo` for the partition and its gres (our error, not a
Slurm traceback, when it lacks either), make the private run directory, and cancel the
campaign's jobs a controller that died left in the queue (found by job name; the job
comment names the run and the controller that submitted it). Per run: the flag preflight
on the login node, the job script (see `jobscript`) and the secrets file written through
stdin, `sbatch`; then one command per poll (`scontrol show job`, the job's result so far,
the server's log tail) with capped backoff. Time spent pending is shown, never counted
against the health deadline (the job script counts that from the server's start). When
the job has ended: its result file, log, probe output and the node's environment are
read in one command and judged by the same classifier as every other backend; a job
killed by its time limit is `timeout`; a node failure, preemption, requeue or a job
cancelled by someone else is `infra` (retried, never cached). A cancelled run (its round
was decided, Ctrl-C, SIGTERM) `scancel`s its job.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace

from orchestrator import shield
from orchestrator.config.deployment import refusal
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host, SlurmOptions
from orchestrator.diagnosis.classify.judge import (
    LAUNCH_CLASS,
    ProbeOutcome,
    RunEvidence,
    judge,
    last_phase,
    launch_detail,
    outside_cause,
)
from orchestrator.diagnosis.first_failure import FirstFailure, RoleResult, first_failure
from orchestrator.diagnosis.logtail import keep_what_matters
from orchestrator.diagnosis.verdicts import PHASE_ORDER, Phase, Signature, Verdict
from orchestrator.errors import ConfigError, InfraError, SchedulerError, TransportError
from orchestrator.events import (
    Listener,
    Notice,
    PhaseReached,
    Polled,
    RunStarted,
    StepDone,
    null_listener,
)
from orchestrator.execution import environment as envfacts
from orchestrator.execution import preflight
from orchestrator.execution.contract import (
    LOG_FETCH_LINES,
    LOG_TAIL_LINES,
    HostExecutor,
    RunCancelled,
    RunResult,
)
from orchestrator.execution.slurm import facts, jobscript, multinode
from orchestrator.execution.slurm.jobscript import JobFiles
from orchestrator.execution.transport import Transport, connect

#: this controller process, as job comments name it: a job of the campaign that names
#: another controller was left by one that died (SIGKILL, lost laptop)
CONTROLLER = f"{socket.gethostname().split('.')[0]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

_recovered: set[tuple[str, str]] = set()
_recovered_lock = threading.Lock()


class SlurmExecutor(HostExecutor):
    """Runs variants as Slurm jobs through one login node. Use as a context manager."""

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
        start_mismatched: bool | None = None,
    ) -> None:
        if host.slurm is None:
            raise SchedulerError(f"{host.name}: no slurm: section in the hosts file")
        self.host = host
        self.opts: SlurmOptions = host.slurm
        self.service = service
        self.campaign = campaign
        self.emit = listener
        self._own_transport = transport is None
        self.t = transport or (
            connect(host)
            if host.is_local
            else connect(host, accept_new_host_key=accept_new_host_key)
        )
        self.poll_min = poll_min
        self.poll_max = poll_max
        self.sleep = sleep
        #: None: each variant's own `mismatched_roles`; True/False: the campaign's choice
        self.start_mismatched = start_mismatched
        self._opened = False
        self.base = campaign_dir(host, campaign)
        self.preflight = preflight.Preflight(
            lambda cmd, timeout, stdin: self.t.run(cmd, timeout=timeout, stdin=stdin),
            lambda message, extra: self.emit(
                Notice(host=self.host.name, message=message, extra=extra)
            ),
        )
        self.cancel_event = threading.Event()
        self._job: str | None = None
        self._cancelled: list[str] = []  # jobs this slot cancelled: gone before it closes
        self.left: list[str] | None = None  # what close() read back as left (see Executor)
        self._inputs_memo = {}  # see HostExecutor.inputs (here: the node is unknown before a job)

    # ---- the commands, with the cluster's SLURM_CONF when the hosts file names one
    def check_jobs(self, exp: Experiment) -> None:
        """Raise SchedulerError when the job of `exp` could never run here: a deployment of
        more node ranks than the partition has nodes that take jobs (`plan --host`)."""
        ranks = multinode.node_roles(exp)
        if ranks:
            check_nodes(self.host, self._slurm, len(ranks), f"deployment {exp.name}")

    def _slurm(self, command: str, *, timeout: float = 60, stdin: str | None = None):  # noqa: ANN202
        if self.opts.conf:
            command = f"export SLURM_CONF={shlex.quote(self.opts.conf)}; {command}"
        return self.t.run(command, timeout=timeout, stdin=stdin)

    # ---- campaign scope
    def open(self) -> SlurmExecutor:
        check_cluster(self.host, self._slurm)
        d = shlex.quote(self.base)
        r = self.t.run(f"umask 077 && mkdir -p {d} && test -w {d}", timeout=30)
        if not r.ok:
            raise SchedulerError(
                f"{self.host.describe()}: cannot use run directory {self.base}: "
                f"{r.stderr.strip()[-200:]}",
                hint="set run_dir to a directory the login node and the compute nodes share",
            )
        self._recover()
        self._opened = True
        self.emit(
            StepDone(
                host=self.host.name, step="prepared", detail=f"partition {self.opts.partition}"
            )
        )
        return self

    def _recover(self) -> None:
        """Cancel the jobs that a controller which died left queued or running: this
        campaign's (their runs were never recorded: the campaign runs those variants again),
        and any other campaign's whose controller on this machine is gone (the same command
        after the hosts file changed starts a new campaign: the dead one's jobs would hold
        the GPUs until they end). Once per campaign and controller, whatever the number of
        slots. Jobs of live controllers and of other machines are left alone."""
        if not self.campaign:
            return
        with _recovered_lock:
            key = (self.host.name, self.campaign)
            if key in _recovered:
                return
            _recovered.add(key)
        r = self._slurm("squeue -h --me -o '%i|%T|%k'", timeout=60)
        stale = []
        for job, state, comment in facts.parse_squeue_jobs(r.stdout):
            info = jobscript.parse_comment(comment)
            if left_behind(info, campaign=self.campaign):
                stale.append((job, state, info.get("campaign", ""), info.get("run", "?")))
        if not stale:
            return
        ids = " ".join(j for j, _, _, _ in stale)
        self._slurm(f"scancel {ids}", timeout=60)
        # their secrets: no job will read them now
        self.t.run(
            "rm -f -- "
            + " ".join(
                shlex.quote(JobFiles(run_dir_of(self.host, camp, run)).secrets)
                for _, _, camp, run in stale
                if run != "?"
            ),
            timeout=60,
        )
        for job, state, camp, run in stale:
            again = "; its variant runs again" if camp == self.campaign else f" (campaign {camp})"
            self.emit(
                Notice(
                    host=self.host.name,
                    message=(
                        f"cancelled job {job} ({state.lower()}, run {run}) "
                        f"left by a controller that stopped{again}"
                    ),
                )
            )

    def close(self, *, restore: bool = True) -> list[str]:
        done: list[str] = []
        self.left = None
        with shield.shielded():  # an interrupt now waits until the jobs are gone
            try:
                if self._job is not None:
                    job, self._job = self._job, None
                    self._slurm(f"scancel {job}", timeout=60)
                    self._cancelled.append(job)
                    done.append(f"cancelled job {job}")
                self._wait_gone(self._cancelled)
                # read back: none of this slot's jobs is left in the queue
                self.left = (
                    []
                    if self._gone(self._cancelled)
                    else [f"job(s) {' '.join(self._cancelled)} still in the queue"]
                )
            finally:
                if self._own_transport:
                    self.t.close()
                self._opened = False
        return done

    def check_port(self, exp: Experiment) -> None:
        """The server's port is on a node the scheduler picks: nothing to check here."""

    def environment(self, exp: Experiment) -> envfacts.HostEnvironment:
        raise InfraError("a Slurm job reads its node's environment itself")

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
        check = exp.answers
        if check is not None and (check.enabled or check.ready_completion):
            # a job's server is reached only from inside its job: never judged as `pass`
            # without its answers having been asked
            raise ConfigError(
                f"the answers check is not run on Slurm hosts ({self.host.name})",
                file=exp.source,
                key="answers",
                hint="drop answers: (or set answers.enabled and answers.ready_completion "
                "to false) for a Slurm host, or run on an SSH host",
            )
        exp = exp.unsetting(env_keys)  # run and recorded as launched (see Executor.run)
        # the job runs the build's interpreter or image (first word of its command line);
        # the run is recorded under its config
        config, exp = exp, self.launch_of(exp)
        # a deployment of node ranks is one job over its nodes; rank 0's launch is polled
        ranks = multinode.node_roles(exp)
        head = multinode.head_launch(exp)
        roles: list[tuple[RoleResult, str]] = []
        first: FirstFailure | None = None
        done: dict[str, str] = {}
        started_at = time.time()
        t_submit = time.monotonic()
        self.emit(
            RunStarted(
                host=self.host.name, run_id=run_id, label=label, deadline_s=exp.health.timeout
            )
        )
        files = JobFiles(run_dir_of(self.host, self.campaign, run_id))
        script = jobscript.render(
            exp,
            files,
            run_id=run_id,
            campaign=self.campaign,
            env_keys=frozenset(env_keys),
            private_network=self.opts.private_network,
        )
        flagcheck = preflight.Check()
        state = facts.JobState("")
        out: dict[str, str] = {}
        ran: dict[str, float] = {"pending_s": 0.0}
        phase_times: dict[str, float] = {}
        seen_phase: Phase | None = None
        job: str | None = None
        try:
            # ranks that would split a flag they must agree on never start (the job sets
            # --nnodes and the init address itself: a config's own would be hidden)
            refused = refusal(exp, start=self.start_mismatched) if ranks else None
            if refused is not None:
                evidence = RunEvidence(invalid_reason=refused.reason)
            elif (flagcheck := self.preflight.check(head)).refusal is not None:
                evidence = RunEvidence(invalid_reason=flagcheck.refusal)
            else:
                if ranks:
                    check_nodes(self.host, self._slurm, len(ranks), f"deployment {exp.name}")
                job = self._submit(exp, files, script, run_id)
                state, seen_phase = self._watch(head, job, files, ran, phase_times, t_submit)
                out = self._collect(files, len(ranks))
                if ranks:
                    out["log"] = facts.server_lines(out["log"])
                evidence = _evidence(state, out, head, good_metric, seen_phase, job)
                if ranks:
                    done = jobscript.parse_result(out["result"])
                    roles = multinode.rank_results(ranks, out, done, time.gmtime().tm_year)
                    first = first_failure([r for r, _ in roles])
                    if first is not None:  # judged by the log of the rank that failed first
                        out["log"] = next(log for r, log in roles if r.role == first.role)
                        evidence = _evidence(state, out, head, good_metric, seen_phase, job)
        except RunCancelled:
            if job is not None:
                self._slurm(f"scancel {job}", timeout=60)
                self._cancelled.append(job)
                self._step("cancelled", f"job {job}")
            self._job = None
            raise
        except SchedulerError:
            raise  # the cluster refuses every job like this one: the campaign stops
        except (TransportError, InfraError) as exc:
            evidence = RunEvidence(infra_error=str(exc), log_tail=out.get("log", ""))
        finally:
            # Never collected (sbatch refused the job, the job was lost or cancelled, an
            # interrupt): the secrets go now; collecting removes them otherwise. They never
            # stay on the shared disk, and `restore` removes any an abrupt end left.
            if not out and jobscript.secret_env(exp):
                try:
                    self.t.run(f"rm -f {shlex.quote(files.secrets)}", timeout=30)
                except (TransportError, InfraError):
                    pass
        self._job = None
        verdict, sig = judge(evidence, target)
        if first is not None and not (evidence.infra_error or evidence.invalid_reason):
            # the run is the failure of the rank that failed first, judged as that rank
            # (how srun ended says only how the job stopped the ranks)
            k = next(i for i, r in enumerate(ranks) if r.name == first.role)
            own = multinode.rank_evidence(k, out.get("log", ""), done)
            verdict, sig = judge(replace(own, time_limit=evidence.time_limit), target)
            if first.infra:
                verdict, sig = Verdict.INFRA, None
        detail = evidence.invalid_reason or evidence.infra_error or ""
        if verdict is Verdict.INFRA and not detail:
            detail = outside_cause(evidence) or ""
        if verdict is Verdict.INVALID and sig is not None and sig.error_class == LAUNCH_CLASS:
            detail = launch_detail(sig, evidence.exit_code, config.build)
        log = out.get("log", "")
        if preflight.is_args_failure(verdict, sig) and not detail:
            detail = preflight.args_detail(log, sig, flagcheck)
        self.preflight.settle(head, flagcheck, verdict, sig, run_id)
        if first is not None and verdict is not Verdict.INFRA and not detail:
            detail = first.describe()
        result = jobscript.parse_result(out.get("result", ""))
        if verdict is Verdict.TIMEOUT or (evidence.timed_out and verdict is Verdict.FAIL):
            why = (
                f"killed by its time limit (--time {jobscript.time_limit(exp, self.opts)})"
                if state.state == "TIMEOUT"
                else f"not ready after {exp.health.timeout:g}s"
            )
            detail = f"job {job}: {why}; " + (
                first.describe()
                if first is not None
                else "last phase: "
                + (evidence.last_phase.value if evidence.last_phase else "none seen")
            )
        t_start = _num(result.get("server_start"))
        t_end = _num(result.get("end")) or _num(result.get("signalled"))
        duration = (
            (t_end - t_start)
            if t_start and t_end
            else max(time.monotonic() - t_submit - ran["pending_s"], 0.0)
        )
        ready_s = None
        if _num(result.get("ready_at")) and t_start:
            ready_s = round(_num(result["ready_at"]) - t_start, 3)  # type: ignore[operator]
            phase_times.setdefault(Phase.SERVING.value, ready_s)
        env_text = out.get("env", "")
        record = None
        if job is not None:
            record = {
                "manager": "slurm",
                "host": self.host.name,
                "job": job,
                # a deployment's job: every node of it, in rank order
                "node": (result.get("rank_nodes") if ranks else None)
                or state.node
                or result.get("node", ""),
                "state": state.state,
                "reason": state.reason,
                "pending_s": round(ran["pending_s"], 3),
                "dir": files.dir,
                "log": files.log,
                "sbatch": shlex.join(
                    jobscript.sbatch_argv(
                        exp,
                        self.opts,
                        files,
                        campaign=self.campaign,
                        run_id=run_id,
                        controller=CONTROLLER,
                    )
                ),
            }
        if ranks and record is not None:
            record = multinode.deployment_record(
                ranks, roles, first, exp, record, head=done.get("head") or None
            )
        env = envfacts.parse(env_text) if _complete(env_text, verdict) else None
        return self._finish(
            config,
            run_id,
            label,
            verdict,
            sig,
            detail,
            round(duration, 3),
            started_at=started_at + ran["pending_s"],
            ready_s=ready_s,
            host_record=record,
            last_phase=evidence.last_phase or seen_phase,
            phase_times=tuple(phase_times.items()),
            probe_metric=evidence.probe.metric if evidence.probe else None,
            environment=env,
            rendered=script if job is not None else None,
            polls=int(ran.get("polls", 0)),
            log_tail=log,
            invocation=f"slurm job {job}" if job else None,
        )

    def _submit(self, exp: Experiment, files: JobFiles, script: str, run_id: str) -> str:
        d = shlex.quote(files.dir)
        self.t.write_file(files.script, script, mode=0o600)  # makes the (private) directory
        secrets = jobscript.secret_file_text(exp, controller=CONTROLLER)
        if secrets:
            self.t.write_file(files.secrets, secrets, mode=0o600)
        argv = jobscript.sbatch_argv(
            exp, self.opts, files, campaign=self.campaign, run_id=run_id, controller=CONTROLLER
        )
        r = self._slurm(f"cd {d} && {shlex.join(argv)} {shlex.quote(files.script)}", timeout=60)
        job = facts.parse_job_id(r.stdout) if r.ok else None
        if job is None:
            raise SchedulerError(
                f"{self.host.describe()}: sbatch refused the job: "
                f"{facts.sbatch_refusal(r.stderr or r.stdout)}",
                hint="check the slurm: options of this host in the hosts file "
                "(partition, gres, time, account, constraint, options)",
            )
        self._job = job
        self._step("submitted", f"job {job}")
        return job

    def _watch(
        self,
        exp: Experiment,
        job: str,
        files: JobFiles,
        ran: dict[str, float],
        phase_times: dict[str, float],
        t_submit: float,
    ) -> tuple[facts.JobState, Phase | None]:
        """Poll until the job has ended. Returns its final state and the last phase seen."""
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
        t_run: float | None = None
        phase: Phase | None = None
        delay = self.poll_min
        unknown = 0
        state = facts.JobState("")
        for _ in range(10_000_000):  # bounded by the deadlines below
            # a cancel is honoured after one more look at the job: one that has ended by
            # now is collected and recorded (a job of the campaign that completed is a run
            # of it), one that still runs is cancelled
            cancelled = self.cancel_event.is_set()
            r = self._slurm(cmd, timeout=60)
            ran["polls"] = ran.get("polls", 0) + 1
            parts = facts.split(r.stdout, facts.RESULT_MARK, facts.LOG_MARK)
            now = time.monotonic()
            got = facts.parse_scontrol(parts.get("", ""))
            if got is None:
                got = self._sacct(job)
            if got is None:
                unknown += 1  # just submitted, or purged: a few tries before giving up
                if unknown >= 5:
                    raise InfraError(f"the scheduler no longer knows job {job}")
            else:
                state = got
            result = jobscript.parse_result(parts.get(facts.RESULT_MARK, ""))
            if state.pending or not state.state:
                ran["pending_s"] = now - t_submit
                self.emit(
                    Polled(
                        host=self.host.name,
                        state=f"pending {ran['pending_s']:.0f}s ({state.reason or 'submitted'})",
                        elapsed_s=0.0,
                    )
                )
                if state.reason.replace(" ", "_") in facts.NEVER:
                    self._slurm(f"scancel {job}", timeout=60)
                    raise SchedulerError(
                        f"{self.host.describe()}: job {job} can never start as asked "
                        f"(Slurm: {state.reason})",
                        hint="check the slurm: options of this host in the hosts file",
                    )
                if ran["pending_s"] > self.opts.pending_timeout:
                    self._slurm(f"scancel {job}", timeout=60)
                    raise InfraError(
                        f"job {job} still pending after "
                        f"{self.opts.pending_timeout:g}s ({state.reason})"
                    )
            elif t_run is None:
                t_run = now
                ran["pending_s"] = now - t_submit
                self._step(
                    "started",
                    f"job {job} on {state.node or '?'} after {ran['pending_s']:.1f}s pending",
                )
            if t_run is not None:
                elapsed = now - t_run
                seen = last_phase(parts.get(facts.LOG_MARK, "").splitlines())
                if seen is not None and (phase is None or PHASE_ORDER[seen] > PHASE_ORDER[phase]):
                    phase = seen
                    phase_times.setdefault(seen.value, round(elapsed, 3))
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
                    self._slurm(f"scancel {job}", timeout=60)
                    raise InfraError(f"job {job} ran {elapsed:.0f}s, past its time limit")
            if state.state and not state.active:
                return state, phase
            if cancelled:
                raise RunCancelled(f"run cancelled on {self.host.name}")
            self.sleep(delay)
            delay = min(delay * 1.5, self.poll_max)
        raise InfraError(f"job {job}: gave up watching")

    def _gone(self, jobs: list[str]) -> bool:
        if not jobs:
            return True
        r = self._slurm(
            f"squeue -h --name={shlex.quote(jobscript.job_name(self.campaign))} -o %i", timeout=60
        )
        return r.ok and not set(jobs) & set(r.stdout.split())

    def _wait_gone(self, jobs: list[str], *, wait: float = 30.0) -> None:
        """Wait (bounded) until the cancelled jobs have left the queue: a cancelled job stays
        COMPLETING while its processes are killed, and nothing of the campaign may be left
        in squeue when the controller exits."""
        deadline = time.monotonic() + wait
        while jobs and time.monotonic() < deadline:
            r = self._slurm(
                f"squeue -h --name={shlex.quote(jobscript.job_name(self.campaign))} -o %i",
                timeout=60,
            )
            if r.ok and not set(jobs) & set(r.stdout.split()):
                return
            self.sleep(0.2)

    def _sacct(self, job: str) -> facts.JobState | None:
        r = self._slurm(
            f"sacct -n -P -X -j {job} -o State,ExitCode,NodeList,Reason 2>/dev/null", timeout=60
        )
        return facts.parse_sacct(r.stdout) if r.ok else None

    def _collect(self, files: JobFiles, ranks: int = 0) -> dict[str, str]:
        q = shlex.quote
        # Once copied, only the newest `keep_runs` run directories stay on the cluster (the
        # server's log holds its arguments, API keys included; the store keeps every run).
        keep = max(int(self.host.keep_runs), 1)
        r = self.t.run(
            f"cat {q(files.result)} 2>/dev/null || cat {q(files.path('result.tmp'))} "
            f"2>/dev/null; echo {facts.LOG_MARK}; tail -n {LOG_FETCH_LINES} {q(files.log)} "
            f"2>/dev/null; echo {facts.PROBE_MARK}; cat {q(files.probe)} 2>/dev/null; "
            f"echo {facts.ENV_MARK}; cat {q(files.environment)} 2>/dev/null; "
            + "".join(
                f"echo {multinode.rank_mark(k)}; tail -n {LOG_FETCH_LINES} "
                f"{q(files.path(f'rank-{k}.log'))} 2>/dev/null; "
                for k in range(ranks)
            )
            + f"rm -f {q(files.secrets)}; ls -1dt {q(self.base)}/*/ 2>/dev/null | "
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


def _complete(env_text: str, verdict: Verdict) -> bool:
    """Whether the node's environment was read to its end (a job killed during the read,
    by a node failure say, leaves half of it: that is no change of the environment)."""
    return verdict is not Verdict.INFRA and envfacts.PY_MARK in env_text


def _num(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _evidence(
    state: facts.JobState,
    out: dict[str, str],
    exp: Experiment,
    good_metric: float | None,
    phase: Phase | None,
    job: str,
) -> RunEvidence:
    """What the job's end and its files say, for the classifier."""
    log = out.get("log", "")
    result = jobscript.parse_result(out.get("result", ""))
    where = f" on {state.node}" if state.node else ""
    if state.restarts > 0 or state.state in facts.INFRA:
        why = state.state.lower().replace("_", " ") + (f" ({state.reason})" if state.reason else "")
        return RunEvidence(
            infra_error=f"job {job} {why}{where}: the cluster's trouble, not the config's",
            log_tail=log,
        )
    if state.state == "TIMEOUT":
        return RunEvidence(
            log_tail=log,
            timed_out=True,
            time_limit=True,
            last_phase=phase,
            became_ready=result.get("state") == "ready",
        )
    s = result.get("state")
    if s is None:  # the script ended before it could say how the server did
        when = (
            "before the server started"
            if "server_start" not in result
            else "before the server's health was known"
        )
        return RunEvidence(
            infra_error=f"job {job} {state.state.lower()}{where} {when} (see "
            "slurm.out in its run directory)",
            log_tail=log,
        )
    if s == "cd_failed":
        return RunEvidence(
            invalid_reason=f"the working directory {exp.workdir} does not exist "
            f"on {state.node or 'the node'}"
        )
    exit_code = int(result["exit"]) if result.get("exit", "").lstrip("-").isdigit() else None
    ready = s == "ready"
    died = s == "dead" or "after_ready" in result or "after_probe" in result
    oom = state.state == "OUT_OF_MEMORY"
    if oom:
        died = True
    probe: ProbeOutcome | None = None
    if ready and exp.probe is not None and "probe_exit" in result:
        metric, passed = exp.probe.read(out.get("probe", ""), good_metric)
        probe = ProbeOutcome(
            exit_code=int(result["probe_exit"]),
            metric=metric,
            passed=passed,
            condition=exp.probe.pass_if,
            server_alive="after_probe" not in result,
        )
    return RunEvidence(
        log_tail=log,
        became_ready=ready,
        died_after_ready=ready and died,
        exit_code=exit_code if died else None,
        unit_result="oom-kill" if oom else None,
        timed_out=s == "timeout",
        last_phase=phase,
        probe=probe,
    )


def check_nodes(host: Host, run: Callable[..., object], needed: int, what: str) -> None:
    """The partition has `needed` nodes that take jobs (a deployment's job asks one per
    node rank); else our error, naming the nodes it has."""
    opts = host.slurm
    assert opts is not None
    r = run(f"sinfo -h -N -p {shlex.quote(opts.partition)} -o '%N|%t'", timeout=60)
    nodes = facts.parse_sinfo_nodes(getattr(r, "stdout", "") or "")
    usable = [n for n, state in nodes.items() if state not in facts.UNUSABLE]
    if len(usable) >= needed:
        return
    has = ", ".join(f"{n} ({state})" for n, state in sorted(nodes.items())) or "none"
    raise SchedulerError(
        f"{host.describe()}: {what} needs {needed} nodes, one per node rank; partition "
        f"'{opts.partition}' has {len(usable)} that take jobs: {has}",
        hint=f"run it where the partition has {needed} nodes (slurm.partition of "
        f"{host.name} in the hosts file), or on SSH hosts (roles.NAME.host)",
    )


def check_cluster(host: Host, run: Callable[..., object]) -> facts.Partition:
    """The partition exists, is up, and offers the gres the jobs ask for; else our error."""
    opts = host.slurm
    assert opts is not None
    r = run("sinfo -h -o '%P|%a|%D|%t|%G'", timeout=60)
    if not getattr(r, "ok", False):
        err = (getattr(r, "stderr", "") or getattr(r, "stdout", "")).strip()
        raise SchedulerError(
            f"{host.describe()}: sinfo does not answer: {err.splitlines()[-1] if err else '?'}",
            hint="check that Slurm's clients work on the login node (and slurm.conf in the "
            "hosts file, if the cluster's is not the default)",
        )
    parts = facts.parse_sinfo(getattr(r, "stdout", ""))
    part = parts.get(opts.partition)
    if part is None:
        raise SchedulerError(
            f"{host.describe()}: no partition '{opts.partition}' on this cluster",
            hint="partitions: "
            + (", ".join(sorted(parts)) or "none")
            + f"; set slurm.partition of {host.name} in the hosts file",
        )
    if opts.gres and not facts.gres_offered(opts.gres, part.gres):
        raise SchedulerError(
            f"{host.describe()}: partition '{opts.partition}' has no node with gres "
            f"{opts.gres} (it offers {', '.join(part.gres) or 'no gres'})",
            hint=f"set slurm.gres of {host.name} to what the nodes have, or configure it in "
            "gres.conf",
        )
    return part


#: a secrets file of another machine's controller younger than this may be one that is
#: about to be submitted: `restore` leaves it (the job would start without its secrets)
FOREIGN_SECRETS_GRACE_S = 600


def _dead_here(controller: str) -> bool | None:
    """True: a controller of this machine whose process is gone; False: alive here;
    None: another machine's (or unknown)."""
    name, _, rest = controller.partition(":")
    pid = rest.partition(":")[0]
    if name != socket.gethostname().split(".")[0] or not pid.isdigit():
        return None
    return not os.path.exists(f"/proc/{pid}")


def left_behind(info: dict[str, str], *, campaign: str | None = None) -> bool:
    """Whether a queued job (its comment's words) was left by a controller that stopped:
    one of this machine whose process is gone, or, given `campaign`, an earlier controller
    of that campaign. Never this controller's own, another machine's or another tool's.
    The one rule of the campaign start's recovery and of `orchestrator restore`."""
    ctl = info.get("controller", "")
    if ctl == CONTROLLER:
        return False
    if campaign and info.get("campaign") == campaign:
        return True
    return bool(_dead_here(ctl))


def cancel_orphans(host: Host, t: Transport) -> list[str]:
    """`orchestrator restore` of a cluster: cancel the jobs that controllers on this machine
    submitted and that outlived them (their process is gone), then remove the secrets files
    that no queued job will read. Jobs of live controllers, of other machines and of other
    tools are left alone. Returns what was done."""
    opts = host.slurm
    assert opts is not None
    env = f"export SLURM_CONF={shlex.quote(opts.conf)}; " if opts.conf else ""
    r = t.run(f"{env}squeue -h --me -o '%i|%T|%k'", timeout=60)
    if not r.ok:  # without the queue, no secrets file can be known to be unread
        raise SchedulerError(
            f"{host.describe()}: squeue does not answer: {(r.stderr or r.stdout).strip()[-200:]}"
        )
    done = []
    queued: set[str] = set()
    for job, state, comment in facts.parse_squeue_jobs(r.stdout):
        words = jobscript.parse_comment(comment)
        if not left_behind(words):
            queued.add(run_dir_of(host, words.get("campaign", ""), words.get("run", "")))
            continue
        t.run(f"{env}scancel {job}", timeout=60)
        done.append(
            f"cancelled job {job} ({state.lower()}) left by a controller that "
            f"stopped ({comment.split(' ', 1)[-1]})"
        )
    return done + remove_left_secrets(host, t, queued)


def run_dir_of(host: Host, campaign: str, run_id: str) -> str:
    """The run's directory on the shared filesystem (as SlurmExecutor makes it)."""
    return f"{campaign_dir(host, campaign)}/{_safe(run_id)}"


def campaign_dir(host: Host, campaign: str) -> str:
    return f"{(host.run_dir or '/tmp/orchestrator').rstrip('/')}/{_safe(campaign or 'runs')}"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def remove_left_secrets(host: Host, t: Transport, queued: set[str]) -> list[str]:
    """Remove the `secret.env` files that no job will read: not of a queued job's run, and
    written by a controller of this machine that is gone (or by an older version, which
    did not say who wrote it; or by another machine's controller long enough ago)."""
    base = shlex.quote((host.run_dir or "/tmp/orchestrator").rstrip("/"))
    # the file name, its age and its header's controller: never a line of the secrets
    r = t.run(
        f'now=$(date +%s); for f in {base}/*/*/secret.env; do [ -f "$f" ] || continue; '
        'printf \'%s|%s|%s\\n\' "$f" "$((now - $(stat -c %Y "$f")))" '
        f'"$(sed -n \'1s/^{jobscript.SECRETS_HEADER}//p\' "$f")"; done; true',
        timeout=60,
    )
    gone = []
    for line in r.stdout.splitlines():
        path, _, rest = line.partition("|")
        age, _, controller = rest.partition("|")
        if not path.endswith("/secret.env") or path.rsplit("/", 1)[0] in queued:
            continue
        dead = _dead_here(controller) if controller else True
        if dead is False or (dead is None and age.isdigit() and int(age) < FOREIGN_SECRETS_GRACE_S):
            continue
        gone.append(path)
    if gone:
        t.run("rm -f -- " + " ".join(shlex.quote(p) for p in gone), timeout=60, check=True)
    return [
        f"removed {p} (secrets no job will read, left by a controller that stopped)" for p in gone
    ]
