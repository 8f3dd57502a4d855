"""The verdict of a job that ended: what its end and its files say, judged.

`job_evidence` reads the job's final state and the files it left into the classifier's
evidence (a node failure, preemption, requeue or a job cancelled by someone else is the
cluster's trouble: `infra`; a job killed by its time limit is `timeout`); `settle` judges
it, as the node rank that failed first when the job ran a deployment over nodes, and
says why in one line; `timings` and `job_record` are what the run's record takes from
the job.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace

from orchestrator.config.deployment import Role
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import SlurmOptions
from orchestrator.diagnosis.classify.judge import (
    LAUNCH_CLASS,
    ProbeOutcome,
    RunEvidence,
    judge,
    launch_detail,
    outside_cause,
)
from orchestrator.diagnosis.first_failure import FirstFailure
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict
from orchestrator.execution import environment as envfacts
from orchestrator.execution import preflight
from orchestrator.execution.slurm import facts, jobscript, multinode
from orchestrator.execution.slurm.jobscript import JobFiles
from orchestrator.execution.slurm.jobwatch import JobProgress


@dataclass(frozen=True)
class Settled:
    """A job's run judged: its verdict, signature and the one line that says why."""

    verdict: Verdict
    signature: Signature | None
    detail: str


def settle(
    evidence: RunEvidence,
    target: Signature | None,
    *,
    exp: Experiment,
    config: Experiment,
    opts: SlurmOptions,
    state: facts.JobState,
    job: str | None,
    out: dict[str, str],
    first: FirstFailure | None = None,
    ranks: Sequence[Role] = (),
    done: dict[str, str] | None = None,
    flagcheck: preflight.Check | None = None,
) -> Settled:
    """Judge a job's run: `evidence` as `job_evidence` read it; `exp` the launch that ran
    (`config` the one recorded); for a deployment over nodes, its `ranks`, the rank that
    `first` failed and the job's result words (`done`)."""
    verdict, sig = judge(evidence, target)
    if first is not None and not (evidence.infra_error or evidence.invalid_reason):
        # the run is the failure of the rank that failed first, judged as that rank
        # (how srun ended says only how the job stopped the ranks)
        k = next(i for i, r in enumerate(ranks) if r.name == first.role)
        own = multinode.rank_evidence(k, out.get("log", ""), done or {})
        verdict, sig = judge(replace(own, time_limit=evidence.time_limit), target)
        if first.infra:
            verdict, sig = Verdict.INFRA, None
    detail = evidence.invalid_reason or evidence.infra_error or ""
    if verdict is Verdict.INFRA and not detail:
        detail = outside_cause(evidence) or ""
    if verdict is Verdict.INVALID and sig is not None and sig.error_class == LAUNCH_CLASS:
        detail = launch_detail(sig, evidence.exit_code, config.build)
    if preflight.is_args_failure(verdict, sig) and not detail:
        detail = preflight.args_detail(out.get("log", ""), sig, flagcheck or preflight.Check())
    if first is not None and verdict is not Verdict.INFRA and not detail:
        detail = first.describe()
    if verdict is Verdict.TIMEOUT or (evidence.timed_out and verdict is Verdict.FAIL):
        why = (
            f"killed by its time limit (--time {jobscript.time_limit(exp, opts)})"
            if state.state == "TIMEOUT"
            else f"not ready after {exp.health.timeout:g}s"
        )
        detail = f"job {job}: {why}; " + (
            first.describe()
            if first is not None
            else "last phase: "
            + (evidence.last_phase.value if evidence.last_phase else "none seen")
        )
    return Settled(verdict, sig, detail)


def timings(
    result: dict[str, str], progress: JobProgress, now: float
) -> tuple[float, float | None]:
    """The run's duration (the server's own, from the job's result, else the time since
    submission less the time pending) and its seconds to ready (None: never ready).
    Adds `serving` to the progress's phase times when the job's result says it was ready."""
    t_start = num(result.get("server_start"))
    t_end = num(result.get("end")) or num(result.get("signalled"))
    duration = (
        (t_end - t_start)
        if t_start and t_end
        else max(now - progress.t_submit - progress.pending_s, 0.0)
    )
    ready_s = None
    ready_at = num(result.get("ready_at"))
    if ready_at and t_start:
        ready_s = round(ready_at - t_start, 3)
        progress.phase_times.setdefault(Phase.SERVING.value, ready_s)
    return round(duration, 3), ready_s


def job_record(
    *,
    host: str,
    job: str,
    state: facts.JobState,
    result: dict[str, str],
    progress: JobProgress,
    files: JobFiles,
    sbatch: list[str],
    deployment: bool,
) -> dict[str, object]:
    """What the run did on the cluster, for its record (`show`, reports)."""
    return {
        "manager": "slurm",
        "host": host,
        "job": job,
        # a deployment's job: every node of it, in rank order
        "node": (result.get("rank_nodes") if deployment else None)
        or state.node
        or result.get("node", ""),
        "state": state.state,
        "reason": state.reason,
        "pending_s": round(progress.pending_s, 3),
        "dir": files.dir,
        "log": files.log,
        "sbatch": shlex.join(sbatch),
    }


def env_complete(env_text: str, verdict: Verdict) -> bool:
    """Whether the node's environment was read to its end (a job killed during the read,
    by a node failure say, leaves half of it: that is no change of the environment)."""
    return verdict is not Verdict.INFRA and envfacts.PY_MARK in env_text


def num(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def job_evidence(
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
