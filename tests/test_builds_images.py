"""Image builds on a real container runtime: the lab's releases as podman images, their
command a `podman run` the process manager starts over OpenSSH's sshd.

`--packages` opens two images into the distributions that differ, copies the chosen ones
out of bad's image into an overlay the server's own `podman run` mounts first on its
path, and asks `pip check` inside good's image; `--builds` searches the images in order,
each run's image word replaced and the image's id and served release read back inside it.
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.planning import make_plan, with_order, with_packages
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.execution.executor import Executor
from orchestrator.lab import images
from orchestrator.lab.sshd import SshdEndpoint
from tests.support.campaign_lab import (
    PACKAGE_KINDS,
    PACKAGE_REFUSED,
    REPO,
    TIME_SCALE,
    bisect_in,
    lab_pair,
    lab_servers,
    load_host,
)

# one worker builds the images both tests use (podman builds each once)
pytestmark = [pytest.mark.sshd, pytest.mark.xdist_group("test_builds_images")]


@pytest.fixture
def label() -> Iterator[str]:
    """The label of this test's containers; none is left running after it."""
    name = f"t{uuid.uuid4().hex[:10]}"
    yield name
    images.remove_labelled(name)


def _image(version: str, **kwargs: object) -> str:
    try:
        return images.image(version, **kwargs)  # type: ignore[arg-type]
    except images.ImagesUnavailable as exc:  # scripts/bootstrap installs podman and runc
        pytest.fail(f"the lab's images cannot be built here: {exc}")


def _left_running(label: str) -> list[str]:
    """The ids of this test's containers still there."""
    return images.podman("ps", "-aq", "--filter", f"label=orchestrator-lab={label}").split()


def _hosts(sshd: SshdEndpoint, tmp: Path, builds: dict[str, str]) -> Path:
    path = tmp / "hosts.yaml"
    path.write_text(
        sshd.hosts_yaml(
            "lab",
            run_dir=str(tmp / "run"),
            builds=builds,
            env={"ORCH_LAB_TIME_SCALE": TIME_SCALE, **images.env()},
        )
    )
    return path


def _pair(tmp: Path, label: str, good: str, bad: str, *, nvls_both: bool):  # noqa: ANN202
    """The lab's releases pair, its command a `podman run` of the first build's image."""
    pair = lab_pair(tmp, "releases")
    words = images.run_command(
        "IMAGE", repo=str(REPO), scenario="releases", time_scale=TIME_SCALE, label=label
    )
    for path, build in ((pair.good, good), (pair.bad, bad)):
        data = yaml.safe_load(path.read_text())
        data["service"]["exec"] = shlex.join(words)
        data["service"]["build"] = build
        if nvls_both:
            data["service"]["flags"]["enable-nccl-nvls"] = True
        path.write_text(yaml.safe_dump(data))
    return pair


def test_packages_of_two_images(sshd: SshdEndpoint, tmp_path: Path, label: str) -> None:
    tags = {v: _image(v, extra=extra) for v, extra in PACKAGE_KINDS.items()}
    hosts = _hosts(sshd, tmp_path, tags)
    pair = _pair(tmp_path, label, "0.5.22", "0.5.23rc1", nvls_both=True)
    plan = make_plan(pair.good, pair.bad)
    host = load_host(hosts, "lab")
    ex = Executor(host, service="lab-releases.service")
    try:  # read inside each image by its own python3
        got = {"good": ex.packages_of(plan.good), "bad": ex.packages_of(plan.bad)}
    finally:
        ex.close(restore=False)
    assert got["good"]["orchestrator-lab-server"] == "0.5.22"
    assert got["bad"]["orchestrator-lab-server"] == "0.5.23rc1"
    assert got["bad"]["lab-tokenizer"] == "1.1" and got["good"]["lab-kernel"] == "0.1.0"
    plan = with_packages(plan, got["good"], got["bad"])
    assert [d.key for d in plan.deltas if d.kind == "package"] == [
        "lab-kernel",
        "lab-tokenizer",
        "orchestrator-lab-server",
    ]
    done = bisect_in(tmp_path / "results", plan, [host], packages=got)
    outcome, runs, served = done.outcome, done.runs, done.envs
    answer = outcome.to_dict()
    assert outcome.found, answer
    named = [sorted(c["deltas"]) for c in answer["culprits"]]
    assert named == [["~ package orchestrator-lab-server 0.5.22 -> 0.5.23rc1"]], named
    # good's image with the new tokenizer alone: pip check inside the image refuses it
    tok = next(i for i, d in enumerate(plan.deltas) if d.key == "lab-tokenizer")
    with Executor(host, service="lab-releases.service", campaign="t") as ex:
        alone = ex.run(plan.variant(frozenset({tok})), run_id="t.1")
    assert alone.verdict is Verdict.INVALID and PACKAGE_REFUSED in alone.detail, alone.detail
    assert all(PACKAGE_REFUSED in r.detail for r in runs if r.verdict is Verdict.INVALID)
    started = [r for r in runs if r.verdict is not Verdict.INVALID]
    assert started and any(r.experiment().packages for r in started)
    for r in started:
        exp = r.experiment()
        assert exp.build == "0.5.22"  # every run is good's image ...
        assert tags["0.5.22"] in (r.rendered or ""), r.rendered
        env = served[r.id]
        assert env is not None and env.image == tags["0.5.22"] and env.image_id
        moved = dict(exp.packages)
        if not moved:
            assert env.server_version == "0.5.22"
            continue
        # ... with the chosen packages of bad's mounted first on the container's path
        overlay = next(w for w in shlex.split(r.rendered or "") if "/overlays/" in w)
        site = overlay.split(":", 1)[0]
        assert f"{site}:{site}:ro" in (r.rendered or "")
        assert f"PYTHONPATH={site}:{images.REPO_IN_IMAGE}" in (r.rendered or "")
        # and the release read back inside the image is the one the overlay brought
        want = moved.get("orchestrator-lab-server", "0.5.22")
        assert env.server_version == want, (exp.packages, env.server_version)
    assert lab_servers(pair.port) == []
    assert _left_running(label) == []


def test_bisect_the_images_in_order(sshd: SshdEndpoint, tmp_path: Path, label: str) -> None:
    """`--builds` over five images: the first bad release together with the flag."""
    from orchestrator.lab.scenario import load as load_scenario

    releases = load_scenario("releases").versions
    tags = {v: _image(v) for v in releases}
    hosts = _hosts(sshd, tmp_path, tags)
    pair = _pair(tmp_path, label, releases[0], releases[-1], nvls_both=False)
    plan = with_order(make_plan(pair.good, pair.bad), releases[1:-1])
    done = bisect_in(tmp_path / "results", plan, [load_host(hosts, "lab")], builds=plan.order)
    outcome, runs, envs = done.outcome, done.runs, done.envs
    answer = outcome.to_dict()
    assert outcome.found, answer
    [cul] = answer["culprits"]
    assert sorted(cul["deltas"]) == ["+ --enable-nccl-nvls", "~ build 0.5.22 -> 0.5.23rc1"], cul
    for r in runs:  # each run's image, its id and the release served inside it
        build = r.experiment().build
        env = envs[r.id]
        assert tags[build] in (r.rendered or "")
        assert env is not None and env.image == tags[build] and env.image_id
        assert env.server_version == build
    assert _left_running(label) == []


def test_a_tag_that_names_another_release_is_infra(
    sshd: SshdEndpoint, tmp_path: Path, label: str
) -> None:
    """An image tagged 0.5.23 that holds 0.5.22: the release read inside it is not the
    one its name states, and the run says nothing about the config."""
    wrong = _image("0.5.22", tag=f"{images.NAME}:0.5.23-mislabelled")
    hosts = _hosts(sshd, tmp_path, {"0.5.23": wrong})
    pair = _pair(tmp_path, label, "0.5.23", "0.5.23", nvls_both=False)
    plan = make_plan(pair.good, pair.bad)
    with Executor(load_host(hosts, "lab"), service="lab-releases.service", campaign="t") as ex:
        r = ex.run(plan.good, run_id="t.1")
    assert r.verdict is Verdict.INFRA, (r.verdict, r.detail)
    assert f"build '0.5.23' ({wrong}) serves" in r.detail and "0.5.22, not 0.5.23" in r.detail
    assert r.environment is not None and r.environment.image_id
    assert _left_running(label) == []
