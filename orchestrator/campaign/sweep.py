"""Sweeps: the configs of a sweep file (`orchestrator.config.sweep`), each run once per
repeat, recorded as a campaign (resumable, budgeted).

A probe bar relative to the good config (`pass_if: ">= 0.95 * good"`) is judged against
the reference config's metric measured in the same sweep, in the same repeat: the reference
runs first, and is added to the table when it is not one of the swept configs. A sweep
measures afresh (it is what a nightly schedule is for); results recorded by other campaigns
are reused only when asked (`reuse`), and then judged by the same rule as the rows measured.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from orchestrator.campaign import answers_check
from orchestrator.campaign.core import (
    CachedResult,
    CampaignCore,
    ExecutorFactory,
    default_executor,
)
from orchestrator.campaign.pool import Pool, Task
from orchestrator.campaign.records import (
    Status,
    SweepAnswer,
    SweepSpec,
    SweepSpecItem,
    SweepTableRow,
)
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.config.sweep import Sweep, SweepItem, relative_bar
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict
from orchestrator.errors import CampaignRef, UsageError
from orchestrator.events import CampaignStarted, Listener, Notice, null_listener
from orchestrator.execution.contract import RunResult
from orchestrator.execution.executor import service_name
from orchestrator.execution.inputs import LaunchInputs
from orchestrator.store.store import RunRow, Store

TIME_SPENT = "the time budget (--until / --deadline) is spent"
MAX_ATTEMPTS = 3  # of one (config, repeat) that ends in host trouble


def parse_until(text: str, now: dt.datetime | None = None) -> float:
    """'07:00' -> seconds from now until the next 07:00 (local time)."""
    m = re.fullmatch(r"(\d{1,2}):(\d{2})", text.strip())
    if not m or int(m[1]) > 23 or int(m[2]) > 59:
        raise UsageError(f"--until {text!r}: expected a time of day like 07:00")
    now = now or dt.datetime.now()
    at = now.replace(hour=int(m[1]), minute=int(m[2]), second=0, microsecond=0)
    if at <= now:
        at += dt.timedelta(days=1)
    return (at - now).total_seconds()


def judge_reused(
    row: RunRow, exp: Experiment, good_metric: float | None
) -> tuple[Verdict, Signature | None]:
    """A run recorded by another campaign, judged by this sweep's rule: no target (any
    failure is `fail`), and the probe bar evaluated on its recorded metric against this
    sweep's reference (the other campaign may have judged it against another good)."""
    verdict, sig = row.verdict, row.signature
    if verdict in (Verdict.OTHER, Verdict.TIMEOUT):
        verdict = Verdict.FAIL
    probe = exp.probe
    cond = probe.condition if probe else None
    by_the_bar = verdict is Verdict.PASS or (
        sig is not None and sig.phase is Phase.PROBE and sig.error_class == "probe_threshold"
    )
    if probe is None or cond is None or not by_the_bar:
        return verdict, sig
    if cond.relative_to_good and good_metric is None:
        return verdict, sig  # nothing to judge against: as recorded
    if row.probe_metric is not None and cond.holds(row.probe_metric, good_metric):
        return Verdict.PASS, None
    return Verdict.FAIL, Signature(Phase.PROBE, "probe_threshold", f"metric missed {probe.pass_if}")


@dataclass
class SweepRow:
    item: SweepItem
    repeat: int
    run: RunRow | None


@dataclass
class SweepOutcome:
    campaign_id: str
    status: Status  # done | incomplete | interrupted
    rows: list[SweepRow] = field(default_factory=list)
    message: str = ""
    executed: int = 0  # by this invocation
    reused: int = 0  # by this invocation
    total_executed: int = 0  # by the whole campaign (every invocation)
    total_reused: int = 0
    removed_hosts: list[tuple[str, str]] = field(default_factory=list)
    resumable: bool = False  # stopped on a budget: the same command continues it
    resume: str = ""  # that command, as the CLI words it
    reference: str | None = None  # the label of the reference config
    notes: list[str] = field(default_factory=list)

    def answer(self) -> SweepAnswer:
        """The typed record of this outcome, as stored and printed by `--json`."""
        return SweepAnswer(
            self.campaign_id,
            self.status,
            message=self.message,
            resume=self.resume or None,
            resumable=self.resumable,
            executed=self.executed,
            reused=self.reused,
            total_executed=self.total_executed,
            total_reused=self.total_reused,
            removed_hosts=list(self.removed_hosts),
            reference=self.reference,
            notes=self.notes,
            rows=[
                SweepTableRow(
                    config=r.item.label,
                    repeat=r.repeat,
                    run=r.run.id if r.run else None,
                    verdict=r.run.verdict.value if r.run else None,
                    signature=str(r.run.signature) if r.run and r.run.signature else None,
                    metric=r.run.probe_metric if r.run else None,
                    duration=r.run.duration if r.run else None,
                    reused_from=r.run.cached_from if r.run else None,
                    reference=r.item.label == self.reference,
                    bar=r.item.exp.probe.pass_if if r.item.exp.probe else None,
                )
                for r in self.rows
            ],
        )


def sweep_key(sweep: Sweep, hosts: list[Host]) -> str:
    """Same sweep file content on the same hosts: what resumes, and what nights compare."""
    blob = json.dumps(
        [
            sweep.name,
            [it.exp.fingerprint() for it in sweep.items],
            sweep.repeat,
            sorted(h.name for h in hosts),
        ]
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class SweepCampaign:
    """One sweep campaign: every config once per repeat, on a host or a pool of hosts."""

    def __init__(
        self,
        store: Store,
        sweep: Sweep,
        hosts: list[Host],
        *,
        reuse: bool = False,
        max_runs: int | None = None,
        deadline_s: float | None = None,
        listener: Listener = null_listener,
        command: str = "",
        resume_id: str | None = None,
        executor_factory: ExecutorFactory = default_executor,
        resume_text: Callable[[CampaignRef], str] | None = None,
    ) -> None:
        """`resume_text` words the command that resumes the sweep, for its stored answer
        (the CLI's wording: the core does not write command lines)."""
        self.sweep, self.hosts, self.reuse = sweep, hosts, reuse
        self.store, self.emit, self.resume_text = store, listener, resume_text
        self.core = CampaignCore(
            store,
            kind="sweep",
            key=sweep_key(sweep, hosts),
            spec=lambda: self.spec().to_dict(),
            secrets={k: v for it in sweep.items for k, v in it.exp.secrets().items()},
            command=command,
            resume_id=resume_id,
            # a sweep stopped by its budget (--until, --max-runs) goes on with the same command
            resumable=lambda last: (
                last.status == "incomplete" and SweepAnswer.from_dict(last.answer or {}).resumable
            ),
            max_runs=max_runs,
            deadline_s=deadline_s,
            listener=listener,
            executor_factory=executor_factory,
        )
        self.cid = self.core.cid
        self._said_unanswered = False
        self.resumed = self.core.resumed
        self._started = 0  # runs this invocation started: what --max-runs counts

    def spec(self) -> SweepSpec:
        sweep = self.sweep
        return SweepSpec(
            sweep=sweep.source,
            name=sweep.name,
            hosts=[h.name for h in self.hosts],
            repeat=sweep.repeat,
            axes=sweep.axes,
            reference=sweep.reference,
            reuse=self.reuse,
            items=[
                SweepSpecItem(it.label, list(it.values), it.exp.to_dict()) for it in sweep.items
            ],
        )

    def _recorded(self) -> dict[tuple[int, int], RunRow]:
        """(item, repeat) -> its recorded run: the variant column holds the item's index,
        the purpose `sweep/<repeat>` the repeat."""
        out: dict[tuple[int, int], RunRow] = {}
        for r in self.store.runs(self.cid):
            m = re.fullmatch(r"sweep/(\d+)", r.purpose)
            if r.verdict is not Verdict.INFRA and len(r.variant) == 1 and m:
                out[(r.variant[0], int(m[1]))] = r
        return out

    def _todo(self) -> list[tuple[SweepItem, int]]:
        """Every (config, repeat), repeat by repeat, the reference first in each."""
        ref = self.sweep.reference
        order = sorted(self.sweep.items, key=lambda it: it.index != ref)
        return [(it, k) for k in range(self.sweep.repeat) for it in order]

    def _good(
        self,
        it: SweepItem,
        k: int,
        pending: set[tuple[int, int]],
        recorded: dict[tuple[int, int], RunRow],
    ) -> tuple[str, float | None, str]:
        """What a config's relative bar is judged against in repeat k: ("ready", metric, ''),
        ("wait", None, '') while the reference is still to run, or ("none", None, why)."""
        ref = self.sweep.reference
        if ref is None or not self.sweep.needs_reference(it):
            return "ready", None, ""
        row = recorded.get((ref, k))
        if row is None:
            if (ref, k) in pending:
                return "wait", None, ""
            return (
                "none",
                None,
                (f"the reference {self.sweep.items[ref].label} has no verdict in repeat {k + 1}"),
            )
        if row.probe_metric is None and not relative_bar(it.exp):
            # judged by its answers alone: against the reference's run, whatever its metric
            return "ready", None, ""
        if row.probe_metric is None:
            return (
                "none",
                None,
                (
                    f"the reference {row.label} has no metric in repeat {k + 1} "
                    f"({row.verdict.value}, run {row.id})"
                ),
            )
        return "ready", row.probe_metric, ""

    def run(self) -> SweepOutcome:
        todo = self._todo()
        done = self._recorded()
        self.emit(
            CampaignStarted(
                campaign_id=self.cid,
                kind="sweep",
                n_deltas=len(self.sweep.items),
                strategy="sweep",
                expected_runs=len(todo),
                resumed_runs=len(done),
                deadline_s=self.core.deadline_s,
            )
        )
        outcome = SweepOutcome(self.cid, Status.DONE)
        ref = self.sweep.reference
        outcome.reference = self.sweep.items[ref].label if ref is not None else None
        queue_ = [(it, k) for it, k in todo if (it.index, k) not in done]
        attempts: dict[tuple[int, int], int] = {}
        not_judged: dict[str, int] = {}
        env_keys = frozenset(k for it in self.sweep.items for k in it.exp.env_map())
        service = service_name(self.sweep.items[0].exp)
        stop_reason = ""

        def partial() -> SweepOutcome:  # what an interrupt leaves: the rows so far
            self._settle(outcome, todo)
            outcome.status = Status.INTERRUPTED
            return outcome

        with (
            self.core.guard(partial),
            self.core.pool(self.hosts, service=service, env_keys=env_keys) as pool,
        ):
            in_flight: dict[tuple[int, int], Task] = {}
            for _ in range(1_000_000):  # bounded: each pass records, drops or waits
                stop_reason = self._hand_out(
                    pool, queue_, in_flight, not_judged, outcome, stop_reason
                )
                if not in_flight:
                    break
                d = pool.wait()
                key = d.task.key
                in_flight.pop(key, None)
                it = self.sweep.items[key[0]]
                if d.result is None:
                    # the pool took the host out (the last one too): the others take
                    # the task; with none left the error ends the campaign
                    if isinstance(d.error, KeyboardInterrupt) or not pool.healthy():
                        raise d.error or RuntimeError("no host left in the pool")
                    queue_.insert(0, (it, key[1]))
                    continue
                result = d.result
                if self.sweep.needs_reference(it):  # its answers against the reference's
                    ref_row = self._recorded().get((self.sweep.reference, key[1]))  # type: ignore[arg-type]
                    result = answers_check.judge_result(result, ref_row, None)
                row = self.core.record(
                    result, variant=(key[0],), purpose=f"sweep/{key[1]}", run_id=d.task.run_id
                )
                outcome.executed += 1
                self._say_unanswered(it, result)
                self._emit(row, "run")  # before the streak: the run that ends it is seen too
                self.core.note_infra(
                    row.verdict,
                    row.host,
                    row.detail,
                    len(pool.healthy()),
                    deployment=bool(row.config.get("roles")),
                )
                attempts[key] = attempts.get(key, 0) + 1
                if row.verdict is Verdict.INFRA and attempts[key] < MAX_ATTEMPTS:
                    queue_.insert(0, (it, key[1]))
            outcome.removed_hosts = list(pool.removed)
        self._settle(outcome, todo)
        outcome.notes = [f"{n} config run(s) not judged: {why}" for why, n in not_judged.items()]
        if stop_reason or any(r.run is None for r in outcome.rows):
            outcome.status = Status.INCOMPLETE
            outcome.message = (
                stop_reason or "; ".join(outcome.notes) or "some configs have no verdict"
            )
            if stop_reason:
                outcome.resumable = True
                outcome.resume = self.resume_text(self.core.ref) if self.resume_text else ""
        self.core.finish(outcome.status, message=outcome.message, answer=outcome.answer().to_dict())
        return outcome

    def _settle(self, outcome: SweepOutcome, todo: list[tuple[SweepItem, int]]) -> None:
        """The table as recorded: a row per (config, repeat), and the campaign's totals."""
        recorded = self._recorded()
        outcome.rows = [SweepRow(it, k, recorded.get((it.index, k))) for it, k in todo]
        runs = self.store.runs(self.cid)
        outcome.total_executed = sum(1 for r in runs if r.cached_from is None)
        outcome.total_reused = sum(1 for r in runs if r.cached_from is not None)

    def _hand_out(
        self,
        pool: Pool,
        queue_: list[tuple[SweepItem, int]],
        in_flight: dict[tuple[int, int], Task],
        not_judged: dict[str, int],
        outcome: SweepOutcome,
        stop_reason: str,
    ) -> str:
        """Start what can start on idle hosts (a config judged against the reference waits
        for the reference's run of its repeat); record reused runs. Returns why it stopped
        starting runs (a budget), or ''."""
        for _ in range(len(queue_) + 1):
            if not queue_ or stop_reason:
                return stop_reason
            recorded = self._recorded()
            pending = {(it.index, k) for it, k in queue_} | set(in_flight)
            for pos, (it, k) in enumerate(queue_):
                state, good, why = self._good(it, k, pending, recorded)
                if state == "wait":
                    continue
                if state == "none":
                    queue_.pop(pos)
                    not_judged[why] = not_judged.get(why, 0) + 1
                    break
                if (
                    self.reuse
                    and k == 0
                    and it.index != self.sweep.reference
                    and not answers_check.judged(it.exp)  # judged against this reference
                ):
                    hit, inputs = self._reusable(pool, it.exp)
                    if hit is not None:
                        self._record_reused(it, k, hit, good, inputs)
                        outcome.reused += 1
                        queue_.pop(pos)
                        break
                if not pool.idle():
                    return stop_reason
                stop_reason = self.core.budget_spent(self._started, deadline_reason=TIME_SPENT)
                if stop_reason:
                    return stop_reason
                task = Task(
                    key=(it.index, k),
                    exp=it.exp,
                    label=it.label,
                    run_id=self.store.reserve_run_id(self.cid),
                    good_metric=good,
                    purpose="sweep",
                )
                if not pool.submit(task):
                    return stop_reason
                queue_.pop(pos)
                in_flight[(it.index, k)] = task
                self._started += 1
                break
            else:
                return stop_reason  # everything left waits for a reference in progress
        return stop_reason

    def _reusable(self, pool: Pool, exp: Experiment) -> tuple[RunRow | None, LaunchInputs | None]:
        """The newest run of an earlier campaign of the same launch: the config, and what
        would reach its server on the first host now (read there); (None, None) if none,
        or if the host cannot tell."""
        host = self.hosts[0]
        fp = exp.fingerprint()
        if not self.store.reuse_candidates(fp, host.host_class, exclude_campaign=self.cid):
            return None, None
        inputs = pool.inputs_of(host, exp)
        hits = self.store.reusable(inputs.key(fp), exclude_campaign=self.cid) if inputs else []
        return (hits[-1], inputs) if hits else (None, None)

    def _record_reused(
        self,
        it: SweepItem,
        k: int,
        hit: RunRow,
        good: float | None,
        inputs: LaunchInputs | None = None,
    ) -> None:
        cached = CachedResult.from_row(hit, it.label, self.hosts[0], it.exp, inputs)
        verdict, sig = judge_reused(hit, it.exp, good)
        cached = replace(cached, verdict=verdict, signature=sig)
        row = self.core.record(
            cached, variant=(it.index,), purpose=f"sweep/{k}", cached_from=hit.id
        )
        self._emit(row, "cache")

    def _say_unanswered(self, it: SweepItem, result: RunResult) -> None:
        """Said once, at the reference's first run: the prompts it got no answer to judge
        no config of the sweep (a config's answers would otherwise pass unjudged,
        silently)."""
        if self._said_unanswered or it.index != self.sweep.reference:
            return
        if not answers_check.judged(it.exp) or result.verdict is not Verdict.PASS:
            return
        said = answers_check.unanswered_message(result, f"the {it.label}")
        if said:
            self._said_unanswered = True
            self.emit(Notice(host=result.host, message=said))

    def _emit(self, row: RunRow, source: str) -> None:
        self.core.recorded(
            row, purpose="sweep", source=source, done=self.store.judged_count(self.cid)
        )
