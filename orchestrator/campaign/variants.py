"""A bisection's side of one drive of the dispatch loop (campaign/dispatch.py).

The variants' verdicts from recorded runs (this campaign's, or reused from earlier ones),
their repair ladders, the tasks that run them, and the records of the runs that end.
"""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.campaign import answers_check
from orchestrator.campaign.pool import Pool, Task
from orchestrator.campaign.reuse import RecordedRuns
from orchestrator.campaign.runs import BisectionRuns
from orchestrator.config.experiment import Experiment
from orchestrator.diagnosis.verdicts import Signature
from orchestrator.events import Listener, Notice
from orchestrator.execution.contract import RunResult
from orchestrator.planner.repair import Applied, with_moves
from orchestrator.store.store import RunRow


class VariantRuns:
    """A bisection's side of one drive of the dispatch loop (campaign/dispatch.py): the
    variants' recorded verdicts and reused starts, their repair ladders, the tasks that
    run them, and the records of the runs that end."""

    def __init__(
        self,
        runs: BisectionRuns,
        recorded: RecordedRuns,
        pool: Pool,
        on_result: Callable[[tuple[int, ...], RunRow], None],
        *,
        emit: Listener,
        precheck: tuple[Experiment, ...],
        builds: tuple[Experiment, ...],
        target: Signature | None,
        purpose: Callable[[tuple[int, ...]], str],
        fresh_runs: bool | Callable[[tuple[int, ...]], bool],
        reuse: bool,
    ) -> None:
        self.runs = runs
        self.recorded = recorded
        self.pool = pool
        self.emit = emit
        #: the configs each host's server is asked about before it starts anything
        self.precheck = precheck
        #: every build an ordered search may run (installed on each host first)
        self.builds = builds
        self.on_result = on_result
        self.target = target
        self.purpose = purpose
        self.fresh_runs = fresh_runs
        self.reuse = reuse

    def _repair(self, v: tuple[int, ...]) -> tuple[list[RunRow], Applied, Experiment] | None:
        """The variant's ladder that wants a repaired start, the move it makes next, and
        the launch with every move of the ladder (None: no repair is pending)."""
        pending = self.runs.pending_repair(v)
        if pending is None:
            return None
        chain, step = pending
        applied = step.applied(str(chain[-1].signature), chain[-1].id, len(chain))
        exp = with_moves(
            self.runs.plan.variant(frozenset(v)),
            [*(Applied.from_dict(r.repair) for r in chain if r.repair), applied],
        )
        return chain, applied, exp

    def obtain(self, v: tuple[int, ...]) -> bool:
        runs, target = self.runs, self.target
        repair = self._repair(v)
        if repair is not None:  # died of a resource: started again with a move
            _, applied, exp = repair
            hit = (
                self.recorded.from_cache(v, exp, target, self.pool, repair=applied)
                if self.reuse
                else None
            )
            if hit is None:
                return False
            runs.deliver(v, hit, target, self.on_result)
            return True
        fresh = self.fresh_runs(v) if callable(self.fresh_runs) else self.fresh_runs
        row = (
            None
            if fresh and not self.reuse
            else self.recorded.known(v, target, self.pool, again=fresh)
        )
        if row is None:
            return False
        runs.deliver(v, row, target, self.on_result)
        return True

    def budget(self, in_flight: int) -> str | None:
        return self.runs.budget(in_flight)

    def start(self, v: tuple[int, ...]) -> Task:
        runs = self.runs
        repair = self._repair(v)
        if repair is not None:
            chain, applied, exp = repair
            self.emit(
                Notice(
                    host=chain[-1].host,
                    message=(
                        f"{runs.label(v)} failed on a resource ({chain[-1].signature}) "
                        f"[run {chain[-1].id}]; starting it again with {applied.describe()} "
                        f"(repair {len(chain)} of at most "
                        f"{runs.policy(chain[-1].host).steps})"
                    ),
                )
            )
            return Task(
                key=v,
                exp=exp,
                label=runs.repaired_label(v, applied),
                run_id=runs.store.reserve_run_id(runs.cid),
                target=self.target,
                good_metric=runs.good_metric,
                purpose="repair",
                precheck=self.precheck,
                repair=applied.to_dict(),
            )
        exp = runs.plan.variant(frozenset(v))
        return Task(
            key=v,
            exp=exp,
            label=runs.label(v),
            run_id=runs.store.reserve_run_id(runs.cid),
            target=self.target,
            good_metric=runs.good_metric,
            purpose=self.purpose(v),
            precheck=self.precheck,
            builds=self.builds,
            # good's answers are the reference: asked twice on its start (the noise)
            ask_twice=v == () and answers_check.judged(exp),
        )

    def blocked(self, v: tuple[int, ...]) -> bool:
        return self.runs.pending_repair(v) is not None

    def known(self, v: tuple[int, ...]) -> bool:
        return self.recorded.known(v, self.target, self.pool) is not None

    def start_ahead(self, v: tuple[int, ...]) -> Task:
        runs = self.runs
        return Task(
            key=v,
            exp=runs.plan.variant(frozenset(v)),
            label=runs.label(v),
            run_id=runs.store.reserve_run_id(runs.cid),
            target=self.target,
            good_metric=runs.good_metric,
            purpose="speculative",
            precheck=self.precheck,
            builds=self.builds,
        )

    def finished(self, task: Task, result: RunResult) -> None:
        runs = self.runs
        result = runs.judge_answers(task.key, result)
        row = runs.record(
            result, variant=task.key, purpose=task.purpose, run_id=task.run_id, repair=task.repair
        )
        runs.executed += 1
        # told before the streak is counted: the run that ends the campaign is seen too
        told = runs.relabel(row, self.target, "run")
        runs.core.note_infra(
            row.verdict,
            row.host,
            row.detail,
            len(self.pool.healthy()),
            deployment=bool(row.config.get("roles")),
        )
        runs.deliver(task.key, told, self.target, self.on_result)


__all__ = ["VariantRuns"]
