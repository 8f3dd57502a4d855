"""Which rank failed first, measured on real two-rank lab deployments.

    .venv/bin/python bench/first_failure.py [--starts N] [--watchdog S] [--seed N]
    .venv/bin/python bench/first_failure.py --executor [--starts N] [--watchdog S]

Starts N two-rank deployments of the lab server for each of two cases (node-rank 1 crashes
in CUDA-graph capture and rank 0 is ended by its NCCL watchdog; node-rank 0 runs out of
memory in its KV-cache phase and rank 1 is ended by its watchdog), as real processes on
127.0.0.1 connected over TCP, the ranks started in a random order. Each rank's log is
classified by the classifier; its failure time is the first stamp of the failure's lines.
The two ranks share this machine's clock, so each is then given a host clock of its own
(a random offset of up to a day) and an offset "measured" with a random error of up to
--clock-error seconds, and the roles are handed to the rule in a random order. Prints per
case: starts, right signature (the failing rank's error class and phase, as the scenario
makes it), right role, the role a baseline names (the earliest failure line on the corrected
clocks, whatever its kind), and seconds per start.

`--executor` runs each start as a campaign would: through `DeploymentExecutor`, one member
executor per rank on two local hosts of a hosts file (`lab-01`, `lab-02`: process manager,
a run directory each), the ranks installed, started in start order, polled, stopped and
judged by the executor itself; the table then counts the run's own signature and the role
its record names as the first failure (`host_record["first_failure"]`).
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.diagnosis.classify.analyze import analyze_log  # noqa: E402
from orchestrator.diagnosis.first_failure import RoleResult, first_failure, first_stamp  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CUBLAS = (
    "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling "
    "`cublasGemmStridedBatchedEx(...)`"
)
SCENARIO = f"""
name: two-nodes-bench
startup: {{init: 1.0, load_weights: 1.0, kv_cache: 1.0, cuda_graph: 2.0, warmup: 1.0}}
faults:
  - when: {{node-rank: 1, enable-nccl-nvls: true}}
    phase: cuda_graph
    error: "{CUBLAS}"
  - when: {{node-rank: 0, rank0-oom: true}}
    phase: kv_cache
    error: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
"""


@dataclass(frozen=True)
class Case:
    name: str
    flag: str
    failing: int
    error_class: str
    phase: str


CASES = (
    Case("rank 1 crashes, rank 0 times out", "--enable-nccl-nvls", 1, "cublas", "cuda_graph"),
    Case("rank 0 crashes, rank 1 times out", "--rank0-oom", 0, "cuda_oom", "kv_cache"),
)
HOSTS = ("lab-01", "lab-02")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def deploy(case: Case, scenario: Path, watchdog: float, rng: random.Random) -> dict[int, str]:
    """One two-rank start; each rank's output once both have ended (bounded)."""
    init_port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    procs: dict[int, subprocess.Popen[str]] = {}
    for rank in rng.sample([0, 1], 2):
        argv = [
            sys.executable,
            "-m",
            "orchestrator.lab.server",
            "--scenario",
            str(scenario),
            "--time-scale",
            "0.1",
            "--tp-size",
            "2",
            "--nnodes",
            "2",
            "--node-rank",
            str(rank),
            "--dist-init-addr",
            f"127.0.0.1:{init_port}",
            "--dist-timeout",
            str(watchdog),
            "--port",
            str(free_port()),
            case.flag,
        ]
        procs[rank] = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO
        )
    out: dict[int, str] = {}
    deadline = time.monotonic() + 30.0 + 2 * watchdog
    for rank, proc in procs.items():
        try:
            out[rank], _ = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            out[rank], _ = proc.communicate(timeout=10)
    return out


def judge(
    case: Case, logs: dict[int, str], rng: random.Random, clock_error: float
) -> tuple[bool, bool, bool, str]:
    """(right signature, right role, the baseline's role right, the answer in words)"""
    roles = []
    for rank in (0, 1):
        analysis = analyze_log(logs[rank])
        stamp = first_stamp(analysis.excerpt, time.gmtime().tm_year)
        true_offset = rng.uniform(-86_400, 86_400)
        roles.append(
            RoleResult(
                role=f"node-rank {rank}",
                host=HOSTS[rank],
                signature=analysis.signature,
                kind=analysis.kind,
                failed_at=None if stamp is None else stamp + true_offset,
                clock_offset=true_offset + rng.uniform(-clock_error, clock_error),
            )
        )
    rng.shuffle(roles)
    # the baseline: the earliest failure line on the corrected clocks, whatever its kind
    dated = [r for r in roles if r.failed and r.corrected is not None]
    earliest = min(dated, key=lambda r: r.corrected or 0.0).role if dated else None
    naive = earliest == f"node-rank {case.failing}"
    answer = first_failure(roles)
    if answer is None:
        return False, False, naive, "no failure"
    sig = answer.signature
    right_sig = sig.error_class == case.error_class and sig.phase.value == case.phase
    right_role = answer.role == f"node-rank {case.failing}" and answer.host == HOSTS[case.failing]
    return right_sig, right_role, naive, answer.describe()


def executor_mode(args: argparse.Namespace, tmp: Path) -> list[tuple[Case, bool, bool, float]]:
    """Every start through DeploymentExecutor: (case, right signature, right role, s)."""
    import yaml

    from orchestrator.config import load_experiment
    from orchestrator.config.hosts import load_inventory
    from orchestrator.execution.backends import executor_for
    from orchestrator.execution.deployment import deployment_factory

    scenario = tmp / "scenario.yaml"
    scenario.write_text(SCENARIO, encoding="utf-8")
    env = {"ORCH_LAB_TIME_SCALE": "0.1", "PYTHONPATH": str(REPO)}
    hosts = {
        h: {
            "address": "localhost",
            "transport": "local",
            "service_manager": "process",
            "run_dir": str(tmp / f"run-{h}"),
            "env": env,
        }
        for h in HOSTS
    }
    (tmp / "hosts.yaml").write_text(yaml.safe_dump({"hosts": hosts}))
    inv = load_inventory(tmp / "hosts.yaml")
    out = []
    for case in CASES:
        init, p0, p1 = free_port(), free_port(), free_port()
        doc = {
            "name": f"bench-{case.failing}",
            "service": {
                "exec": f"{sys.executable} -m orchestrator.lab.server --scenario {scenario}",
                "flags": {
                    "tp-size": 2,
                    "nnodes": 2,
                    "dist-init-addr": f"127.0.0.1:{init}",
                    "dist-timeout": args.watchdog,
                    case.flag.removeprefix("--"): True,
                },
            },
            "roles": {
                "node0": {"kind": "node", "rank": 0, "flags": {"node-rank": 0, "port": p0}},
                "node1": {
                    "kind": "node",
                    "rank": 1,
                    "host": HOSTS[1],
                    "flags": {"node-rank": 1, "port": p1},
                },
            },
            "health": {"timeout": "60s", "settle": "0.1s"},
        }
        path = tmp / f"case-{case.failing}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        exp = load_experiment(path)
        make = deployment_factory(executor_for, exp, inv)
        with make(inv.host(HOSTS[0]), "bench", "bench", lambda e: None) as ex:
            for n in range(args.starts):
                began = time.monotonic()
                result = ex.run(exp, run_id=f"{case.failing}.{n}")
                sig = result.signature
                right_sig = (
                    sig is not None
                    and sig.error_class == case.error_class
                    and sig.phase.value == case.phase
                )
                ff = (result.host_record or {}).get("first_failure") or {}
                right_role = (
                    ff.get("role") == f"node{case.failing}"
                    and ff.get("host") == HOSTS[case.failing]
                )
                if args.details or not (right_sig and right_role):
                    print(f"  {case.name}: {result.verdict.value}: {result.detail}")
                out.append((case, right_sig, right_role, time.monotonic() - began))
    return out


def executor_table(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        got = executor_mode(args, Path(tmp))
    rows = [("case", "starts", "right signature", "right role", "s/start")]
    for case in (*CASES, None):
        mine = [g for g in got if case is None or g[0] is case]
        n = len(mine)
        rows.append(
            (
                case.name if case else "all",
                str(n),
                f"{sum(g[1] for g in mine)}/{n}",
                f"{sum(g[2] for g in mine)}/{n}",
                f"{sum(g[3] for g in mine) / max(n, 1):.1f}",
            )
        )
    print(
        f"two-rank lab deployments through DeploymentExecutor on two local hosts, watchdog "
        f"{args.watchdog:g} s"
    )
    print(_table(rows))
    return 0 if all(g[1] and g[2] for g in got) else 1


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--starts", type=int, default=12, help="deployments per case (default 12)")
    ap.add_argument("--watchdog", type=float, default=1.0, help="--dist-timeout, seconds")
    ap.add_argument("--clock-error", type=float, default=0.5, help="offset error, seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--details", action="store_true", help="print every answer")
    ap.add_argument(
        "--executor",
        action="store_true",
        help="run each start through DeploymentExecutor on two local hosts",
    )
    args = ap.parse_args()
    if args.starts < 1 or args.watchdog <= 0 or args.clock_error < 0:
        ap.error("--starts >= 1, --watchdog > 0 and --clock-error >= 0")
    if args.executor:
        return executor_table(args)
    rng = random.Random(args.seed)
    rows = [("case", "starts", "right signature", "right role", "earliest line", "s/start")]
    totals = [0, 0, 0, 0, 0.0]
    with tempfile.TemporaryDirectory() as tmp:
        scenario = Path(tmp) / "scenario.yaml"
        scenario.write_text(SCENARIO, encoding="utf-8")
        for case in CASES:
            sigs = roles = naives = 0
            began = time.monotonic()
            for _ in range(args.starts):
                logs = deploy(case, scenario, args.watchdog, rng)
                right_sig, right_role, naive, said = judge(case, logs, rng, args.clock_error)
                sigs += right_sig
                roles += right_role
                naives += naive
                if args.details or not (right_sig and right_role):
                    print(f"  {case.name}: {said}")
            spent = time.monotonic() - began
            rows.append(
                (
                    case.name,
                    str(args.starts),
                    f"{sigs}/{args.starts}",
                    f"{roles}/{args.starts}",
                    f"{naives}/{args.starts}",
                    f"{spent / args.starts:.1f}",
                )
            )
            for i, v in enumerate((args.starts, sigs, roles, naives, spent)):
                totals[i] += v
    n = int(totals[0])
    rows.append(
        (
            "all",
            str(n),
            f"{totals[1]}/{n}",
            f"{totals[2]}/{n}",
            f"{totals[3]}/{n}",
            f"{totals[4] / n:.1f}",
        )
    )
    print(
        f"two-rank lab deployments, watchdog {args.watchdog:g} s, host clocks +-1 day, "
        f"offsets measured to +-{args.clock_error:g} s, roles in random order"
    )
    print(_table(rows))
    return 0 if totals[1] == totals[2] == n else 1


if __name__ == "__main__":
    sys.exit(main())
