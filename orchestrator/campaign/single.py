"""One recorded run outside a bisection (`orchestrator run`, `orchestrator rerun`): a
campaign of one run, recorded and interrupted by the same rules as any other."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from orchestrator.campaign.core import CampaignCore, ExecutorFactory, default_executor
from orchestrator.campaign.records import Status
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.diagnosis.verdicts import Signature
from orchestrator.events import Listener, null_listener
from orchestrator.execution.executor import service_name
from orchestrator.results.store import RunRow, Store


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
) -> RunRow:
    """Run `exp` once on `host`, record and return the run. Ctrl-C restores the host and
    raises `Interrupted` (no partial outcome: the run did not finish)."""
    spec = {"config": exp.to_dict(), "source": exp.source, "hosts": [host.name]}
    spec |= spec_extra or {}
    # every run is a campaign of its own: a key no other campaign has
    key = hashlib.sha256(f"{kind}:{exp.fingerprint()}:{time.time()}".encode()).hexdigest()[:16]
    core = CampaignCore(store, kind=kind, key=key, spec=lambda: spec, secrets=exp.secrets(),
                        command=command, listener=listener,
                        executor_factory=executor_factory)  # fmt: skip
    if target is not None:
        store.update_campaign(core.cid, target=target)
    with core.guard(lambda: None), \
            core.track(executor_factory(host, service_name(exp), core.cid, listener)) as ex:
        result = ex.run(exp, run_id=f"{core.cid}.1", label=label, target=target,
                        env_keys=env_keys | frozenset(exp.env_map()),
                        good_metric=good_metric)  # fmt: skip
    rid = store.add_run(core.cid, variant=(), purpose=kind, result=result)
    store.update_campaign(core.cid, status=Status.DONE.value)
    row = store.run(rid)
    core.recorded(row, purpose=kind, source="run", done=1)
    return row


__all__ = ["single_run"]
