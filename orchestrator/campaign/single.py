"""One recorded run outside a bisection (`orchestrator run`, `orchestrator rerun`): a
campaign of one run, recorded and interrupted by the same rules as any other."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from orchestrator.campaign import answers_check
from orchestrator.campaign.core import CampaignCore, ExecutorFactory, default_executor
from orchestrator.campaign.records import Status
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.diagnosis.verdicts import Signature
from orchestrator.events import Listener, null_listener
from orchestrator.execution.executor import service_name
from orchestrator.store.store import RunRow, Store


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
    executor_factory: ExecutorFactory = default_executor,
    spec_extra: dict[str, Any] | None = None,
    good_metric: float | None = None,
    reference: RunRow | None = None,
) -> RunRow:
    """Run `exp` once on `host`, record and return the run. Ctrl-C restores the host and
    raises `Interrupted` (no partial outcome: the run did not finish)."""
    return single_runs(
        store,
        exp,
        host,
        kind=kind,
        command=command,
        label=label,
        target=target,
        env_keys=env_keys,
        listener=listener,
        executor_factory=executor_factory,
        spec_extra=spec_extra,
        good_metric=good_metric,
        reference=reference,
    )[0]


def single_runs(
    store: Store,
    exp: Experiment,
    host: Host,
    *,
    kind: str,
    command: str,
    label: str,
    starts: int = 1,
    target: Signature | None = None,
    env_keys: frozenset[str] = frozenset(),
    listener: Listener = null_listener,
    executor_factory: ExecutorFactory = default_executor,
    spec_extra: dict[str, Any] | None = None,
    good_metric: float | None = None,
    reference: RunRow | None = None,
) -> list[RunRow]:
    """Start `exp` `starts` times on `host` (one campaign, the host locked throughout),
    record every start and return them in order. Ctrl-C restores the host and raises
    `Interrupted` with the starts recorded so far."""
    spec: dict[str, Any] = {"config": exp.to_dict(), "source": exp.source, "hosts": [host.name]}
    if starts > 1:
        spec["starts"] = starts
    spec |= spec_extra or {}
    # every run is a campaign of its own: a key no other campaign has
    key = hashlib.sha256(f"{kind}:{exp.fingerprint()}:{time.time()}".encode()).hexdigest()[:16]
    core = CampaignCore(
        store,
        kind=kind,
        key=key,
        spec=lambda: spec,
        secrets=exp.secrets(),
        command=command,
        listener=listener,
        executor_factory=executor_factory,
    )
    if target is not None:
        store.update_campaign(core.cid, target=target)
    rows: list[RunRow] = []
    with (
        core.guard(lambda: list(rows) or None),
        core.track(executor_factory(host, service_name(exp), core.cid, listener)) as ex,
    ):
        for n in range(1, starts + 1):
            result = ex.run(
                exp,
                run_id=f"{core.cid}.{n}",
                label=label + (f" (start {n}/{starts})" if starts > 1 else ""),
                target=target,
                env_keys=env_keys | frozenset(exp.env_map()),
                good_metric=good_metric,
            )
            # its answers against the recorded good's (none: said to be not judged)
            result = answers_check.judge_result(result, reference, target)
            rid = store.add_run(
                core.cid, variant=(), purpose=kind, result=result, run_id=f"{core.cid}.{n}"
            )
            rows.append(store.run(rid))
            core.recorded(rows[-1], purpose=kind, source="run", done=n)
    store.update_campaign(core.cid, status=Status.DONE.value)
    return rows


__all__ = ["single_run", "single_runs"]
