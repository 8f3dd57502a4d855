"""Campaigns: a bisection from endpoint checks to an answer backed by runs.

The runner checks both endpoints first (good must pass, bad must fail), fixes the target
signature from the bad run, drives the planner with verdicts (executed, resumed from this
campaign's earlier runs, or reused from the cache), and ends with an answer: the culprit
sets with the runs that prove them, every `other` signature met on the way as a separate
finding with the smallest variant that showed it, and the invalid variants. Everything is
recorded before the next run starts, so a campaign can be resumed after any interruption.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shlex
from bisect import insort
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from orchestrator.campaign import envwatch, flaky, rehearsal, timing
from orchestrator.campaign.answer import CampaignAnswer, resource_answer
from orchestrator.campaign.core import (
    CampaignCore,
    ExecutorFactory,
    default_executor,
)
from orchestrator.campaign.dispatch import Dispatch
from orchestrator.campaign.planning import Plan
from orchestrator.campaign.pool import Pool, Task
from orchestrator.campaign.records import (
    BisectOptions,
    BisectSpec,
    Outcome,
    RepairNote,
    Status,
)
from orchestrator.campaign.reuse import RecordedRuns
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.config.repair import RepairPolicy
from orchestrator.config.repair import policy as repair_policy
from orchestrator.diagnosis.verdicts import Signature, Verdict, relative
from orchestrator.errors import CampaignIncomplete, Interrupted
from orchestrator.events import CampaignStarted, Listener, Notice, null_listener
from orchestrator.execution.executor import service_name
from orchestrator.execution.inputs import env_digest
from orchestrator.planner import Answer, Planner, StrategyFn
from orchestrator.planner.noise_estimate import flaky_runs, observed_rate, remaining_runs
from orchestrator.planner.repair import (
    Applied,
    Next,
    Rung,
    Settled,
    is_resource,
    needs_of,
    with_moves,
)
from orchestrator.planner.repair import decide as repair_decide
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
        self.plan = plan
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
            spec=lambda: self.spec().to_dict(),
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
        self.target: Signature | None = store.campaign(self.cid).target
        self.executed = 0
        self.good_metric: float | None = None
        self._rows_cache: list[RunRow] | None = None
        self._ladder_cache: (
            tuple[tuple[object, ...], list[tuple[list[RunRow], Next | Settled]], list[RunRow]]
            | None
        ) = None
        #: verdicts from recorded runs: this campaign's, or earlier ones' (campaign/reuse.py)
        self.recorded = RecordedRuns(self, fresh=options.fresh)
        self.env_keys = plan.env_keys
        #: verdicts re-read against the target; across builds, in any startup phase
        self._relative = functools.partial(
            relative, across_builds=any(d.kind in ("build", "package") for d in plan.deltas)
        )
        #: both configs' flags go to each host's server before it starts anything: a typo
        #: in the bad config is refused before the good config's long start, not after it
        self._precheck: tuple[Experiment, ...] = (plan.good, plan.bad)
        #: the pair on real weights; `self.plan` is the pair the search runs on now
        self.real_plan = plan
        #: the weights the search runs on now: `_rows()` are the runs on them
        self.weights = plan.bad.weights
        self._weights_note: dict[str, object] = {}
        if options.rehearse and self.weights == "real" and not rehearsal.refused(plan):
            self._precheck += (plan.bad.with_dummy_weights(),)
        #: every build an ordered search may run: each must be installed on each host
        #: before the first run (the others' flags are not put to them: a flag a build
        #: between does not know is that variant's `invalid`, not the campaign's error)
        self._builds = tuple(replace(plan.good, build=b) for b in plan.order)

    @property
    def reused(self) -> int:
        """Runs taken from earlier campaigns' records (this invocation)."""
        return self.recorded.reused

    def _all_rows(self) -> list[RunRow]:
        """This campaign's runs, read once per change: only this process adds to them (the
        host lock refuses a second controller), and it adds each run it records to the copy."""
        if self._rows_cache is None:
            self._rows_cache = self.store.runs(self.cid)
        return self._rows_cache

    def _record(
        self,
        result: object,
        *,
        variant: tuple[int, ...],
        purpose: str,
        run_id: str | None = None,
        cached_from: str | None = None,
        repair: dict[str, Any] | None = None,
    ) -> RunRow:
        """Record a run (`CampaignCore.record`) and add it to the copy of the campaign's runs
        in its place (by seq: runs on a pool finish in any order), rather than reading them
        all again after every run. A record that raises drops the copy."""
        rows, self._rows_cache = self._rows_cache, None
        row = self.core.record(
            result,
            variant=variant,
            purpose=purpose,
            run_id=run_id,
            cached_from=cached_from,
            repair=repair,
        )
        if rows is not None:
            # a new list, not the old one changed in place: `_ladders` memoizes on the
            # list's identity (copying pointers is cheap; decoding every row was not)
            rows = list(rows)
            insort(rows, row, key=lambda r: r.seq)
            self._rows_cache = rows
        return row

    def _launch_rows(self) -> list[RunRow]:
        """This campaign's runs on the weights the search runs on now (a dummy-weight start
        is another launch than a real one: never evidence for it)."""
        return [r for r in self._all_rows() if r.weights == self.weights]

    def _rows(self) -> list[RunRow]:
        """The runs that speak for their variants (`_launch_rows`): of a variant started
        again after a resource failure, only the start whose verdict is the variant's (a
        start a repair superseded, a repaired start the server refused and a ladder still
        under way are no evidence)."""
        return self._ladders()[1]

    def _ladders(self) -> tuple[list[tuple[list[RunRow], Next | Settled]], list[RunRow]]:
        """Each variant start's ladder (the start, then each repaired start that followed
        it) with what it does next, and the runs that speak (see `_rows`); computed again
        whenever the runs, the weights or the target change."""
        rows = self._launch_rows()
        key = (self._rows_cache, self.weights, self.target)
        got = self._ladder_cache
        if got is not None and got[0][0] is key[0] and got[0][1:] == key[1:]:
            return got[1], got[2]
        refused = frozenset(
            (bool(r.repair.get("env")), str(r.repair.get("knob")))
            for r in rows
            if r.repair and r.verdict is Verdict.INVALID
        )
        chains: list[list[RunRow]] = []
        by_last: dict[str, list[RunRow]] = {}
        for r in rows:
            if r.verdict is Verdict.INFRA:
                continue  # host trouble: the same start is wanted again
            after = str(r.repair.get("after")) if r.repair else None
            chain = by_last.pop(after, None) if after else None
            if chain is None:
                chain = []
                chains.append(chain)
            chain.append(r)
            by_last[r.id] = chain
        ladders: list[tuple[list[RunRow], Next | Settled]] = []
        hidden: set[str] = set()
        for chain in chains:
            if len(chain) == 1 and not is_resource(chain[0].signature, self.target):
                ladders.append((chain, Settled(0, "none")))  # the common case: no ladder
                continue
            rungs = [
                Rung(
                    r.id,
                    Applied.from_dict(r.repair) if r.repair else None,
                    r.verdict,
                    r.signature,
                    r.detail,
                    r.printed_args() if is_resource(r.signature, None) else None,
                )
                for r in chain
            ]
            state = repair_decide(
                rungs,
                self._policy(chain[0].host),
                variant=self.plan.variant(frozenset(chain[0].variant)),
                deltas=self.plan.deltas,
                refused=refused,
                target=self.target,
            )
            ladders.append((chain, state))
            keep = state.final if isinstance(state, Settled) else -1
            hidden |= {r.id for i, r in enumerate(chain) if i != keep}
        out = [r for r in rows if r.id not in hidden]
        self._ladder_cache = (key, ladders, out)
        return ladders, out

    def _policy(self, host: str) -> RepairPolicy:
        """The repair moves in force for runs on `host`: built in, then the host's habits,
        then the experiment files' (`--no-repair`: none)."""
        h = next((x for x in self.hosts if x.name == host), self.hosts[0])
        return repair_policy(
            [h.repair, self.real_plan.good.repair, self.real_plan.bad.repair],
            enabled=self.opts.repair,
        )

    def _pending_repair(self, v: tuple[int, ...]) -> tuple[list[RunRow], Next] | None:
        """The oldest ladder of the variant that wants a repaired start (the starts reused
        from earlier campaigns each continue their own), if any."""
        for chain, state in self._ladders()[0]:
            if chain[0].variant == v and isinstance(state, Next):
                return chain, state
        return None

    def _first_purpose(self, row: RunRow) -> str:
        """Why the variant was started: the purpose of the first start of the run's ladder
        (a repaired start's own purpose is `repair` or `cache`)."""
        if not row.repair:
            return row.purpose
        for chain, _ in self._ladders()[0]:
            if any(r.id == row.id for r in chain):
                return chain[0].purpose
        return row.purpose

    def _moves_of(self, row: RunRow) -> list[str]:
        """The repair moves a run carried, described, in the order they were made."""
        if not row.repair:
            return []
        for chain, _ in self._ladders()[0]:
            if any(r.id == row.id for r in chain):
                upto = next(i for i, r in enumerate(chain) if r.id == row.id)
                return [
                    Applied.from_dict(r.repair).describe() for r in chain[1 : upto + 1] if r.repair
                ]
        return [Applied.from_dict(row.repair).describe()]

    def _as_written(self, row: RunRow) -> RunRow | None:
        """The first start of the ladder that `row` ended in a pass, when that start failed
        on a resource and a move got past it: bad's failure as written (its target: the
        change under test may be what needs the resource)."""
        if row.verdict is not Verdict.PASS or not row.repair:
            return None
        for chain, state in self._ladders()[0]:
            if any(r.id == row.id for r in chain) and isinstance(state, Settled):
                first = chain[0]
                return first if is_resource(first.signature, None) else None
        return None

    def _repaired_label(self, v: tuple[int, ...], applied: Applied) -> str:
        return f"{self._label(v)} [repair: {applied.describe()}]"

    def _deliver(
        self,
        v: tuple[int, ...],
        row: RunRow,
        target: Signature | None,
        on_result: Callable[[tuple[int, ...], RunRow], None],
    ) -> None:
        """Hand the variant's verdict on once its ladder is settled: the start that gives it
        (a repaired start refused by the server leaves the one before it)."""
        if self._pending_repair(v) is not None:
            return  # started again with a move first
        for chain, state in self._ladders()[0]:
            if isinstance(state, Settled) and any(r.id == row.id for r in chain):
                final = chain[state.final]
                if final.id != row.id:
                    row = replace(final, verdict=relative(final.verdict, final.signature, target))
                break
        on_result(v, row)

    def _repairs(self) -> list[RepairNote]:
        """Every variant started again after a resource failure, or that could not be."""
        out: dict[tuple[object, ...], RepairNote] = {}
        for chain, state in self._ladders()[0]:
            if not isinstance(state, Settled) or state.state == "none":
                continue
            first, final = chain[0], chain[state.last]
            carried = [Applied.from_dict(r.repair) for r in chain[1 : state.last + 1] if r.repair]
            moves = [a.describe() for a in carried]
            got = relative(final.verdict, final.signature, self.target)
            if got is Verdict.FAIL:
                after = f"failed with the target ({final.signature})"
            elif got is Verdict.PASS:
                after = "passed"
            else:
                after = f"ended {got.value}" + (f" ({final.signature})" if final.signature else "")
            key = (first.variant, state.state, tuple(moves), after, state.why)
            if key in out:  # another start of the variant went the same way
                out[key].count += 1
                continue
            out[key] = RepairNote(
                variant=self.plan.describe(frozenset(first.variant)),
                deltas=list(first.variant),
                state=state.state,
                moves=moves,
                before_run=first.id,
                before=f"failed on a resource ({first.signature})",
                after_run=final.id,
                after=after,
                why=state.why,
                command=shlex.join(final.argv) if final.repair else None,
                needs=needs_of(carried) if state.state == "repaired" else [],
            )
        return list(out.values())

    def _use(self, weights: str) -> None:
        """Run on `weights` from now on: the pair's launches and the runs read switch."""
        self.weights = weights
        self.plan = rehearsal.on_dummy(self.real_plan) if weights == "dummy" else self.real_plan

    def _label(self, v: tuple[int, ...]) -> str:
        label = self.plan.describe(frozenset(v))
        return label + " [dummy weights]" if self.weights == "dummy" else label

    def spec(self) -> BisectSpec:
        return BisectSpec(
            good=self.plan.good.to_dict(),
            bad=self.plan.bad.to_dict(),
            good_source=self.plan.good.source,
            bad_source=self.plan.bad.source,
            deltas=[d.to_dict() for d in self.plan.deltas],
            hosts=[h.name for h in self.hosts],
            options=self.opts,
        )

    # ---- the campaign
    def run(self) -> Outcome:
        previous = self._rows()
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
            outcome = self._rehearsed(pool) if self.opts.rehearse else self._search(pool)
        outcome.removed_hosts = list(pool.removed)
        outcome.weights = self._weights_summary()
        outcome.deltas = [d.describe() for d in self.plan.deltas]
        outcome.repairs = self._repairs()
        resource_answer(outcome, self.plan.n)
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
            repairs=self._repairs(),
        )

    def _search(self, pool: Pool) -> Outcome:
        stopped = self._endpoints(pool)
        if stopped is not None:
            return stopped
        # 2. the search: each round's variants go to idle hosts; a decided round cancels
        #    the runs it no longer needs
        #    Every recorded run is evidence (a resumed campaign's posterior is what it was);
        #    `auto` turns noise-aware by itself once the runs show flakiness.
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
        search = _Search(self, strategy)
        self._strategy = strategy  # what the switch's estimate simulates
        search.watch = flaky.NoiseWatch(self.emit, self.cid, estimate=self._flaky_estimate)
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
        return self._searched(pool, search, stop)

    def _endpoints(self, pool: Pool) -> Outcome | None:
        """1. The endpoints, side by side when there are two hosts: good must pass, bad
        must fail (its failure is the target). The outcome when they end the campaign."""
        where = ", ".join(h.name for h in self.hosts)
        ends = _Endpoints(self)
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
                f"the good config does not pass on {where}: {failed.verdict.value}"
                + (f" ({failed.signature})" if failed.signature else "")
                + f" [run {failed.id}]; nothing to bisect",
            )
        if stop:  # --max-runs/--deadline ran out before both endpoints had a verdict
            passed = flaky.bad_starts(self._rows(), full)
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
        self.good_metric = good.probe_metric
        if bad.verdict is not Verdict.FAIL or bad.signature is None:
            starts = len(flaky.bad_starts(self._rows(), full))
            return self._answer().at_endpoints(
                f"the bad config does not fail on {where}: it passed on all {starts} starts "
                f"[last run {bad.id}]; nothing to bisect"
                if bad.verdict is Verdict.PASS
                else f"the bad config could not be judged: {bad.verdict.value}: {bad.detail} "
                f"[run {bad.id}]",
            )
        if self.target is None:
            self.target = bad.signature
            self.store.update_campaign(self.cid, target=self.target)
        return None

    def _searched(self, pool: Pool, search: _Search, stop: str | None) -> Outcome:
        """The outcome of the search: its answer (repeated with --repeat), or the best one
        so far when a budget stopped it, with what the runs say about noise."""
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
            disagree = self._repeat(pool, best) if self.opts.repeat > 1 else []
            outcome = self._answer().conclude(best, disagree)
        rows = self._rows()
        if self.opts.strategy == "auto":
            watch.settled(
                best,
                [
                    (frozenset(r.variant), self._relative(r.verdict, r.signature, self.target))
                    for r in rows
                    if r.verdict is not Verdict.INFRA
                ],
                lambda v: self.plan.describe(frozenset(v)),
            )
        outcome.noise = watch.summary(best, rows, self.target, self._relative)
        if outcome.status is Status.UNSURE:
            # what `bisect --resume ID` would run next: the search replayed on every run
            outcome.noise["asked_confidence"] = self.opts.confidence
            outcome.noise["next_runs"] = self._next_runs(search.strategy)
            outcome.noise["resume"] = f"orchestrator bisect --resume {self.cid}"
        flaky.add_counts(outcome.culprits, best, flaky.counts(rows, self.target, self._relative))
        return outcome

    def _flaky_estimate(self) -> tuple[float, int]:
        """(runs the campaign is expected to take in all now that the failure shows on only
        some starts, runs so far): the runs so far and what the search still takes from
        them, measured on simulated runs of the culprit sets and rates they leave likely
        (`planner.noise_estimate.remaining_runs`; a fit of the bench's means when they
        point at none). The fit alone priced the search from its start, and said "about
        1 more run" where 16 came."""
        got = [
            (r.variant, self._relative(r.verdict, r.signature, self.target))
            for r in self._all_rows()
            if r.verdict is not Verdict.INFRA
        ]
        strategy = getattr(self, "_strategy", None)
        if strategy is not None:
            mine = [
                (frozenset(r.variant), relative(r.verdict, r.signature, self.target))
                for r in self._rows()
                if r.verdict is not Verdict.INFRA
            ]
            left = remaining_runs(self.plan.n, mine, strategy, closure=self.plan.closure())
            if left is not None:
                return len(got) + left[0], len(got)
        failing = {v for v, x in got if x is Verdict.FAIL}
        starts = [x for v, x in got if v in failing and x.resolved]
        rate = observed_rate(sum(x is Verdict.FAIL for x in starts), len(starts))
        size = 1 if any(len(v) == 1 for v in failing) or self.plan.n == 1 else 2
        est = self.plan.estimates()
        base = est["auto_single_mean" if size == 1 else "auto_pair_mean"]  # the fit's base
        mean, _ = flaky_runs(2 + base, rate, size)
        return max(mean, len(got) + 1.0), len(got)

    # ---- rehearsal on dummy weights
    def _rehearsed(self, pool: Pool) -> Outcome:
        """The bad config on real weights (the target), then on dummy weights: when that
        shows the target too, the search runs on dummy weights and its answer is called
        found only once good + each culprit set fails with the target on real weights;
        otherwise (a failure of the checkpoint's values) the search runs on real weights."""
        why = rehearsal.refused(self.real_plan)
        if why:
            self._say(f"no rehearsal on dummy weights: {why}", rehearsal="refused")
            return self._search(pool)
        full = tuple(range(self.plan.n))
        bad, stop = self._bad_until_target(pool, target=None)
        if bad is None or bad.verdict is not Verdict.FAIL or bad.signature is None:
            return self._search(pool)  # stopped, or the bad config does not fail: as ever
        if self.target is None:
            self.target = bad.signature
            self.store.update_campaign(self.cid, target=self.target)
        real = flaky.counts(flaky.bad_starts(self._rows(), full), self.target, self._relative)
        seen = real.get(full)
        self._use("dummy")
        # as many dummy starts as a failure of the bad config's rate needs to show once
        attempts = rehearsal.check_attempts(seen.fails if seen else 1, seen.runs if seen else 1)
        check, stop = self._bad_until_target(pool, target=self.target, attempts=attempts)
        if stop:
            self._use("real")
            return self._search(pool)
        starts = flaky.bad_starts(self._rows(), full)
        if (
            check is None
            or self._relative(check.verdict, check.signature, self.target) is not Verdict.FAIL
        ):
            shown = "; ".join(sorted({rehearsal.shown(r) for r in starts})) or "no verdict"
            self._say(
                f"the target failure does not show with dummy weights ({shown} on "
                f"{len(starts)} start(s)); it needs the real weights: the search runs "
                f"on real weights",
                rehearsal="not reproduced",
                check_run=starts[-1].id if starts else None,
            )
            self._use("real")
            return self._search(pool)
        self._say(
            f"the target failure shows with dummy weights too [run {check.id}]: the "
            "search runs on dummy weights; the answer is confirmed on real weights",
            rehearsal="reproduced",
            check_run=check.id,
        )
        outcome = self._search(pool)
        if not outcome.found:
            return outcome
        self._use("real")
        confirmed, missed = self._confirm(pool, outcome)
        outcome.runs_executed, outcome.runs_reused = self.executed, self.reused
        if missed is None:
            self._weights_note["confirmed_by"] = confirmed
            self._say(
                "the answer holds on real weights: "
                + ", ".join(
                    f"good + {flags} fails with the target [run {rid}]"
                    for flags, rid in confirmed.items()
                ),
                rehearsal="confirmed",
            )
            return outcome
        self._say(
            f"the answer found on dummy weights does not hold on real weights: "
            f"{missed}; the search runs on real weights",
            rehearsal="not confirmed",
        )
        return self._search(pool)

    def _say(self, message: str, **note: object) -> None:
        self._weights_note.update(note)
        self._weights_note["note"] = message
        self.emit(Notice(host=self.hosts[0].name, message=message))

    def _bad_until_target(
        self,
        pool: Pool,
        *,
        target: Signature | None,
        attempts: int = flaky.BAD_ATTEMPTS,
    ) -> tuple[RunRow | None, str | None]:
        """Start the bad config until it fails (with `target`, when given), at most
        `attempts` starts; the failing start, else the last, and why it stopped early."""
        full = tuple(range(self.plan.n))

        def starts() -> list[RunRow]:
            return flaky.bad_starts(self._rows(), full)

        def hit(r: RunRow) -> bool:
            return self._relative(r.verdict, r.signature, target) is Verdict.FAIL

        def want() -> list[tuple[int, ...]]:
            got = starts()
            return [] if any(map(hit, got)) or len(got) >= attempts else [full]

        stop = self._drive(
            pool,
            want,
            lambda v, row: None,
            target=target,
            purpose=lambda v: "endpoint" if target is None else "rehearsal",
            fresh_runs=lambda v: bool(starts()),
        )
        got = starts()
        return next((r for r in got if hit(r)), got[-1] if got else None), stop

    def _confirm(self, pool: Pool, outcome: Outcome) -> tuple[dict[str, str], str | None]:
        """Good + each culprit set on real weights, started until it fails with the target
        (as many starts as its rate on dummy weights needs to show once at the confidence
        asked). Returns the confirming run per set and, if one did not, what it showed."""
        dummy = [r for r in self._all_rows() if r.weights == "dummy"]
        confirmed: dict[str, str] = {}
        for c in outcome.culprits:
            v = tuple(sorted(c.indices))
            # its rate on dummy weights: every resolved run that carries the set
            got = [
                self._relative(r.verdict, r.signature, self.target)
                for r in dummy
                if set(v) <= set(r.variant)
            ]
            got = [x for x in got if x.resolved]
            attempts = rehearsal.confirm_attempts(
                sum(x is Verdict.FAIL for x in got), len(got), rate_cap=rehearsal.CHECK_RATE
            )

            def starts(v: tuple[int, ...] = v) -> list[RunRow]:
                return [
                    r for r in self._rows() if r.variant == v and r.verdict is not Verdict.INFRA
                ]

            def hit(r: RunRow) -> bool:
                return self._relative(r.verdict, r.signature, self.target) is Verdict.FAIL

            def want(v: tuple[int, ...] = v, most: int = attempts) -> list[tuple[int, ...]]:
                got = starts(v)
                return [] if any(map(hit, got)) or len(got) >= most else [v]

            self._drive(
                pool,
                want,
                lambda v, row: None,
                target=self.target,
                purpose=lambda v: "confirm",
                fresh_runs=lambda v: bool(starts(v)),
            )
            got = starts(v)
            ok = next((r for r in got if hit(r)), None)
            flags = " + ".join(c.flags)
            if ok is None:
                shown = "; ".join(sorted({rehearsal.shown(r) for r in got})) or "no verdict"
                return confirmed, f"good + {flags}: {shown} on {len(got)} start(s)"
            confirmed[flags] = ok.id
        return confirmed, None

    def _weights_summary(self) -> dict[str, object]:
        executed = [r for r in self._all_rows() if r.cached_from is None]
        out: dict[str, object] = {
            "search": self.weights
            if self._weights_note.get("rehearsal") != "confirmed"
            else "dummy",
            "real_starts": sum(1 for r in executed if r.weights == "real"),
            "dummy_starts": sum(1 for r in executed if r.weights == "dummy"),
        }
        return out | self._weights_note

    def _next_runs(self, strategy: StrategyFn) -> list[str]:
        """The variants a resumed search would run first (pure: the planner on the records)."""
        evidence = [
            (frozenset(r.variant), self._relative(r.verdict, r.signature, self.target))
            for r in self._rows()
            if r.verdict is not Verdict.INFRA
        ]
        full = frozenset(range(self.plan.n))
        planner = Planner(
            self.plan.n,
            strategy,
            known={frozenset(): Verdict.PASS, full: Verdict.FAIL},
            closure=self.plan.closure(),
            evidence=evidence,
        )
        return [self.plan.describe(v) for v in dict.fromkeys(planner.pending())]

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
        source = _VariantRuns(
            self,
            pool,
            on_result,
            target=target,
            purpose=purpose,
            fresh_runs=fresh_runs,
            reuse=reuse,
        )
        return Dispatch(pool, source).run(wanted, speculate)

    def _relabel(self, row: RunRow, target: Signature | None, source: str) -> RunRow:
        verdict = self._relative(row.verdict, row.signature, target)
        if source != "run" or verdict is not row.verdict:
            row = replace(row, verdict=verdict)
        done = sum(1 for r in self._all_rows() if r.verdict is not Verdict.INFRA)
        self.core.recorded(row, source=source, done=done)
        return row

    # ---- budgets and endings
    def _answer(self) -> CampaignAnswer:
        """The answer as the runs recorded so far give it (campaign/answer.py)."""
        return CampaignAnswer(
            self.cid,
            self.plan,
            self._rows(),
            self.target,
            self._relative,
            confidence=self.opts.confidence,
            executed=self.executed,
            reused=self.reused,
            moves_of=self._moves_of,
        )

    def _budget_exhausted(self, in_flight: int = 0) -> str | None:
        """--max-runs counts this campaign's executed runs across resumes."""
        total = sum(1 for r in self._all_rows() if r.cached_from is None)
        return self.core.budget_spent(total + in_flight) or None

    def _repeat(self, pool: Pool, answer: Answer) -> list[str]:
        """Run the variants that decide the answer again; report any that disagree."""
        expected: dict[tuple[int, ...], Verdict] = {
            (): Verdict.PASS,
            tuple(range(self.plan.n)): Verdict.FAIL,
        }
        for c in answer.culprits:
            expected[tuple(sorted(c.reproduced_by))] = Verdict.FAIL
            for _, v in c.cleared_by:
                expected[tuple(sorted(v))] = Verdict.PASS

        def repeats(v: tuple[int, ...]) -> list[RunRow]:
            # (a repeat that was repaired speaks through its repaired start)
            return [
                r
                for r in self._rows()
                if r.variant == v
                and self._first_purpose(r) == "repeat"
                and r.verdict is not Verdict.INFRA
            ]

        self._drive(
            pool,
            lambda: [v for v in expected if len(repeats(v)) < self.opts.repeat - 1],
            lambda v, row: None,
            target=self.target,
            purpose=lambda v: "repeat",
            fresh_runs=True,
            reuse=False,
        )
        flaky: list[str] = []
        for v, want in expected.items():
            for r in repeats(v):
                got = self._relative(r.verdict, r.signature, self.target)
                if (got is Verdict.FAIL) != (want is Verdict.FAIL):
                    flaky.append(
                        f"{r.label}: {got.value} on repeat (run {r.id}), expected {want.value}"
                    )
        return flaky


class _Endpoints:
    """The endpoint runs of a bisection (`Bisection._endpoints`): what the dispatch loop
    is asked to run, and what it hands back."""

    def __init__(self, b: Bisection) -> None:
        self.b = b
        self.full = tuple(range(b.plan.n))
        self.ends: dict[tuple[int, ...], RunRow] = {}
        # An `infra` verdict says nothing about the config: the endpoint is wanted again
        # (3 in a row stop the campaign with the resume command, see _note_infra).
        # A probe bar relative to the good config (">= 0.95 * good") judges bad against the
        # good run's metric: good runs first then, and bad's task carries its metric.
        self.relative_bar = any(
            e.probe is not None
            and e.probe.condition is not None
            and e.probe.condition.relative_to_good
            for e in (b.plan.good, b.plan.bad)
        )

    def good_failed(self) -> RunRow | None:
        """The good config's endpoint run when it did not pass: it contradicts its role
        whatever bad does, so bad is not started (again) and a run of it in progress
        is cancelled; a failure of the good config is proof, never noise."""
        row = self.ends.get(())
        return row if row is not None and row.verdict is not Verdict.PASS else None

    def wanted(self) -> list[tuple[int, ...]]:
        if self.good_failed() is not None:
            return []
        want = [v for v in ((), self.full) if v not in self.ends]
        return want[:1] if self.relative_bar and () in want else want

    def got(self, v: tuple[int, ...], row: RunRow) -> None:
        b, full = self.b, self.full
        written = b._as_written(row) if v == full else None
        if written is not None:  # it passed only under a repair: its failure as written
            self.ends[v] = written
        elif row.verdict is not Verdict.INFRA:
            if v == full:  # a flaky failure may need several starts of bad to show
                starts = flaky.bad_starts(b._rows(), full)
                row = next((r for r in starts if r.verdict is Verdict.FAIL), row)
                if flaky.retry_bad(starts):
                    b.emit(
                        Notice(
                            host=row.host,
                            message=(
                                f"the bad config passed on start {len(starts)} [run {row.id}]; "
                                f"starting it again (at most {flaky.BAD_ATTEMPTS} starts)"
                            ),
                        )
                    )
                    return
            self.ends[v] = row
            if v == ():
                b.good_metric = row.probe_metric

    def bad_again(self, v: tuple[int, ...]) -> bool:  # only passes so far: a new start
        return v == self.full and flaky.retry_bad(flaky.bad_starts(self.b._rows(), self.full))


class _Search:
    """The planner a bisection's search drives (`Bisection._search`): what the dispatch
    loop is asked to run, and the verdicts it hands back."""

    watch: flaky.NoiseWatch

    def __init__(self, b: Bisection, strategy: StrategyFn) -> None:
        self.b = b
        self.strategy = strategy
        self.full = tuple(range(b.plan.n))
        self.planner = self.new_planner()

    def new_planner(self) -> Planner:
        b = self.b
        evidence = [
            (frozenset(r.variant), b._relative(r.verdict, r.signature, b.target))
            for r in b._rows()
            if r.verdict is not Verdict.INFRA
        ]
        return Planner(
            b.plan.n,
            self.strategy,
            known={frozenset(): Verdict.PASS, frozenset(self.full): Verdict.FAIL},
            closure=b.plan.closure(),
            evidence=evidence,
        )

    def wanted(self) -> list[tuple[int, ...]]:
        planner = self.planner
        return [] if planner.done else [tuple(sorted(v)) for v in planner.pending()]

    def purpose(self, _: tuple[int, ...]) -> str:
        rnd = self.planner.current_round
        return rnd.purpose if rnd else "search"

    def ahead(self, limit: int) -> list[tuple[int, ...]]:
        return [tuple(sorted(v)) for v in self.planner.lookahead(limit)]

    def record(self, v: tuple[int, ...], row: RunRow) -> None:
        starts = sum(1 for r in self.b._rows() if r.variant == v and r.verdict is not Verdict.INFRA)
        if row.cached_from is not None and starts > 1:
            # Reused starts of a variant: all of them count (a flaky config that failed
            # 1 of 4 times is not one that failed once). The search is a function of the
            # recorded runs, so it starts again from all of them, as a resume does.
            self.planner = self.new_planner()
        else:
            self.planner.record(frozenset(v), row.verdict)
        self.watch.check(self.planner)

    def again(self, _: tuple[int, ...]) -> bool:  # a noise-aware round wants a new start
        rnd = self.planner.current_round
        return rnd is not None and rnd.again


class _VariantRuns:
    """A bisection's side of one drive of the dispatch loop (campaign/dispatch.py): the
    variants' recorded verdicts and reused starts, their repair ladders, the tasks that
    run them, and the records of the runs that end."""

    def __init__(
        self,
        b: Bisection,
        pool: Pool,
        on_result: Callable[[tuple[int, ...], RunRow], None],
        *,
        target: Signature | None,
        purpose: Callable[[tuple[int, ...]], str],
        fresh_runs: bool | Callable[[tuple[int, ...]], bool],
        reuse: bool,
    ) -> None:
        self.b = b
        self.pool = pool
        self.on_result = on_result
        self.target = target
        self.purpose = purpose
        self.fresh_runs = fresh_runs
        self.reuse = reuse

    def _repair(self, v: tuple[int, ...]) -> tuple[list[RunRow], Applied, Experiment] | None:
        """The variant's ladder that wants a repaired start, the move it makes next, and
        the launch with every move of the ladder (None: no repair is pending)."""
        pending = self.b._pending_repair(v)
        if pending is None:
            return None
        chain, step = pending
        applied = step.applied(str(chain[-1].signature), chain[-1].id, len(chain))
        exp = with_moves(
            self.b.plan.variant(frozenset(v)),
            [*(Applied.from_dict(r.repair) for r in chain if r.repair), applied],
        )
        return chain, applied, exp

    def obtain(self, v: tuple[int, ...]) -> bool:
        b, target = self.b, self.target
        repair = self._repair(v)
        if repair is not None:  # died of a resource: started again with a move
            _, applied, exp = repair
            hit = (
                b.recorded.from_cache(v, exp, target, self.pool, repair=applied)
                if self.reuse
                else None
            )
            if hit is None:
                return False
            b._deliver(v, hit, target, self.on_result)
            return True
        fresh = self.fresh_runs(v) if callable(self.fresh_runs) else self.fresh_runs
        row = (
            None
            if fresh and not self.reuse
            else b.recorded.known(v, target, self.pool, again=fresh)
        )
        if row is None:
            return False
        b._deliver(v, row, target, self.on_result)
        return True

    def budget(self, in_flight: int) -> str | None:
        return self.b._budget_exhausted(in_flight)

    def start(self, v: tuple[int, ...]) -> Task:
        b = self.b
        repair = self._repair(v)
        if repair is not None:
            chain, applied, exp = repair
            b.emit(
                Notice(
                    host=chain[-1].host,
                    message=(
                        f"{b._label(v)} failed on a resource ({chain[-1].signature}) "
                        f"[run {chain[-1].id}]; starting it again with {applied.describe()} "
                        f"(repair {len(chain)} of at most "
                        f"{b._policy(chain[-1].host).steps})"
                    ),
                )
            )
            return Task(
                key=v,
                exp=exp,
                label=b._repaired_label(v, applied),
                run_id=b.store.reserve_run_id(b.cid),
                target=self.target,
                good_metric=b.good_metric,
                purpose="repair",
                precheck=b._precheck,
                repair=applied.to_dict(),
            )
        exp = b.plan.variant(frozenset(v))
        return Task(
            key=v,
            exp=exp,
            label=b._label(v),
            run_id=b.store.reserve_run_id(b.cid),
            target=self.target,
            good_metric=b.good_metric,
            purpose=self.purpose(v),
            precheck=b._precheck,
            builds=b._builds,
        )

    def blocked(self, v: tuple[int, ...]) -> bool:
        return self.b._pending_repair(v) is not None

    def known(self, v: tuple[int, ...]) -> bool:
        return self.b.recorded.known(v, self.target, self.pool) is not None

    def start_ahead(self, v: tuple[int, ...]) -> Task:
        b = self.b
        return Task(
            key=v,
            exp=b.plan.variant(frozenset(v)),
            label=b._label(v),
            run_id=b.store.reserve_run_id(b.cid),
            target=self.target,
            good_metric=b.good_metric,
            purpose="speculative",
            precheck=b._precheck,
            builds=b._builds,
        )

    def finished(self, task: Task, result: object) -> None:
        b = self.b
        row = b._record(
            result, variant=task.key, purpose=task.purpose, run_id=task.run_id, repair=task.repair
        )
        b.executed += 1
        b.core.note_infra(row.verdict, row.host, row.detail, len(self.pool.healthy()))
        b._deliver(task.key, b._relabel(row, self.target, "run"), self.target, self.on_result)


__all__ = ["BisectOptions", "Bisection", "CampaignIncomplete", "Interrupted", "Outcome", "relative"]
