"""Containers on a real runtime: the lab server in a podman image, its command a `podman
run` the process manager starts over OpenSSH's sshd.

- `env:` reaches the server inside the container (a scenario whose fault needs the
  variable fails with it, and only with it);
- a container whose runtime keeps it running after its command is stopped (podman with
  `--sig-proxy=false`, as docker's daemon does for every container) is stopped and removed
  after the run: the next run on the same port starts;
- `hosts check` lists, and `restore` removes, a container and the package overlays a
  controller that is gone left behind.
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.execution.executor import Executor
from orchestrator.execution.hostops import check_host, restore_host
from orchestrator.execution.transport import connect
from orchestrator.lab import images
from orchestrator.lab.sshd import SshdEndpoint, free_port
from tests.support.campaign_lab import REPO, TIME_SCALE, load_host

# the image is built once, by the worker of test_builds_images.py's group
pytestmark = [pytest.mark.sshd, pytest.mark.xdist_group("test_builds_images")]

SCENARIO = """\
name: env-in-container
startup: {init: 0.1, load_weights: 0.2, kv_cache: 0.1, cuda_graph: 0.1, warmup: 0.1}
known_flags: sglang
faults:
  - when: {env: {LAB_FAULT: "1"}}
    phase: init
    error: "RuntimeError: the variable reached the server"
"""


@pytest.fixture
def label() -> Iterator[str]:
    name = f"t{uuid.uuid4().hex[:10]}"
    yield name
    images.remove_labelled(name)


def _image() -> str:
    try:
        return images.image("0.5.22")
    except images.ImagesUnavailable as exc:  # scripts/bootstrap installs podman and runc
        pytest.fail(f"the lab's images cannot be built here: {exc}")


def _hosts(sshd: SshdEndpoint, tmp: Path) -> Path:
    path = tmp / "hosts.yaml"
    path.write_text(
        sshd.hosts_yaml(
            "lab",
            run_dir=str(tmp / "run"),
            env={"ORCH_LAB_TIME_SCALE": TIME_SCALE, **images.env()},
        )
    )
    return path


def _config(tmp: Path, label: str, *, env: dict | None, options: tuple[str, ...] = ()) -> Path:
    scenario = tmp / "scenario.yaml"
    scenario.write_text(SCENARIO)
    words = images.run_command(
        _image(), repo=str(REPO), scenario=str(scenario), time_scale=TIME_SCALE, label=label
    )
    at = words.index("--label")
    words[at:at] = ["-v", f"{tmp}:{tmp}:ro", *options]
    port = free_port()
    path = tmp / f"c{port}.yaml"
    service: dict = {
        "exec": shlex.join(words),
        "flags": {"model-path": "/models/m", "tp-size": 8, "port": port},
    }
    if env is not None:
        service["env"] = env
    path.write_text(
        yaml.safe_dump(
            {"name": "in-podman", "service": service, "health": {"timeout": 60, "settle": 0.1}}
        )
    )
    return path


def _running(label: str) -> list[str]:
    return images.podman("ps", "-aq", "--filter", f"label=orchestrator-lab={label}").split()


def test_env_reaches_the_server_inside_the_container(
    sshd: SshdEndpoint, tmp_path: Path, label: str
) -> None:
    host = load_host(_hosts(sshd, tmp_path), "lab")
    with_var = load_experiment(_config(tmp_path, label, env={"LAB_FAULT": "1"}))
    without = load_experiment(_config(tmp_path, label, env={"LAB_FAULT": "0"}))
    with Executor(host, service="in-podman", campaign="t") as ex:
        failed = ex.run(with_var, run_id="t.1")
        passed = ex.run(without, run_id="t.2")
    assert failed.verdict is Verdict.FAIL, (failed.verdict, failed.detail, failed.log_tail[-600:])
    assert failed.signature is not None and "reached the server" in failed.signature.message
    assert "-e LAB_FAULT" in (failed.rendered or "")
    assert passed.verdict is Verdict.PASS, (passed.verdict, passed.detail)
    assert _running(label) == []


def test_a_container_left_running_by_its_runtime_is_removed_after_the_run(
    sshd: SshdEndpoint, tmp_path: Path, label: str
) -> None:
    """`--sig-proxy=false`: stopping `podman run` leaves its container serving, as docker's
    daemon does; the run stops and removes it, and the next start on the port works."""
    host = load_host(_hosts(sshd, tmp_path), "lab")
    exp = load_experiment(_config(tmp_path, label, env=None, options=("--sig-proxy=false",)))
    with Executor(host, service="in-podman", campaign="t") as ex:
        first = ex.run(exp, run_id="t.1")
        between = _running(label)
        second = ex.run(exp, run_id="t.2")
    assert first.verdict is Verdict.PASS, (first.verdict, first.detail)
    assert between == [], "the container outlived its run"
    assert second.verdict is Verdict.PASS, (second.verdict, second.detail)
    assert ex.left == [] and _running(label) == []


def test_check_and_restore_see_a_gone_campaigns_container_and_overlays(
    sshd: SshdEndpoint, tmp_path: Path, label: str
) -> None:
    host = load_host(_hosts(sshd, tmp_path), "lab")
    # what a controller killed mid-run leaves: its labelled container, its overlays
    labels = [
        "--label",
        f"orchestrator-lab={label}",
        "--label",
        "orchestrator.service=gone.service",
    ]
    images.podman("run", "-d", *labels, _image(), "sleep", "300")
    overlay = tmp_path / "run" / "overlays" / "gone.service" / "0123456789abcdef"
    overlay.mkdir(parents=True)
    (overlay / "big.bin").write_bytes(b"x" * 1024)
    t = connect(host)
    try:
        checks = {c.name: c for c in check_host(host, t)}
        done = restore_host(host, t)
        after = {c.name: c for c in check_host(host, t)}
    finally:
        t.close()
    left = checks["leftovers"]
    assert left.ok is False and "gone.service" in left.detail, left.detail
    assert "container" in left.detail and "package overlays" in left.detail, left.detail
    assert any(d.startswith("stopped and removed container") for d in done), done
    assert any("removed the package overlays" in d for d in done), done
    assert after["leftovers"].ok, after["leftovers"].detail
    assert _running(label) == [] and not overlay.parent.exists()
