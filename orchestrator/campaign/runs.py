"""A bisection's runs: what the campaign recorded, read as evidence.

The rows of the campaign (read once, then kept in step with each run it records), each
variant start's repair ladder and the runs that speak for their variants, the labels of
variants, and the record and re-reading of a run against the target. The parts of a
bisection (its endpoints, its search, the reuse of recorded runs, the rehearsal on dummy
weights) receive this object, never the campaign, so each of them is read on its own.
"""

from __future__ import annotations

import functools
import shlex
from bisect import insort
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from orchestrator.campaign import answers_check, rehearsal
from orchestrator.campaign.core import CampaignCore
from orchestrator.campaign.planning import Plan
from orchestrator.campaign.records import BisectOptions, RepairNote
from orchestrator.config.hosts import Host
from orchestrator.config.repair import RepairPolicy
from orchestrator.config.repair import policy as repair_policy
from orchestrator.diagnosis.verdicts import Signature, Verdict, relative
from orchestrator.events import Notice
from orchestrator.execution.contract import RunResult, RunResultLike
from orchestrator.planner.repair import (
    Applied,
    Next,
    Rung,
    Settled,
    is_resource,
    needs_of,
)
from orchestrator.planner.repair import decide as repair_decide
from orchestrator.store.store import RunRow, Store


class BisectionRuns:
    """The runs of one bisection campaign, and the state they are read in: the pair the
    search runs on now (`plan`: real or dummy weights), the target failure, the good
    config's probe metric."""

    def __init__(
        self,
        store: Store,
        core: CampaignCore,
        plan: Plan,
        hosts: list[Host],
        opts: BisectOptions,
        *,
        target: Signature | None,
    ) -> None:
        self.store = store
        self.core = core
        self.cid = core.cid
        self.hosts = hosts
        self.opts = opts
        self.target = target
        #: runs executed by this invocation (not reused, not resumed)
        self.executed = 0
        #: the good config's probe metric, for a probe bar relative to it
        self.good_metric: float | None = None
        #: the good config's run per weights (`real`, `dummy`): its answers are the
        #: reference every other run's answers are judged against (campaign/answers_check)
        self.references: dict[str, RunRow] = {}
        self._rows_cache: list[RunRow] | None = None
        self._ladder_cache: (
            tuple[tuple[object, ...], list[tuple[list[RunRow], Next | Settled]], list[RunRow]]
            | None
        ) = None
        #: verdicts re-read against the target; across builds, in any startup phase
        self.relative = functools.partial(
            relative, across_builds=any(d.kind in ("build", "package") for d in plan.deltas)
        )
        #: the pair on real weights; `plan` is the pair the search runs on now
        self.real_plan = plan
        self.plan = plan
        #: the weights the search runs on now: `rows()` are the runs on them
        self.weights = plan.bad.weights

    def all_rows(self) -> list[RunRow]:
        """This campaign's runs, read once per change: only this process adds to them (the
        host lock refuses a second controller), and it adds each run it records to the copy."""
        if self._rows_cache is None:
            self._rows_cache = self.store.runs(self.cid)
        return self._rows_cache

    def record(self, result: RunResultLike, **how: Any) -> RunRow:
        """Record a run (`CampaignCore.record`; `how`: what `Store.add_run` takes besides
        the result) and add it to the copy of the campaign's runs
        in its place (by seq: runs on a pool finish in any order), rather than reading them
        all again after every run. A record that raises drops the copy."""
        rows, self._rows_cache = self._rows_cache, None
        row = self.core.record(result, **how)
        if rows is not None:
            # a new list, not the old one changed in place: `_ladders` memoizes on the
            # list's identity (copying pointers is cheap; decoding every row was not)
            rows = list(rows)
            insort(rows, row, key=lambda r: r.seq)
            self._rows_cache = rows
        return row

    def judge_answers(self, v: tuple[int, ...], result: RunResult) -> RunResult:
        """A run's answers judged against good's in this campaign, before it is recorded:
        good's own run is the reference (its self-comparison said when it disagrees with
        itself); any other run that answers wrong is `fail` with a `wrong_output`
        signature (see campaign/answers_check)."""
        if result.answers is None or not answers_check.judged(result.experiment):
            return result
        if v == ():
            # an absolute score bar holds good to it too: a good that misses it fails
            alone = answers_check.judged_alone(result, self.target)
            if alone is not None and alone.verdict is not result.verdict:
                return alone
            result, measured = answers_check.with_noise(alone or result)
            result = answers_check.stopped_answering(result, measured, self.target)
            # a good that did not pass is said as such (a crash, a stall): never as noise
            passed = measured is not None and result.verdict is Verdict.PASS
            said = answers_check.noise_message(measured, result.run_id) if passed else None
            for text in (answers_check.unanswered_message(result), said):
                if text:
                    self.core.emit(Notice(host=result.host, message=text))
            return result
        return answers_check.judge_result(result, self.references.get(self.weights), self.target)

    def launch_rows(self) -> list[RunRow]:
        """This campaign's runs on the weights the search runs on now (a dummy-weight start
        is another launch than a real one: never evidence for it)."""
        return [r for r in self.all_rows() if r.weights == self.weights]

    def rows(self) -> list[RunRow]:
        """The runs that speak for their variants (`_launch_rows`): of a variant started
        again after a resource failure, only the start whose verdict is the variant's (a
        start a repair superseded, a repaired start the server refused and a ladder still
        under way are no evidence)."""
        return self.ladders()[1]

    def ladders(self) -> tuple[list[tuple[list[RunRow], Next | Settled]], list[RunRow]]:
        """Each variant start's ladder (the start, then each repaired start that followed
        it) with what it does next, and the runs that speak (see `_rows`); computed again
        whenever the runs, the weights or the target change."""
        rows = self.launch_rows()
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
                self.policy(chain[0].host),
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

    def policy(self, host: str) -> RepairPolicy:
        """The repair moves in force for runs on `host`: built in, then the host's habits,
        then the experiment files' (`--no-repair`: none)."""
        h = next((x for x in self.hosts if x.name == host), self.hosts[0])
        return repair_policy(
            [h.repair, self.real_plan.good.repair, self.real_plan.bad.repair],
            enabled=self.opts.repair,
        )

    def pending_repair(self, v: tuple[int, ...]) -> tuple[list[RunRow], Next] | None:
        """The oldest ladder of the variant that wants a repaired start (the starts reused
        from earlier campaigns each continue their own), if any."""
        for chain, state in self.ladders()[0]:
            if chain[0].variant == v and isinstance(state, Next):
                return chain, state
        return None

    def first_purpose(self, row: RunRow) -> str:
        """Why the variant was started: the purpose of the first start of the run's ladder
        (a repaired start's own purpose is `repair` or `cache`)."""
        if not row.repair:
            return row.purpose
        for chain, _ in self.ladders()[0]:
            if any(r.id == row.id for r in chain):
                return chain[0].purpose
        return row.purpose

    def moves_of(self, row: RunRow) -> list[str]:
        """The repair moves a run carried, described, in the order they were made."""
        if not row.repair:
            return []
        for chain, _ in self.ladders()[0]:
            if any(r.id == row.id for r in chain):
                upto = next(i for i, r in enumerate(chain) if r.id == row.id)
                return [
                    Applied.from_dict(r.repair).describe() for r in chain[1 : upto + 1] if r.repair
                ]
        return [Applied.from_dict(row.repair).describe()]

    def as_written(self, row: RunRow) -> RunRow | None:
        """The first start of the ladder that `row` ended in a pass, when that start failed
        on a resource and a move got past it: bad's failure as written (its target: the
        change under test may be what needs the resource)."""
        if row.verdict is not Verdict.PASS or not row.repair:
            return None
        for chain, state in self.ladders()[0]:
            if any(r.id == row.id for r in chain) and isinstance(state, Settled):
                first = chain[0]
                return first if is_resource(first.signature, None) else None
        return None

    def repaired_label(self, v: tuple[int, ...], applied: Applied) -> str:
        return f"{self.label(v)} [repair: {applied.describe()}]"

    def deliver(
        self,
        v: tuple[int, ...],
        row: RunRow,
        target: Signature | None,
        on_result: Callable[[tuple[int, ...], RunRow], None],
    ) -> None:
        """Hand the variant's verdict on once its ladder is settled: the start that gives it
        (a repaired start refused by the server leaves the one before it)."""
        if self.pending_repair(v) is not None:
            return  # started again with a move first
        for chain, state in self.ladders()[0]:
            if isinstance(state, Settled) and any(r.id == row.id for r in chain):
                final = chain[state.final]
                if final.id != row.id:
                    row = replace(final, verdict=relative(final.verdict, final.signature, target))
                break
        on_result(v, row)

    def repairs(self) -> list[RepairNote]:
        """Every variant started again after a resource failure, or that could not be."""
        out: dict[tuple[object, ...], RepairNote] = {}
        for chain, state in self.ladders()[0]:
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

    def use(self, weights: str) -> None:
        """Run on `weights` from now on: the pair's launches and the runs read switch."""
        self.weights = weights
        self.plan = rehearsal.on_dummy(self.real_plan) if weights == "dummy" else self.real_plan

    def label(self, v: tuple[int, ...]) -> str:
        label = self.plan.describe(frozenset(v))
        return label + " [dummy weights]" if self.weights == "dummy" else label

    def relabel(self, row: RunRow, target: Signature | None, source: str) -> RunRow:
        verdict = self.relative(row.verdict, row.signature, target)
        if source != "run" or verdict is not row.verdict:
            row = replace(row, verdict=verdict)
        done = sum(1 for r in self.all_rows() if r.verdict is not Verdict.INFRA)
        self.core.recorded(row, source=source, done=done)
        return row

    def budget(self, in_flight: int = 0) -> str | None:
        """--max-runs counts this campaign's executed runs across resumes."""
        total = sum(1 for r in self.all_rows() if r.cached_from is None)
        return self.core.budget_spent(total + in_flight) or None


__all__ = ["BisectionRuns"]
