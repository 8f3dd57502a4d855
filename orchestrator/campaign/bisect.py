"""Campaigns: a bisection from endpoint checks to an answer backed by runs.

The runner checks both endpoints first (good must pass, bad must fail), fixes the target
signature from the bad run, drives the planner with verdicts (executed, resumed from this
campaign's earlier runs, or reused from the cache), and ends with an answer: the culprit
sets with the runs that prove them, every `other` signature met on the way as a separate
finding with the smallest variant that showed it, and the invalid variants. Everything is
recorded before the next run starts, so a campaign can be resumed after any interruption.

`Bisection.run()` reads top to bottom: the endpoints (`endpoints.py`), the search
(`search.py`), the confirmation of its answer (`confirm.py`), the findings and the
answer (`answer.py`). Its parts receive the campaign's runs (`runs.py`) and the callables
they need, never the campaign: the dispatch loop's bisection side (`variants.py`), the
reuse of recorded runs (`reuse.py`) and the rehearsal on dummy weights (`rehearse.py`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import replace

from orchestrator.campaign import answers_check, envwatch, flaky, measured, rehearsal, timing
from orchestrator.campaign.answer import CampaignAnswer, resource_answer
from orchestrator.campaign.confirm import confirm_sets, repeat
from orchestrator.campaign.core import (
    CampaignCore,
    ExecutorFactory,
    default_executor,
)
from orchestrator.campaign.dispatch import Dispatch
from orchestrator.campaign.endpoints import Endpoints
from orchestrator.campaign.narrow import narrow_findings
from orchestrator.campaign.planning import Plan
from orchestrator.campaign.pool import Pool
from orchestrator.campaign.records import (
    BisectOptions,
    BisectSpec,
    Outcome,
    Status,
)
from orchestrator.campaign.rehearse import Rehearsal
from orchestrator.campaign.reuse import RecordedRuns
from orchestrator.campaign.runs import BisectionRuns
from orchestrator.campaign.search import Search
from orchestrator.campaign.variants import VariantRuns
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.diagnosis.verdicts import Signature, Verdict, relative
from orchestrator.errors import CampaignIncomplete, Interrupted
from orchestrator.events import CampaignStarted, Listener, null_listener
from orchestrator.execution.executor import service_name
from orchestrator.execution.inputs import env_digest
from orchestrator.store.store import RunRow, Store


def campaign_key(plan: Plan, hosts: list[Host], strategy: str, *, repair: bool = True) -> str:
    """The same command resumes an unfinished campaign of this key: the pair, the strategy,
    the hosts, and what the hosts file hands their servers (another `env:` is another
    campaign, never the resume of one judged without it)."""
    # a host without env: keeps the key it always had (its campaigns resume as before)
    names = sorted(h.name + (f"+env:{env_digest(h.env)}" if h.env else "") for h in hosts)
    parts = [plan.good.fingerprint(), plan.bad.fingerprint(), strategy, names]
    if not plan.split:  # other deltas: another campaign (a split plan keeps its old key)
        parts.append("no-split")
    if not repair:  # other verdicts for a variant that dies of a resource
        parts.append("no-repair")
    if plan.order:  # builds searched on an order: another search
        parts.append(["builds", *plan.order])
    blob = json.dumps(parts)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


DEFAULT_OPTIONS = BisectOptions()


class Bisection:
    """One bisection campaign on a host or a pool of hosts."""

    def __init__(
        self,
        store: Store,
        plan: Plan,
        hosts: list[Host],
        *,
        options: BisectOptions = DEFAULT_OPTIONS,
        listener: Listener = null_listener,
        command: str = "",
        resume_id: str | None = None,
        executor_factory: ExecutorFactory = default_executor,
    ) -> None:
        self.store = store
        self.hosts = hosts
        self.opts = options
        self.emit = listener
        self.core = CampaignCore(
            store,
            kind="bisect",
            key=campaign_key(
                plan,
                hosts,
                options.strategy + ("+rehearse" if options.rehearse else ""),
                repair=options.repair,
            ),
            spec=lambda: self.spec(plan).to_dict(),
            secrets=plan.good.secrets() | plan.bad.secrets(),
            command=command,
            resume_id=resume_id,
            max_runs=options.max_runs,
            deadline_s=options.deadline_s,
            listener=listener,
            executor_factory=executor_factory,
            find=not options.fresh,  # --fresh starts anew, even beside an interrupted one
        )
        self.cid = self.core.cid
        self.resumed = self.core.resumed
        #: the runs, the pair the search runs on now and the target (campaign/runs.py)
        self.runs = BisectionRuns(
            store, self.core, plan, hosts, options, target=store.campaign(self.cid).target
        )
        #: verdicts from recorded runs: this campaign's, or earlier ones' (campaign/reuse.py)
        self.recorded = RecordedRuns(self.runs, listener, fresh=options.fresh)
        self.env_keys = plan.env_keys
        #: both configs' flags go to each host's server before it starts anything: a typo
        #: in the bad config is refused before the good config's long start, not after it
        self._precheck: tuple[Experiment, ...] = (plan.good, plan.bad)
        if options.rehearse and plan.bad.weights == "real" and not rehearsal.refused(plan):
            self._precheck += (plan.bad.with_dummy_weights(),)
        #: every build an ordered search may run: each must be installed on each host
        #: before the first run (the others' flags are not put to them: a flag a build
        #: between does not know is that variant's `invalid`, not the campaign's error)
        self._builds = tuple(replace(plan.good, build=b) for b in plan.order)
        self.rehearsal = Rehearsal(
            self.runs,
            emit=listener,
            host=hosts[0].name,
            search=self._bisect,
            confirm=lambda pool, outcome: confirm_sets(self.runs, self._drive, pool, outcome),
            drive=self._drive,
            reused=lambda: self.reused,
        )

    @property
    def reused(self) -> int:
        """Runs taken from earlier campaigns' records (this invocation)."""
        return self.recorded.reused

    @property
    def plan(self) -> Plan:
        """The pair the search runs on now (real or dummy weights)."""
        return self.runs.plan

    @property
    def target(self) -> Signature | None:
        return self.runs.target

    @target.setter
    def target(self, target: Signature | None) -> None:
        self.runs.target = target

    @property
    def executed(self) -> int:
        """Runs executed by this invocation."""
        return self.runs.executed

    def spec(self, plan: Plan) -> BisectSpec:
        return BisectSpec(
            good=plan.good.to_dict(),
            bad=plan.bad.to_dict(),
            good_source=plan.good.source,
            bad_source=plan.bad.source,
            deltas=[d.to_dict() for d in plan.deltas],
            hosts=[h.name for h in self.hosts],
            options=self.opts,
        )

    # ---- the campaign
    def run(self) -> Outcome:
        previous = self.runs.rows()
        est = self.plan.estimates()
        # a rehearsal adds its starts on real weights: bad, then good + the culprit set
        extra = (
            timing.rehearsal_starts(self.plan.n)[0]
            if self.opts.rehearse and not rehearsal.refused(self.plan)
            else 0.0
        )
        self.emit(
            CampaignStarted(
                host=self.hosts[0].name,
                campaign_id=self.cid,
                n_deltas=self.plan.n,
                strategy=self.opts.strategy,
                expected_runs=2 + est["pair_mean"] + extra,
                resumed_runs=len(previous),
                deadline_s=self.opts.deadline_s,
                run_time_s=self.plan.bad.run_time or self.plan.good.run_time,
            )
        )
        with (
            self.core.guard(self._partial),
            self.core.pool(
                self.hosts, service=service_name(self.plan.good), env_keys=self.env_keys
            ) as pool,
        ):
            if previous:
                envwatch.check_hosts(self.store, self.cid, self.hosts)
            outcome = self.rehearsal.run(pool) if self.opts.rehearse else self._bisect(pool)
        outcome.removed_hosts = list(pool.removed)
        outcome.weights = self.rehearsal.weights_summary()
        outcome.deltas = [d.describe() for d in self.plan.deltas]
        outcome.repairs = self.runs.repairs()
        resource_answer(outcome, self.plan.n)
        outcome.answers = self._answer().answers_line()  # the rule that judged, said
        # a found answer is recorded as `done`, like every campaign that concluded
        self.core.finish(
            outcome.status,
            stored_as=Status.DONE if outcome.found else None,
            message=outcome.message,
            answer=outcome.to_dict(),
            target=self.target,
        )
        return outcome

    def _partial(self) -> Outcome:
        """The outcome so far, for an interrupt: what was found on the way, nothing more."""
        return Outcome(
            self.cid,
            Status.INTERRUPTED,
            message="interrupted",
            target=self.target,
            runs_executed=self.executed,
            runs_reused=self.reused,
            findings=self._answer().findings(),
            invalid=self._answer().invalid(),
            deltas=[d.describe() for d in self.plan.deltas],
            repairs=self.runs.repairs(),
        )

    def _bisect(self, pool: Pool) -> Outcome:
        """The bisection on the weights the runs are read on now: the endpoints, the
        search, the confirmation of its answer (--repeat) and the findings on the way."""
        stopped = self._endpoints(pool)  # 1. good passes, bad fails (the target)
        if stopped is not None:
            return stopped
        if self._measured():  # a probe metric against good's: its effects under noise
            return self._measure(pool)
        search, stop = self._search(pool)  # 2. the search, on every idle host
        # 3. its answer confirmed (--repeat), 4. the findings on the way, 5. the answer
        return self._searched(pool, search, stop)

    def _search(self, pool: Pool) -> tuple[Search, str | None]:
        """2. The search from the endpoints' verdicts to an answer, and why it stopped
        early (a budget), if it did."""
        # Each round's variants go to idle hosts; a decided round cancels the runs it no
        # longer needs. Every recorded run is evidence (a resumed campaign's posterior is
        # what it was); `auto` turns noise-aware by itself once the runs show flakiness.
        self.recorded.reuse_recorded(pool)
        # the noise-aware search keeps every slot of the pool busy (a Slurm host: max_jobs)
        strategy = self.plan.wrap(
            flaky.strategy_for(
                self.opts.strategy,
                self.opts.confidence,
                lambda v: self.plan.describe(frozenset(v)),
                slots=len(pool.healthy()),
            )
        )
        search = Search(self.runs, strategy)
        search.watch = flaky.NoiseWatch(self.emit, self.cid, estimate=search.estimate)
        search.watch.check(search.planner)
        stop = self._drive(
            pool,
            search.wanted,
            search.record,
            target=self.target,
            purpose=search.purpose,
            speculate=search.ahead,
            fresh_runs=search.again,
        )
        return search, stop

    def _endpoints(self, pool: Pool) -> Outcome | None:
        """1. The endpoints, side by side when there are two hosts: good must pass, bad
        must fail (its failure is the target). The outcome when they end the campaign."""
        where = ", ".join(h.name for h in self.hosts)
        ends = Endpoints(self.runs, self.emit)
        full = ends.full
        stop = self._drive(
            pool,
            ends.wanted,
            ends.got,
            target=None,
            purpose=lambda v: "endpoint",
            fresh_runs=ends.bad_again,
        )
        failed = ends.good_failed()
        if failed is not None:  # said even when a budget ran out: it is the answer
            return self._answer().at_endpoints(
                answers_check.own_bar_message(failed, where)
                or f"the good config does not pass on {where}: {failed.verdict.value}"
                + (f" ({failed.signature})" if failed.signature else "")
                + f" [run {failed.id}]; nothing to bisect",
            )
        if stop:  # --max-runs/--deadline ran out before both endpoints had a verdict
            passed = flaky.bad_starts(self.runs.rows(), full)
            so_far = (
                f"; so far the bad config passed on all {len(passed)} start(s)"
                if passed and full not in ends.ends
                else ""
            )
            return Outcome(
                self.cid,
                Status.INCOMPLETE,
                message=f"stopped before an answer: {stop}{so_far}",
                target=self.target,
                runs_executed=self.executed,
                runs_reused=self.reused,
                findings=self._answer().findings(),
            )
        good, bad = ends.ends[()], ends.ends[full]
        self.runs.good_metric = good.probe_metric
        if measured.bar_of(self.plan.bad) is not None and measured.is_sample(bad):
            # one start of bad against one of good says nothing under the benchmark's
            # noise: the measured search decides whether bad misses the bar
            if self.target is None:
                self.target = measured.target_of(self.plan.bad)
                self.store.update_campaign(self.cid, target=self.target)
            return None
        if bad.verdict is not Verdict.FAIL or bad.signature is None:
            starts = len(flaky.bad_starts(self.runs.rows(), full))
            unjudged = (
                "; its answers were not judged: the good config got no answer to any prompt "
                "(check answers.endpoint, or leave the answers check out)"
                if ends.unjudgeable()
                else "; its answers were the same on its last two starts, each within the "
                "rule: a start more would answer the same"
                if ends.settled()
                else ""
            )
            return self._answer().at_endpoints(
                f"the bad config does not fail on {where}: it passed on "
                + (f"all {starts} starts" if starts > 1 else "its start")
                + f" [last run {bad.id}]{unjudged}; nothing to bisect"
                if bad.verdict is Verdict.PASS
                else f"the bad config could not be judged: {bad.verdict.value}: {bad.detail} "
                f"[run {bad.id}]",
            )
        if self.target is None:
            self.target = bad.signature
            self.store.update_campaign(self.cid, target=self.target)
        return None

    def _searched(self, pool: Pool, search: Search, stop: str | None) -> Outcome:
        """3-5. The outcome of the search: its answer (repeated with --repeat), or the best
        one so far when a budget stopped it, with what the runs say about noise."""
        planner, watch = search.planner, search.watch
        if stop:
            best = planner.current_round.best if planner.current_round else None
            outcome = self._answer().incomplete(stop)
            if best is not None and best.culprits:  # the partial answer, with its confidence
                outcome.culprits = self._answer().conclude(best, []).culprits
                outcome.status = Status.UNSURE
                outcome.message = f"stopped before the answer was sure: {stop}"
        else:
            best = planner.answer
            disagree = (
                repeat(self.runs, self._drive, pool, best, self.opts.repeat)
                if self.opts.repeat > 1
                else []
            )
            # 4. each finding narrowed to its own flag where one flag alone shows it
            narrow_findings(self.runs, lambda: self._answer().findings(), self._drive, pool)
            outcome = self._answer().conclude(best, disagree)
        rows = self.runs.rows()
        if self.opts.strategy == "auto":
            watch.settled(
                best,
                [
                    (frozenset(r.variant), self.runs.relative(r.verdict, r.signature, self.target))
                    for r in rows
                    if r.verdict is not Verdict.INFRA
                ],
                lambda v: self.plan.describe(frozenset(v)),
            )
        outcome.noise = watch.summary(best, rows, self.target, self.runs.relative)
        if outcome.status is Status.UNSURE:
            # what `bisect --resume ID` would run next: the search replayed on every run
            outcome.noise["asked_confidence"] = self.opts.confidence
            outcome.noise["next_runs"] = search.next_runs()
            outcome.noise["resume"] = f"orchestrator bisect --resume {self.cid}"
        flaky.add_counts(
            outcome.culprits, best, flaky.counts(rows, self.target, self.runs.relative)
        )
        return outcome

    def _measured(self) -> bool:
        """Whether this bisection measures a probe metric against good's (its bar is
        relative to good) rather than bisecting a failure."""
        target = self.target
        return (
            measured.bar_of(self.plan.bad) is not None
            and target is not None
            and target.error_class == "probe_threshold"
        )

    def _measure(self, pool: Pool) -> Outcome:
        """2-5 for a probe metric: the measured-effect search, each start it asks for a
        run of this campaign, its answer an effect table (campaign/measured.py)."""
        side = measured.MeasuredRuns(
            self.runs,
            self._figures,
            measured.settings_for(self.plan.bad, self.opts.confidence),
        )
        side.replay(self.runs.rows())
        stop = self._drive(
            pool,
            side.wanted,
            side.got,
            target=self.target,
            purpose=lambda v: measured.PURPOSE,
            fresh_runs=True,
            reuse=False,
        )
        if side.flat and not stop:  # no noise at all: each figure against good's is exact
            search, stop = self._search(pool)
            return self._searched(pool, search, stop)
        status, message, culprits, table = measured.outcome_of(side, self.runs, self.cid, stop)
        return Outcome(
            self.cid,
            status,
            message=message,
            target=self.target,
            culprits=culprits,
            findings=self._answer().findings(),
            runs_executed=self.executed,
            runs_reused=self.reused,
            effects=table,
        )

    def _figures(self, row: RunRow) -> list[float] | None:
        """Every probe figure of a start, warm-up first, as its executor recorded them."""
        rec = self.store.host_record(row.cached_from or row.id) or {}
        probe = rec.get("probe")
        values = probe.get("values") if isinstance(probe, dict) else None
        if isinstance(values, list) and values:
            return [float(v) for v in values]
        # a Slurm job runs its probe once: that one figure is the start's sample
        return [row.probe_metric] if row.probe_metric is not None else None

    # ---- obtaining verdicts
    def _drive(
        self,
        pool: Pool,
        wanted: Callable[[], list[tuple[int, ...]]],
        on_result: Callable[[tuple[int, ...], RunRow], None],
        *,
        target: Signature | None,
        purpose: Callable[[tuple[int, ...]], str],
        fresh_runs: bool | Callable[[tuple[int, ...]], bool] = False,
        speculate: Callable[[int], list[tuple[int, ...]]] | None = None,
        reuse: bool = True,
    ) -> str | None:
        """Obtain verdicts for the variants `wanted()` names until it names none: from this
        campaign's records, the cache, or runs on idle hosts. With `speculate`, hosts left
        idle run the variants the search will want next whatever the runs in progress
        show. A variant that wants a new start (`fresh_runs`) takes the starts earlier
        campaigns recorded of the same launch that this one has not taken yet, if any
        (`reuse`). Returns why it stopped early (a budget), or None."""
        source = VariantRuns(
            self.runs,
            self.recorded,
            pool,
            on_result,
            emit=self.emit,
            precheck=self._precheck,
            builds=self._builds,
            target=target,
            purpose=purpose,
            fresh_runs=fresh_runs,
            reuse=reuse,
        )
        return Dispatch(pool, source).run(wanted, speculate)

    # ---- budgets and endings
    def _answer(self) -> CampaignAnswer:
        """The answer as the runs recorded so far give it (campaign/answer.py)."""
        return CampaignAnswer(
            self.cid,
            self.plan,
            self.runs.rows(),
            self.target,
            self.runs.relative,
            confidence=self.opts.confidence,
            executed=self.executed,
            reused=self.reused,
            moves_of=self.runs.moves_of,
        )


__all__ = ["BisectOptions", "Bisection", "CampaignIncomplete", "Interrupted", "Outcome", "relative"]
