"""Sweeps: a list of experiment configs and/or a matrix of flag values over a base config,
each run once per repeat, recorded as a campaign (resumable, budgeted, cache-aware).

    name: nightly-rtx6000
    base: experiments/lab/rtx6000/perf_good.yaml   # relative to the sweep file
    matrix:                                         # cartesian product over the base
      cuda-graph-max-bs: [128, 256, 512]
      mem-fraction-static: [0.85, 0.92]
    env_matrix: {NCCL_ALGO: [Ring, Tree]}           # optional
    configs: [other.yaml]                           # optional extra configs
    repeat: 1
    host: lab                                       # default host or pool
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator import envwatch
from orchestrator.config.experiment import Experiment, load_experiment
from orchestrator.config.hosts import Host
from orchestrator.config.yamlio import read_yaml_mapping, validation_error
from orchestrator.errors import ConfigError, InfraError, OrchestratorError, UsageError
from orchestrator.events import (
    CampaignFinished,
    CampaignStarted,
    Listener,
    RunRecorded,
    null_listener,
)
from orchestrator.executor import Executor, service_name
from orchestrator.pool import Pool, Task
from orchestrator.store import RunRow, Store
from orchestrator.verdicts import Verdict

Value = bool | int | float | str | None
MAX_INFRA_IN_A_ROW = 3  # per healthy host, as in a bisection


class SweepModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    base: str | None = None
    matrix: dict[str, list[Value]] = Field(default_factory=dict)
    env_matrix: dict[str, list[str | None]] = Field(default_factory=dict)
    configs: list[str] = Field(default_factory=list)
    repeat: int = Field(default=1, ge=1, le=100)
    host: str | None = None
    reference: str | None = None  # the config whose probe metric is "good" (default: base)
    notify: str | None = None  # URL to POST a message to when the sweep ends


@dataclass(frozen=True)
class SweepItem:
    index: int
    label: str  # the config's delta against the base, e.g. "cuda-graph-max-bs=512"
    exp: Experiment
    values: tuple[tuple[str, Value], ...] = ()  # the swept values, for plots


@dataclass(frozen=True)
class Sweep:
    name: str
    source: str
    items: tuple[SweepItem, ...]
    repeat: int
    host: str | None
    base: Experiment | None
    notify: str | None = None

    @property
    def axes(self) -> list[str]:
        names: list[str] = []
        for it in self.items:
            for k, _ in it.values:
                if k not in names:
                    names.append(k)
        return names


def load_sweep(path: str | Path) -> Sweep:
    path = Path(path)
    raw = read_yaml_mapping(path, what="sweep")
    try:
        m = SweepModel.model_validate(raw)
    except ValidationError as exc:
        raise validation_error(exc, SweepModel, file=str(path)) from None
    items: list[SweepItem] = []
    base = load_experiment(path.parent / m.base) if m.base else None
    if (m.matrix or m.env_matrix) and base is None:
        raise ConfigError("a matrix needs a base config to vary", file=str(path), key="base")
    if base is not None:
        axes = [(k.lstrip("-"), "flag", vs) for k, vs in m.matrix.items()]
        axes += [(k, "env", vs) for k, vs in m.env_matrix.items()]
        for key, _, vs in axes:
            if not vs:
                raise ConfigError("needs at least one value", file=str(path),
                                  key=f"matrix.{key}")  # fmt: skip
        combos = itertools.product(*[vs for _, _, vs in axes]) if axes else [()]
        for combo in combos:
            flags = {k: v for (k, kind, _), v in zip(axes, combo, strict=True) if kind == "flag"}
            env = {k: v for (k, kind, _), v in zip(axes, combo, strict=True) if kind == "env"}
            values = tuple((k, v) for (k, _, _), v in zip(axes, combo, strict=True))
            label = " ".join(f"{k}={v}" for k, v in values) or "base"
            exp = base.with_changes(flags=flags, env=env, name=f"{base.name}[{label}]")
            items.append(SweepItem(len(items), label, exp, values))
    for i, ref in enumerate(m.configs):
        exp = load_experiment(path.parent / ref)
        items.append(SweepItem(len(items), exp.name or f"config {i}", exp))
    if not items:
        raise ConfigError("nothing to sweep: give configs, or a base with a matrix",
                          file=str(path))  # fmt: skip
    seen: dict[str, str] = {}
    for it in items:
        fp = it.exp.fingerprint()
        if fp in seen:
            raise ConfigError(f"'{it.label}' launches the same server as '{seen[fp]}'",
                              file=str(path))  # fmt: skip
        seen[fp] = it.label
    return Sweep(m.name or path.stem, str(path), tuple(items), m.repeat, m.host, base,
                 notify=m.notify)


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


@dataclass
class SweepRow:
    item: SweepItem
    repeat: int
    run: RunRow | None


@dataclass
class SweepOutcome:
    campaign_id: str
    status: str  # done | incomplete
    rows: list[SweepRow] = field(default_factory=list)
    message: str = ""
    executed: int = 0
    reused: int = 0
    removed_hosts: list[tuple[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "campaign": self.campaign_id,
            "status": self.status,
            "message": self.message,
            "executed": self.executed,
            "reused": self.reused,
            "removed_hosts": self.removed_hosts,
            "rows": [
                {"config": r.item.label, "repeat": r.repeat,
                 "run": r.run.id if r.run else None,
                 "verdict": r.run.verdict.value if r.run else None,
                 "signature": str(r.run.signature) if r.run and r.run.signature else None,
                 "metric": r.run.probe_metric if r.run else None,
                 "duration": r.run.duration if r.run else None}
                for r in self.rows
            ],
        }  # fmt: skip


def _default_executor(host: Host, service: str, campaign: str, listener: Listener) -> Executor:
    return Executor(host, service=service, campaign=campaign, listener=listener)


class SweepCampaign:
    def __init__(
        self,
        store: Store,
        sweep: Sweep,
        hosts: list[Host],
        *,
        fresh: bool = False,
        max_runs: int | None = None,
        deadline_s: float | None = None,
        listener: Listener = null_listener,
        command: str = "",
        resume_id: str | None = None,
        executor_factory=_default_executor,  # noqa: ANN001
    ) -> None:
        self.store = store
        self.sweep = sweep
        self.hosts = hosts
        self.fresh = fresh
        self.max_runs = max_runs
        self.deadline_s = deadline_s
        self.emit = listener
        self.factory = executor_factory
        self.resume_options = ""  # e.g. " --hosts lab.yaml", set by the CLI
        for it in sweep.items:
            store.add_secrets(it.exp.secrets())
        blob = json.dumps([sweep.name, [it.exp.fingerprint() for it in sweep.items],
                           sweep.repeat, sorted(h.name for h in hosts)])  # fmt: skip
        key = hashlib.sha256(blob.encode()).hexdigest()[:16]
        cid = resume_id or store.find_resumable(key)
        if cid is None:
            spec = {"sweep": sweep.source, "name": sweep.name, "hosts": [h.name for h in hosts],
                    "repeat": sweep.repeat, "axes": sweep.axes,
                    "items": [{"label": it.label, "values": list(it.values),
                               "config": it.exp.to_dict()} for it in sweep.items]}  # fmt: skip
            cid = store.create_campaign(kind="sweep", key=key, command=command, spec=spec)
        else:
            store.update_campaign(cid, status="running")
        self.cid = cid
        self._t0 = time.monotonic()

    @property
    def resume_command(self) -> str:
        return f"orchestrator sweep --resume {self.cid}{self.resume_options}"

    def _recorded(self) -> dict[tuple[int, int], RunRow]:
        """(item, repeat) -> its recorded run: the variant column holds the item's index,
        the purpose `sweep/<repeat>` the repeat."""
        out: dict[tuple[int, int], RunRow] = {}
        for r in self.store.runs(self.cid):
            m = re.fullmatch(r"sweep/(\d+)", r.purpose)
            if r.verdict is not Verdict.INFRA and len(r.variant) == 1 and m:
                out[(r.variant[0], int(m[1]))] = r
        return out

    def run(self) -> SweepOutcome:
        from orchestrator.campaign import Interrupted

        todo = [(it, k) for k in range(self.sweep.repeat) for it in self.sweep.items]
        done = self._recorded()
        self.emit(CampaignStarted(campaign_id=self.cid, kind="sweep", n_deltas=len(todo),
                                  strategy="sweep", expected_runs=len(todo),
                                  resumed_runs=len(done), deadline_s=self.deadline_s))  # fmt: skip
        outcome = SweepOutcome(self.cid, "done")
        # cache: a config measured before on this host class counts, unless --fresh
        queue_: list[tuple[SweepItem, int]] = []
        for it, k in todo:
            if (it.index, k) in done:
                continue
            if not self.fresh and k == 0:
                hit = self.store.cached(it.exp.fingerprint(), self.hosts[0].host_class,
                                        env_digest=self.store.latest_env_digest(
                                            self.hosts[0].name))  # fmt: skip
                if hit is not None:
                    self._record_cached(it, k, hit)
                    outcome.reused += 1
                    continue
            queue_.append((it, k))
        env_keys = frozenset(k for it in self.sweep.items for k in it.exp.env_map())
        service = service_name(self.sweep.items[0].exp)
        stop_reason = ""
        try:
            with Pool(self.hosts, service=service, campaign=self.cid,
                      executor_factory=self.factory, listener=self.emit,
                      env_keys=env_keys) as pool:  # fmt: skip
                in_flight = infra_streak = 0
                while queue_ or in_flight:
                    while queue_ and pool.idle() and not stop_reason:
                        stop_reason = self._budget(in_flight)
                        if stop_reason:
                            break
                        it, k = queue_[0]
                        seq = self.store.next_seq(self.cid) + in_flight
                        task = Task(key=(it.index, k), exp=it.exp, label=it.label,
                                    run_id=f"{self.cid}.{seq}")  # fmt: skip
                        if not pool.submit(task):
                            break
                        queue_.pop(0)
                        in_flight += 1
                    if not in_flight:
                        break
                    d = pool.wait()
                    in_flight -= 1
                    it = self.sweep.items[d.task.key[0]]
                    if d.result is None:
                        # the pool took the host out (the last one too): the others take
                        # the task; with none left the error ends the campaign
                        if isinstance(d.error, KeyboardInterrupt) or not pool.healthy():
                            raise d.error or RuntimeError("no host left in the pool")
                        queue_.insert(0, (it, d.task.key[1]))
                        continue
                    result, env_changed = envwatch.check(self.store, self.cid, d.result)
                    rid = self.store.add_run(self.cid, variant=(d.task.key[0],),
                                             purpose=f"sweep/{d.task.key[1]}",
                                             result=result)  # fmt: skip
                    if env_changed is not None:
                        raise env_changed
                    outcome.executed += 1
                    row = self.store.run(rid)
                    infra_streak = infra_streak + 1 if row.verdict is Verdict.INFRA else 0
                    if infra_streak >= MAX_INFRA_IN_A_ROW * max(len(pool.healthy()), 1):
                        raise InfraError(
                            f"{infra_streak} runs in a row failed on host trouble; last on "
                            f"{row.host}: {row.detail}",
                            hint="check the hosts (orchestrator hosts check), then resume "
                            f"with: {self.resume_command}")  # fmt: skip
                    if row.verdict is Verdict.INFRA and d.task.attempts < 3:
                        queue_.insert(0, (it, d.task.key[1]))
                    self._emit(row, "run")
                outcome.removed_hosts = list(pool.removed)
        except KeyboardInterrupt:
            self.store.update_campaign(self.cid, status="interrupted")
            raise Interrupted(self.cid, self.resume_command) from None
        except OrchestratorError as exc:
            self.store.update_campaign(self.cid, status=getattr(exc, "campaign_status",
                                                                "interrupted"))  # fmt: skip
            raise
        recorded = self._recorded()
        outcome.rows = [SweepRow(it, k, recorded.get((it.index, k))) for it, k in todo]
        if stop_reason or any(r.run is None for r in outcome.rows):
            outcome.status = "incomplete"
            outcome.message = stop_reason or "some configs have no verdict"
        self.store.update_campaign(self.cid, status=outcome.status, answer=outcome.to_json())
        self.emit(CampaignFinished(campaign_id=self.cid, status=outcome.status,
                                   message=outcome.message))  # fmt: skip
        return outcome

    def _budget(self, in_flight: int) -> str:
        if self.max_runs is not None:
            total = sum(1 for r in self.store.runs(self.cid) if r.cached_from is None)
            if total + in_flight >= self.max_runs:  # runs in progress count: a pool
                return f"--max-runs {self.max_runs} reached"
        if self.deadline_s is not None and time.monotonic() - self._t0 >= self.deadline_s:
            return "the time budget (--until / --deadline) is spent"
        return ""

    def _record_cached(self, it: SweepItem, k: int, hit: RunRow) -> None:
        from orchestrator.campaign import _CachedResult

        cached = _CachedResult.from_row(hit, it.label, self.hosts[0], it.exp)
        rid = self.store.add_run(self.cid, variant=(it.index,), purpose=f"sweep/{k}",
                                 result=cached, cached_from=hit.id)  # fmt: skip
        self._emit(self.store.run(rid), "cache")

    def _emit(self, row: RunRow, source: str) -> None:
        n = sum(1 for r in self.store.runs(self.cid) if r.verdict is not Verdict.INFRA)
        self.emit(RunRecorded(host=row.host, run_id=row.id, label=row.label, purpose="sweep",
                              verdict=row.verdict, signature=row.signature, source=source,
                              duration_s=row.duration, done=n))  # fmt: skip
