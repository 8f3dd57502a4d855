"""The runs a repair adds, per incident: a bisection with repair against one without.

Each incident is a pair whose variants die of a resource (out of memory below a memory
fraction, a KV cache too small below a cache space) on some subsets of the deltas, and
show the target failure on others. The campaigns are the real ones (`Bisection`:
planner, store, classifier) over the scripted host of the tests (tests/support/scripted.py);
only the host is scripted. Columns: the runs and the answer without repair
(`--no-repair`), the same with repair, the runs repair added, and the repaired starts
among them; then the runs of the same pair without its resource failure (the target's
own search) and what the repaired campaign took beyond it. A repair costs at most its
own extra starts: beyond the target's own search, a repaired campaign takes no more
runs than its repaired starts. Against `--no-repair` it may take more: without repair
the search chases the resource failure, often a smaller set than the target's.

    .venv/bin/python bench/repair.py
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.campaign.bisect import Bisection  # noqa: E402
from orchestrator.campaign.planning import make_plan  # noqa: E402
from orchestrator.campaign.records import BisectOptions  # noqa: E402
from orchestrator.store.store import Store  # noqa: E402
from tests.support.scripted import TARGET_ERROR, Faults, Oracle, Rule, factory, flag, host  # noqa: E402

MEM = "mem-fraction-static"
KV = "VLLM_CPU_KVCACHE_SPACE"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
TOO_SMALL = (
    "ValueError: To serve at least one request with the models's max seq len (8192), "
    "(0.25 GiB KV cache is needed, which is larger than the available KV cache "
    "memory (0.12 GiB). Try increasing `VLLM_CPU_KVCACHE_SPACE` or decreasing "
    "`max_model_len` when initializing the engine."
)
STEP_007 = {
    "moves": [
        {"flag": MEM, "step": 0.07, "max": 0.95, "when": [{"class": "cuda_oom", "way": "up"}]}
    ]
}


@dataclass(frozen=True)
class Incident:
    name: str
    n: int
    rules: list[Rule]
    expected: frozenset[int] | None  # the target's set; None: no right answer to compare
    bad_flags: dict[str, Any] | None = None
    env: dict[str, str] | None = None
    repair: dict[str, Any] | None = None


INCIDENTS = [
    Incident(
        "RTX PRO 6000 as lived (declared +0.07)",
        3,
        [
            Rule(frozenset({0}), "kv_cache", OOM, below=((MEM, 0.92),)),
            Rule(frozenset({0, 1}), "cuda_graph", TARGET_ERROR),
        ],
        frozenset({0, 1}),
        repair=STEP_007,
    ),
    Incident(
        "RTX PRO 6000, built-in ladder (+0.04)",
        3,
        [
            Rule(frozenset({0}), "kv_cache", OOM, below=((MEM, 0.92),)),
            Rule(frozenset({0, 1}), "cuda_graph", TARGET_ERROR),
        ],
        frozenset({0, 1}),
    ),
    Incident(
        "resource from another delta (6 deltas)",
        6,
        [
            Rule(frozenset({3}), "load_weights", OOM, below=((MEM, 0.9),)),
            Rule(frozenset({1, 4}), "cuda_graph", TARGET_ERROR),
        ],
        frozenset({1, 4}),
    ),
    Incident(
        "vLLM CPU: KV cache too small (4 deltas)",
        4,
        [
            Rule(frozenset({2}), "kv_cache", TOO_SMALL, below=((KV, 2),)),
            Rule(frozenset({0}), "cuda_graph", TARGET_ERROR),
        ],
        frozenset({0}),
        env={KV: "1"},
    ),
    Incident(
        "memory fraction is a delta (no move)",
        3,
        [
            Rule(frozenset({0}), "kv_cache", OOM, below=((MEM, 0.92),)),
            Rule(frozenset({0, 1}), "cuda_graph", TARGET_ERROR),
        ],
        None,
        bad_flags={MEM: 0.9},
    ),
    Incident(
        "no working window",
        2,
        [
            Rule(frozenset({0}), "load_weights", OOM, below=((MEM, 0.88),)),
            Rule(frozenset({0}), "warmup", OOM, above=((MEM, 0.88),)),
            Rule(frozenset({1}), "cuda_graph", TARGET_ERROR),
        ],
        None,
    ),
]


def write(root: Path, inc: Incident) -> tuple[Path, Path]:
    root.mkdir(parents=True, exist_ok=True)
    good: dict[str, Any] = {
        "name": "good",
        "service": {
            "unit": "scripted.service",
            "exec": "python3 -m sglang.launch_server",
            "flags": {"model-path": "/models/m", "tp-size": 8, MEM: 0.85, "port": 30000},
        },
        "health": {"path": "/health", "timeout": "60s", "ready_after": 2},
    }
    if inc.env:
        good["service"]["env"] = inc.env
    if inc.repair:
        good["repair"] = inc.repair
    bad = {
        "name": "bad",
        "extends": "good.yaml",
        "service": {"flags": {flag(i): True for i in range(inc.n)} | (inc.bad_flags or {})},
    }
    (root / "good.yaml").write_text(yaml.safe_dump(good))
    (root / "bad.yaml").write_text(yaml.safe_dump(bad))
    return root / "good.yaml", root / "bad.yaml"


def campaign(
    tmp: Path, inc: Incident, repair: bool, *, resource: bool = True, judge: bool = False
) -> tuple[int, str, int]:
    """(runs executed, the answer in words, repaired starts). `resource` False: the pair
    without its resource failure (the target's own search); `judge`: say whether the
    answer is the target's set."""
    good, bad = write(tmp / f"exp-{repair}-{resource}", inc)
    rules = inc.rules if resource else [r for r in inc.rules if not (r.below or r.above)]
    store = Store(tmp / f"results-{repair}-{resource}")
    try:
        out = Bisection(
            store,
            make_plan(good, bad),
            [host()],
            command="bench",
            options=BisectOptions(repair=repair),
            executor_factory=factory(Oracle(rules), Faults()),
        ).run()
        runs = store.runs(out.campaign_id)
    finally:
        store.close()
    said = " | ".join(" + ".join(c.flags) for c in out.culprits) or "none"
    if judge and inc.expected is not None:
        right = out.status == "found" and [frozenset(c.indices) for c in out.culprits] == [
            inc.expected
        ]
        said += " (right)" if right else " (WRONG)"
    return out.runs_executed, said, sum(1 for r in runs if r.repair)


def main() -> int:
    print(
        "| incident | without repair: runs, answer | with repair: runs, answer | "
        "added runs | repaired starts | the target alone: runs | with repair minus "
        "target alone |"
    )
    print("|---|---|---|---|---|---|---|")
    wrong = 0
    for inc in INCIDENTS:
        with tempfile.TemporaryDirectory(prefix="orch-bench-repair-") as d:
            plain, p_said, _ = campaign(Path(d), inc, False)
            fixed, f_said, starts = campaign(Path(d), inc, True, judge=True)
            alone, _, _ = campaign(Path(d), inc, True, resource=False)
        wrong += "WRONG" in f_said
        print(
            f"| {inc.name} | {plain}, {p_said} | {fixed}, {f_said} | {fixed - plain:+d} | "
            f"{starts} | {alone} | {fixed - alone:+d} |"
        )
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
