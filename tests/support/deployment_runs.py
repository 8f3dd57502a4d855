"""A bisection over a two-node deployment, recorded in a real store without a host.

The pair: two node ranks of one SGLang server (node0 on b300-01, node1 on b300-02); bad
adds `--ep-size 8` on both, raises `--max-running-requests`, and gives node1 alone
`--cuda-graph-max-bs 512`, which makes node1 crash in graph capture while node0 times out
in a collective. The runs are recorded as a deployment's runs are: the failing role's
host and log tail, `detail` naming the first failure, and the host record of every role.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.campaign.planning import make_plan
from orchestrator.campaign.records import BisectSpec, Culprit, Finding, Outcome, Status
from orchestrator.diagnosis.first_failure import RoleResult, first_failure
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict
from orchestrator.store.store import Store
from tests.support.run_results import run_result

GOOD = """\
name: two-nodes-good
service:
  exec: /opt/sglang/bin/python -m sglang.launch_server
  flags: {model-path: /m, tp-size: 16, nnodes: 2, dist-init-addr: "10.0.0.1:5000",
          port: 30000, max-running-requests: 128}
roles:
  node0: {kind: node, rank: 0, host: b300-01, unit: sglang-n0.service, flags: {node-rank: 0}}
  node1: {kind: node, rank: 1, host: b300-02, unit: sglang-n1.service, flags: {node-rank: 1}}
"""

BAD = """\
name: two-nodes-bad
service:
  exec: /opt/sglang/bin/python -m sglang.launch_server
  flags: {model-path: /m, tp-size: 16, nnodes: 2, dist-init-addr: "10.0.0.1:5000",
          port: 30000, max-running-requests: 256, ep-size: 8}
roles:
  node0: {kind: node, rank: 0, host: b300-01, unit: sglang-n0.service, flags: {node-rank: 0}}
  node1:
    kind: node
    rank: 1
    host: b300-02
    unit: sglang-n1.service
    flags: {node-rank: 1, cuda-graph-max-bs: 512}
"""

CRASH = Signature(
    Phase.CUDA_GRAPH, "cublas", "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED @ cuda_graph_runner"
)
WATCHDOG = Signature(Phase.CUDA_GRAPH, "nccl_timeout", "Watchdog caught collective timeout")
OTHER = Signature(Phase.INIT, "attributeerror", "'NoneType' object has no attribute 'dtype'")
NODE1_LOG = "[2026-12-05 00:00:10 TP8] Capturing batches\nRuntimeError: CUBLAS node1 crash\n"
NODE0_LOG = "[2026-12-05 00:00:12 TP0] Watchdog caught collective operation timeout\n"
HOSTS = {"node0": "b300-01", "node1": "b300-02"}
UNITS = {"node0": "sglang-n0.service", "node1": "sglang-n1.service"}


@dataclass
class Recorded:
    results: Path
    campaign: str
    #: label -> run id
    runs: dict[str, str]
    #: the per-role delta's short label (`node1: --cuda-graph-max-bs 512`)
    culprit: str
    describe: str


def _record(roles: dict[str, tuple[str, Signature | None, str]]) -> dict[str, Any]:
    """The host record of a run whose roles ended so (verdict, signature, log tail)."""
    results = [
        RoleResult(
            name,
            HOSTS[name],
            signature=sig,
            kind="timeout" if sig is not None and sig.error_class == "nccl_timeout" else None,
            failed_at=100.0 + (5 if name == "node0" else 0) if sig else None,
        )
        for name, (_, sig, _) in roles.items()
    ]
    first = first_failure(results)
    return {
        "manager": "deployment",
        "roles": [
            {
                "role": name,
                "kind": "node",
                "rank": int(name[-1]),
                "host": HOSTS[name],
                "unit": UNITS[name],
                "verdict": verdict,
                "signature": str(sig) if sig else None,
                "failed_at": None,
                "clock_offset": 0.0,
                "log_tail": log,
                "rendered": f"[Service]\nExecStart=... --node-rank {name[-1]}\n",
                "invocation": f"inv-{name}",
            }
            for name, (verdict, sig, log) in roles.items()
        ],
        "first_failure": None
        if first is None
        else {"role": first.role, "host": first.host, "describe": first.describe()},
    }


def record_campaign(root: Path) -> Recorded:
    """Write the pair under `root` and record its bisection in `root/results`."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "good.yaml").write_text(GOOD)
    (root / "bad.yaml").write_text(BAD)
    plan = make_plan(str(root / "good.yaml"), str(root / "bad.yaml"), "auto")
    [node1_delta] = [i for i, d in enumerate(plan.deltas) if d.role == "node1"]
    everything = frozenset(range(plan.n))
    crash_roles = {
        "node0": ("timeout", WATCHDOG, NODE0_LOG),
        "node1": ("fail", CRASH, NODE1_LOG),
    }
    passing = {
        "node0": ("pass", None, "ready\n"),
        "node1": ("pass", None, "ready\n"),
    }
    other_roles = {
        "node0": ("other", OTHER, "AttributeError: 'NoneType' object has no attribute 'dtype'\n"),
        "node1": ("timeout", WATCHDOG, NODE0_LOG),
    }
    steps = [
        ("good", frozenset(), Verdict.PASS, None, passing, "endpoint"),
        ("bad", everything, Verdict.FAIL, CRASH, crash_roles, "endpoint"),
        ("repro", frozenset({node1_delta}), Verdict.FAIL, CRASH, crash_roles, "confirm"),
        ("clear", everything - {node1_delta}, Verdict.OTHER, OTHER, other_roles, "confirm"),
    ]
    store = Store(root / "results")
    try:
        spec = BisectSpec(
            good=plan.good.to_dict(),
            bad=plan.bad.to_dict(),
            good_source=plan.good.source,
            bad_source=plan.bad.source,
            deltas=[d.to_dict() for d in plan.deltas],
            hosts=["b300-01", "b300-02"],
        )
        cid = store.create_campaign(kind="bisect", key="k", command="test", spec=spec.to_dict())
        ids: dict[str, str] = {}
        for name, v, verdict, sig, roles, purpose in steps:
            rec = _record(roles)
            first = rec["first_failure"]
            ids[name] = store.add_run(
                cid,
                variant=tuple(sorted(v)),
                purpose=purpose,
                result=run_result(
                    plan.variant(v),
                    verdict,
                    sig,
                    label=plan.describe(v),
                    host=first["host"] if first else "b300-01",
                    detail=first["describe"] if first else "",
                    log_tail=roles[first["role"]][2] if first else roles["node0"][2],
                    host_record=rec,
                ),
            )
        delta = plan.deltas[node1_delta]
        culprit = Culprit(
            deltas=[delta.describe()],
            flags=[delta.short()],
            indices=[node1_delta],
            interacting=False,
            reproduced_by=ids["repro"],
            cleared_by={delta.short(): ids["clear"]},
            confirmed=True,
            whats=["flag"],
        )
        outcome = Outcome(
            campaign_id=cid,
            status=Status.FOUND,
            target=CRASH,
            culprits=[culprit],
            findings=[
                Finding(
                    OTHER,
                    tuple(sorted(everything - {node1_delta})),
                    ids["clear"],
                    plan.describe(everything - {node1_delta}),
                )
            ],
            deltas=[d.describe() for d in plan.deltas],
        )
        store.update_campaign(cid, status="done", answer=outcome.to_dict(), target=CRASH)
    finally:
        store.close()
    return Recorded(root / "results", cid, ids, delta.short(), delta.describe())
