"""Campaigns: a bisection from endpoint checks to an answer backed by runs.

The runner checks both endpoints first (good must pass, bad must fail), fixes the target
signature from the bad run, drives the planner with verdicts (executed, resumed from this
campaign's earlier runs, or reused from the cache), and ends with an answer: the culprit
sets with the runs that prove them, every `other` signature met on the way as a separate
finding with the smallest variant that showed it, and the invalid variants. Everything is
recorded before the next run starts, so a campaign can be resumed after any interruption.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.errors import CampaignIncomplete, InfraError, OrchestratorError
from orchestrator.events import (
    CampaignFinished,
    CampaignStarted,
    Listener,
    Notice,
    RunRecorded,
    null_listener,
)
from orchestrator.executor import Executor, RunResult, service_name
from orchestrator.planner import Answer, Planner, Variant, make_strategy
from orchestrator.planning import Plan
from orchestrator.store import RunRow, Store
from orchestrator.verdicts import Signature, Verdict

MAX_INFRA_IN_A_ROW = 3


@dataclass(frozen=True)
class BisectOptions:
    strategy: str = "auto"
    repeat: int = 1
    max_runs: int | None = None
    deadline_s: float | None = None
    fresh: bool = False


@dataclass
class Finding:
    signature: Signature
    variant: tuple[int, ...]
    run_id: str
    label: str
    count: int = 1


@dataclass
class Outcome:
    campaign_id: str
    status: str  # found | incomplete | endpoints | interrupted
    message: str = ""
    target: Signature | None = None
    answer: Answer | None = None
    culprits: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    invalid: list[dict[str, Any]] = field(default_factory=list)
    runs_executed: int = 0
    runs_reused: int = 0
    narrowed: dict[str, Any] | None = None
    flaky: list[str] = field(default_factory=list)

    def to_json(self, plan: Plan) -> dict[str, Any]:
        return {
            "campaign": self.campaign_id,
            "status": self.status,
            "message": self.message,
            "target": str(self.target) if self.target else None,
            "culprits": self.culprits,
            "findings": [
                {"signature": str(f.signature), "variant": f.label, "deltas": list(f.variant),
                 "run": f.run_id, "count": f.count}
                for f in self.findings
            ],  # fmt: skip
            "invalid": self.invalid,
            "runs_executed": self.runs_executed,
            "runs_reused": self.runs_reused,
            "narrowed": self.narrowed,
            "flaky": self.flaky,
            "deltas": [d.describe() for d in plan.deltas],
        }


def relative(verdict: Verdict, signature: Signature | None, target: Signature | None) -> Verdict:
    """A recorded verdict re-read against a campaign's target signature."""
    if verdict in (Verdict.FAIL, Verdict.OTHER, Verdict.TIMEOUT) and signature and target:
        if signature == target:
            return Verdict.FAIL
        return Verdict.TIMEOUT if verdict is Verdict.TIMEOUT else Verdict.OTHER
    return verdict


def campaign_key(plan: Plan, hosts: list[Host], strategy: str) -> str:
    blob = json.dumps([plan.good.fingerprint(), plan.bad.fingerprint(), strategy,
                       sorted(h.name for h in hosts)])  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class Interrupted(OrchestratorError):
    """The campaign was stopped by Ctrl-C or SIGTERM; the host was restored."""

    exit_code = 130

    def __init__(self, campaign_id: str, resume: str) -> None:
        super().__init__(f"campaign {campaign_id} interrupted; the host was restored",
                         hint=f"resume with: {resume}")  # fmt: skip
        self.campaign_id = campaign_id
        self.resume = resume


ExecutorFactory = Callable[[Host, str, str, Listener], Executor]


def _default_executor(host: Host, service: str, campaign: str, listener: Listener) -> Executor:
    return Executor(host, service=service, campaign=campaign, listener=listener)


class Bisection:
    """One bisection campaign on one host (pools: issue of its own)."""

    def __init__(
        self,
        store: Store,
        plan: Plan,
        hosts: list[Host],
        *,
        options: BisectOptions = BisectOptions(),
        listener: Listener = null_listener,
        command: str = "",
        resume_id: str | None = None,
        executor_factory: ExecutorFactory = _default_executor,
    ) -> None:
        self.store = store
        self.plan = plan
        self.hosts = hosts
        self.opts = options
        self.emit = listener
        self.command = command
        self.executor_factory = executor_factory
        key = campaign_key(plan, hosts, options.strategy)
        cid = resume_id or store.find_resumable(key)
        self.resumed = cid is not None
        if cid is None:
            cid = store.create_campaign(kind="bisect", key=key, command=command, spec=self._spec())
        else:
            store.update_campaign(cid, status="running")
        self.cid = cid
        self.target: Signature | None = store.campaign(cid).target
        self.executed = 0
        self.reused = 0
        self.good_metric: float | None = None
        self._infra_streak = 0
        self._t0 = time.monotonic()
        self.env_keys = frozenset(plan.good.env_map()) | frozenset(plan.bad.env_map())

    def _spec(self) -> dict[str, Any]:
        return {
            "good": self.plan.good.to_dict(),
            "bad": self.plan.bad.to_dict(),
            "good_source": self.plan.good.source,
            "bad_source": self.plan.bad.source,
            "deltas": [d.to_dict() for d in self.plan.deltas],
            "strategy": self.opts.strategy,
            "hosts": [h.name for h in self.hosts],
            "options": {"repeat": self.opts.repeat, "max_runs": self.opts.max_runs,
                        "deadline_s": self.opts.deadline_s, "fresh": self.opts.fresh},
        }  # fmt: skip

    @property
    def resume_command(self) -> str:
        return f"orchestrator bisect --resume {self.cid}"

    # ---- the campaign
    def run(self) -> Outcome:
        host = self.hosts[0]
        previous = self.store.runs(self.cid)
        est = self.plan.estimates()
        self.emit(CampaignStarted(host=host.name, campaign_id=self.cid, n_deltas=self.plan.n,
                                  strategy=self.opts.strategy,
                                  expected_runs=2 + est["pair_mean"], resumed_runs=len(previous),
                                  deadline_s=self.opts.deadline_s))  # fmt: skip
        executor = self.executor_factory(host, service_name(self.plan.good), self.cid, self.emit)
        try:
            # open() restores first when a crashed controller left our drop-in behind
            with executor:
                outcome = self._search(executor)
        except KeyboardInterrupt:
            self.store.update_campaign(self.cid, status="interrupted")
            self.emit(CampaignFinished(campaign_id=self.cid, status="interrupted"))
            raise Interrupted(self.cid, self.resume_command) from None
        except InfraError as exc:
            self.store.update_campaign(self.cid, status="interrupted")
            exc.hint = ((exc.hint + "; ") if exc.hint else "") + f"then resume with: {self.resume_command}"
            raise
        self.store.update_campaign(self.cid, status="done" if outcome.status == "found" else
                                   outcome.status, answer=outcome.to_json(self.plan),
                                   target=self.target)  # fmt: skip
        self.emit(CampaignFinished(campaign_id=self.cid, status=outcome.status,
                                   message=outcome.message))  # fmt: skip
        return outcome

    def _search(self, ex: Executor) -> Outcome:
        n = self.plan.n
        full = tuple(range(n))
        # 1. endpoints: the good config must pass, the bad one must fail
        good = self._obtain(ex, (), "endpoint", target=None)
        if good.verdict is not Verdict.PASS:
            return self._stop_endpoints(
                f"the good config does not pass on {ex.host.name}: {good.verdict.value}"
                + (f" ({good.signature})" if good.signature else "") + f" [run {good.id}]",
            )
        self.good_metric = good.probe_metric
        bad = self._obtain(ex, full, "endpoint", target=None)
        if bad.verdict is not Verdict.FAIL or bad.signature is None:
            return self._stop_endpoints(
                f"the bad config does not fail on {ex.host.name}: {bad.verdict.value} "
                f"[run {bad.id}]; nothing to bisect (if it fails only sometimes, "
                "try --repeat 3)" if bad.verdict is Verdict.PASS else
                f"the bad config could not be judged: {bad.verdict.value}: {bad.detail} "
                f"[run {bad.id}]",
            )  # fmt: skip
        if self.target is None:
            self.target = bad.signature
            self.store.update_campaign(self.cid, target=self.target)
        # 2. the search
        planner = Planner(n, make_strategy(self.opts.strategy),
                          known={frozenset(): Verdict.PASS, frozenset(full): Verdict.FAIL},
                          closure=self.plan.closure())  # fmt: skip
        for _ in range(50 * n * n + 100):  # bounded: the planner proposes each variant once
            if planner.done:
                break
            stop = self._budget_exhausted()
            if stop:
                return self._incomplete(planner, stop)
            variant = planner.pending()[0]
            rnd = planner.current_round
            row = self._obtain(ex, tuple(sorted(variant)), rnd.purpose if rnd else "search",
                               target=self.target)  # fmt: skip
            planner.record(variant, row.verdict)
        answer = planner.answer
        flaky = self._repeat(ex, answer) if self.opts.repeat > 1 else []
        return self._conclude(answer, flaky)

    # ---- obtaining one verdict
    def _obtain(self, ex: Executor, variant: tuple[int, ...], purpose: str,
                target: Signature | None) -> RunRow:  # fmt: skip
        """This campaign's recorded run of the variant, a cached one, or a new run."""
        mine = [r for r in self.store.runs(self.cid) if r.variant == variant]
        done = [r for r in mine if r.verdict is not Verdict.INFRA]
        if done:
            row = done[-1]
            return self._relabel(row, target, "resume")
        exp = self.plan.variant(frozenset(variant))
        label = self.plan.describe(frozenset(variant))
        if not self.opts.fresh:
            hit = self.store.cached(exp.fingerprint(), ex.host.host_class)
            if hit is not None:
                cached = _CachedResult.from_row(hit, label, ex.host)
                rid = self.store.add_run(self.cid, variant=variant, purpose=purpose,
                                         result=cached, cached_from=hit.id)  # fmt: skip
                self.reused += 1
                return self._relabel(self.store.run(rid), target, "cache")
        return self._execute(ex, exp, variant, label, purpose, target)

    def _execute(self, ex: Executor, exp: Experiment, variant: tuple[int, ...], label: str,
                 purpose: str, target: Signature | None) -> RunRow:  # fmt: skip
        seq = self.store.next_seq(self.cid)
        result = ex.run(exp, run_id=f"{self.cid}.{seq}", label=label, target=target,
                        env_keys=self.env_keys, good_metric=self.good_metric)  # fmt: skip
        rid = self.store.add_run(self.cid, variant=variant, purpose=purpose, result=result)
        self.executed += 1
        if result.verdict is Verdict.INFRA:
            self._infra_streak += 1
            if self._infra_streak >= MAX_INFRA_IN_A_ROW:
                raise InfraError(
                    f"{ex.host.describe()}: {self._infra_streak} runs in a row failed on host "
                    f"trouble; last: {result.detail}",
                    hint="check the host (orchestrator hosts check)",
                )
        else:
            self._infra_streak = 0
        return self._relabel(self.store.run(rid), target, "run")

    def _relabel(self, row: RunRow, target: Signature | None, source: str) -> RunRow:
        verdict = relative(row.verdict, row.signature, target)
        if source != "run" or verdict is not row.verdict:
            from dataclasses import replace

            row = replace(row, verdict=verdict)
        done = sum(1 for r in self.store.runs(self.cid) if r.verdict is not Verdict.INFRA)
        self.emit(RunRecorded(host=row.host, run_id=row.id, label=row.label, purpose=row.purpose,
                              verdict=verdict, signature=row.signature, source=source,
                              duration_s=row.duration, done=done))  # fmt: skip
        return row

    # ---- budgets and endings
    def _budget_exhausted(self) -> str | None:
        if self.opts.max_runs is not None:
            total = sum(1 for r in self.store.runs(self.cid) if r.cached_from is None)
            if total >= self.opts.max_runs:
                return f"--max-runs {self.opts.max_runs} reached"
        if self.opts.deadline_s is not None and time.monotonic() - self._t0 >= self.opts.deadline_s:
            return f"--deadline {self.opts.deadline_s:g}s reached"
        return None

    def _stop_endpoints(self, message: str) -> Outcome:
        return Outcome(self.cid, "endpoints", message=message, target=self.target,
                       runs_executed=self.executed, runs_reused=self.reused,
                       findings=self._findings())  # fmt: skip

    def _verdicts(self) -> dict[tuple[int, ...], Verdict]:
        out: dict[tuple[int, ...], Verdict] = {}
        for r in self.store.runs(self.cid):
            if r.verdict is not Verdict.INFRA:
                out[r.variant] = relative(r.verdict, r.signature, self.target)
        return out

    def _incomplete(self, planner: Planner, why: str) -> Outcome:
        verdicts = self._verdicts()
        fails = [v for v, x in verdicts.items() if x is Verdict.FAIL]
        passes = [v for v, x in verdicts.items() if x is Verdict.PASS]
        smallest = min(fails, key=len) if fails else tuple(range(self.plan.n))
        largest = max(passes, key=len) if passes else ()
        narrowed = {
            "failure_needs_some_of": [self.plan.deltas[i].describe() for i in smallest],
            "harmless_together": [self.plan.deltas[i].describe() for i in largest],
        }
        return Outcome(self.cid, "incomplete", message=f"stopped before an answer: {why}",
                       target=self.target, runs_executed=self.executed, runs_reused=self.reused,
                       narrowed=narrowed, findings=self._findings(),
                       invalid=self._invalid())  # fmt: skip

    def _findings(self) -> list[Finding]:
        by_sig: dict[Signature, Finding] = {}
        for r in self.store.runs(self.cid):
            verdict = relative(r.verdict, r.signature, self.target)
            if verdict not in (Verdict.OTHER, Verdict.TIMEOUT) or r.signature is None:
                continue
            f = by_sig.get(r.signature)
            if f is None:
                by_sig[r.signature] = Finding(r.signature, r.variant, r.id, r.label)
            else:
                f.count += 1
                if len(r.variant) < len(f.variant):
                    f.variant, f.run_id, f.label = r.variant, r.id, r.label
        return list(by_sig.values())

    def _invalid(self) -> list[dict[str, Any]]:
        return [{"variant": r.label, "run": r.id, "reason": r.detail}
                for r in self.store.runs(self.cid) if r.verdict is Verdict.INVALID]  # fmt: skip

    def _run_of(self, variant: frozenset[int]) -> str | None:
        key = tuple(sorted(variant))
        rows = [r for r in self.store.runs(self.cid) if r.variant == key
                and r.verdict is not Verdict.INFRA]  # fmt: skip
        return rows[-1].id if rows else None

    def _repeat(self, ex: Executor, answer: Answer) -> list[str]:
        """Run the variants that decide the answer again; report any that disagree."""
        flaky: list[str] = []
        deciding: list[tuple[frozenset[int], Verdict]] = [
            (frozenset(), Verdict.PASS), (frozenset(range(self.plan.n)), Verdict.FAIL)]
        for c in answer.culprits:
            deciding.append((c.reproduced_by, Verdict.FAIL))
            deciding += [(v, Verdict.PASS) for _, v in c.cleared_by]
        for variant, expected in deciding:
            for _ in range(self.opts.repeat - 1):
                exp = self.plan.variant(variant)
                label = self.plan.describe(variant)
                row = self._execute(ex, exp, tuple(sorted(variant)), label, "repeat", self.target)
                if (row.verdict is Verdict.FAIL) != (expected is Verdict.FAIL):
                    flaky.append(f"{label}: {row.verdict.value} on repeat (run {row.id})")
        return flaky

    def _conclude(self, answer: Answer, flaky: list[str]) -> Outcome:
        culprits = []
        for c in answer.culprits:
            culprits.append({
                "deltas": [self.plan.deltas[i].describe() for i in sorted(c.deltas)],
                "flags": [self.plan.deltas[i].short() for i in sorted(c.deltas)],
                "indices": sorted(c.deltas),
                "interacting": len(c.deltas) > 1,
                "reproduced_by": self._run_of(c.reproduced_by),
                "cleared_by": {self.plan.deltas[i].short(): self._run_of(v)
                               for i, v in c.cleared_by},
                "confirmed": c.confirmed,
            })  # fmt: skip
        status = "found" if answer.culprits and answer.complete else "incomplete"
        message = answer.reason if status != "found" else ""
        return Outcome(self.cid, status, message=message, target=self.target, answer=answer,
                       culprits=culprits, findings=self._findings(), invalid=self._invalid(),
                       runs_executed=self.executed, runs_reused=self.reused,
                       flaky=flaky)  # fmt: skip


@dataclass(frozen=True)
class _CachedResult:
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
    last_phase: Any
    log_tail: str
    rendered: str | None
    probe_metric: float | None
    detail: str

    @classmethod
    def from_row(cls, row: RunRow, label: str, host: Host) -> _CachedResult:
        from orchestrator.verdicts import Phase

        return cls(
            experiment=row.experiment(), label=label, host=host.name, host_class=host.host_class,
            verdict=row.verdict, signature=row.signature, started_at=time.time(), duration_s=0.0,
            phase_times=tuple(row.phase_times.items()),
            last_phase=Phase(row.last_phase) if row.last_phase else None, log_tail="",
            rendered=row.rendered, probe_metric=row.probe_metric,
            detail=f"reused from run {row.id}" + (f": {row.detail}" if row.detail else ""),
        )  # fmt: skip


__all__ = ["BisectOptions", "Bisection", "CampaignIncomplete", "Interrupted", "Outcome",
           "relative"]  # fmt: skip


def single_run(
    store: Store,
    exp: Experiment,
    host: Host,
    *,
    kind: str,
    command: str,
    label: str,
    target: Signature | None = None,
    env_keys: frozenset[str] = frozenset(),
    listener: Listener = null_listener,
    executor_factory: ExecutorFactory = _default_executor,
    spec_extra: dict[str, Any] | None = None,
) -> RunRow:
    """One recorded run outside a bisection (`orchestrator run`, `orchestrator rerun`)."""
    spec = {"config": exp.to_dict(), "source": exp.source, "hosts": [host.name]}
    spec |= spec_extra or {}
    key = hashlib.sha256(f"{kind}:{exp.fingerprint()}:{time.time()}".encode()).hexdigest()[:16]
    cid = store.create_campaign(kind=kind, key=key, command=command, spec=spec)
    if target is not None:
        store.update_campaign(cid, target=target)
    try:
        with executor_factory(host, service_name(exp), cid, listener) as ex:
            result = ex.run(exp, run_id=f"{cid}.1", label=label, target=target,
                            env_keys=env_keys | frozenset(exp.env_map()))  # fmt: skip
    except KeyboardInterrupt:
        store.update_campaign(cid, status="interrupted")
        raise
    rid = store.add_run(cid, variant=(), purpose=kind, result=result)
    store.update_campaign(cid, status="done")
    row = store.run(rid)
    listener(RunRecorded(host=row.host, run_id=row.id, label=row.label, purpose=kind,
                         verdict=row.verdict, signature=row.signature, duration_s=row.duration,
                         done=1))  # fmt: skip
    return row
