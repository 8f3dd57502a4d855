"""The Slurm executor: one variant = one `sbatch` job, watched until it ends, then judged.

It honours the executor's contract (open, run -> RunResult, close, `cancel_event`), so
bisections and sweeps drive a cluster as they drive an SSH host; the pool gives a Slurm
host `max_jobs` slots, each an executor like this one with one job at a time, and the
scheduler decides where and when each job runs.

Per campaign (`open`): ask `sinfo` for the partition and its gres (our error, not a
Slurm traceback, when it lacks either: `check.check_cluster`), make the private run
directory, and cancel the campaign's jobs a controller that died left in the queue
(`leftovers.recover`: found by job name; the job comment names the run and the
controller that submitted it). Per run: the flag preflight on the login node, the job
script (see `jobscript`) and the secrets file written through stdin, `sbatch`; then the
job is watched until it ends (`jobwatch`), what it left is read in one command and
judged by the same classifier as every other backend (`settle`); a job killed by its
time limit is `timeout`; a node failure, preemption, requeue or a job cancelled by
someone else is `infra` (retried, never cached). A cancelled run (its round was decided,
Ctrl-C, SIGTERM) `scancel`s its job.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Iterable

from orchestrator import shield
from orchestrator.config.deployment import refusal
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host, SlurmOptions
from orchestrator.diagnosis.classify.judge import RunEvidence
from orchestrator.diagnosis.first_failure import FirstFailure, RoleResult, first_failure
from orchestrator.diagnosis.verdicts import Signature
from orchestrator.errors import ConfigError, InfraError, SchedulerError, TransportError
from orchestrator.events import Listener, Notice, RunStarted, StepDone, null_listener
from orchestrator.execution import environment as envfacts
from orchestrator.execution import preflight
from orchestrator.execution.contract import HostExecutor, RunCancelled, RunResult
from orchestrator.execution.slurm import facts, jobscript, multinode
from orchestrator.execution.slurm.check import check_cluster, check_nodes
from orchestrator.execution.slurm.jobscript import JobFiles
from orchestrator.execution.slurm.jobwatch import JobProgress, JobWatch, collect
from orchestrator.execution.slurm.leftovers import CONTROLLER, campaign_dir, recover, run_dir_of
from orchestrator.execution.slurm.settle import (
    env_complete,
    job_evidence,
    job_record,
    settle,
    timings,
)
from orchestrator.execution.transport import Transport, connect


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
        self.watcher = JobWatch(
            host,
            self._slurm,
            self.emit,
            self.sleep,
            self.cancel_event,
            poll_min=poll_min,
            poll_max=poll_max,
        )

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
        recover(self.host, self._slurm, self.t, self.campaign, self.emit)
        self._opened = True
        self.emit(
            StepDone(
                host=self.host.name, step="prepared", detail=f"partition {self.opts.partition}"
            )
        )
        return self

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
        progress = JobProgress(t_submit=time.monotonic())
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
                state = self.watcher.watch(head, job, files, progress)
                out = collect(self.t, self.host, self.base, files, len(ranks))
                if ranks:
                    out["log"] = facts.server_lines(out["log"])
                evidence = job_evidence(state, out, head, good_metric, progress.phase, job)
                if ranks:
                    done = jobscript.parse_result(out["result"])
                    roles = multinode.rank_results(ranks, out, done, time.gmtime().tm_year)
                    first = first_failure([r for r, _ in roles])
                    if first is not None:  # judged by the log of the rank that failed first
                        out["log"] = next(log for r, log in roles if r.role == first.role)
                        evidence = job_evidence(state, out, head, good_metric, progress.phase, job)
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
        judged = settle(
            evidence,
            target,
            exp=exp,
            config=config,
            opts=self.opts,
            state=state,
            job=job,
            out=out,
            first=first,
            ranks=ranks,
            done=done,
            flagcheck=flagcheck,
        )
        self.preflight.settle(head, flagcheck, judged.verdict, judged.signature, run_id)
        result = jobscript.parse_result(out.get("result", ""))
        duration, ready_s = timings(result, progress, time.monotonic())
        record = None
        if job is not None:
            sbatch = jobscript.sbatch_argv(
                exp, self.opts, files, campaign=self.campaign, run_id=run_id, controller=CONTROLLER
            )
            record = job_record(
                host=self.host.name,
                job=job,
                state=state,
                result=result,
                progress=progress,
                files=files,
                sbatch=sbatch,
                deployment=bool(ranks),
            )
            if ranks:
                record = multinode.deployment_record(
                    ranks, roles, first, exp, record, head=done.get("head") or None
                )
        env_text = out.get("env", "")
        env = envfacts.parse(env_text) if env_complete(env_text, judged.verdict) else None
        return self._finish(
            config,
            run_id,
            label,
            judged.verdict,
            judged.signature,
            judged.detail,
            duration,
            started_at=started_at + progress.pending_s,
            ready_s=ready_s,
            host_record=record,
            last_phase=evidence.last_phase or progress.phase,
            phase_times=tuple(progress.phase_times.items()),
            probe_metric=evidence.probe.metric if evidence.probe else None,
            environment=env,
            rendered=script if job is not None else None,
            polls=progress.polls,
            log_tail=out.get("log", ""),
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
