"""A container's server sees only what the runtime hands it: a config's `env:` goes into
the container with `-e NAME` (its value in the runtime's own environment, from the drop-in
or the launch script, never on the command line), and runs from before that (whose
variables never reached the server) are no cache for it. The real podman run is in
test_containers_podman.py."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.config.builds import container_split
from orchestrator.config.loading import load_experiment
from orchestrator.execution.executor import Executor
from tests.support.scripted_transport import FakeClock, ScriptedTransport, Server, host

IMAGE = "lmsysorg/sglang:v0.5.22"


def _config(path: Path, exec_line: str, env: dict | None) -> Path:
    service: dict = {"exec": exec_line, "flags": {"port": 30000}}
    if env is not None:
        service["env"] = env
    path.write_text(yaml.safe_dump({"name": path.stem, "service": service}))
    return path


def _executor() -> Executor:
    h = host()
    return Executor(h, service="sglang", transport=ScriptedTransport(h, FakeClock(), [Server()]))


def test_the_launch_hands_env_to_the_container_by_name(tmp_path: Path) -> None:
    line = f"podman run --rm -e A=image -- {IMAGE} python3 -m sglang.launch_server"
    exp = load_experiment(_config(tmp_path / "c.yaml", line, {"A": "1", "HF_TOKEN": "hf_x"}))
    launch = _executor().launch_of(exp)
    cc = container_split(launch.exec)
    assert cc is not None and cc.image == IMAGE
    # after the command's own -e (the config's value wins), never the value on argv
    assert list(cc.options) == [
        *("--rm", "-e", "A=image", "-e", "A", "-e", "HF_TOKEN"),
        *("--label", "orchestrator.service=sglang", "--"),  # to stop and remove it after
    ]
    assert "hf_x" not in " ".join(launch.argv())
    assert launch.env_map() == {"A": "1", "HF_TOKEN": "hf_x"}  # for the runtime's environment


def test_a_plain_command_is_unchanged_and_a_container_without_env_only_labelled(
    tmp_path: Path,
) -> None:
    plain = load_experiment(_config(tmp_path / "p.yaml", "python3 -m x", {"A": "1"}))
    assert _executor().launch_of(plain).exec == plain.exec
    bare = load_experiment(_config(tmp_path / "b.yaml", f"docker run --rm {IMAGE}", None))
    assert _executor().launch_of(bare).exec == (
        *("docker", "run", "--rm", "--label", "orchestrator.service=sglang"),
        IMAGE,
    )


def test_runs_from_before_env_reached_the_container_are_another_key(tmp_path: Path) -> None:
    line = f"docker run --rm {IMAGE} python3 -m x"
    exp = load_experiment(_config(tmp_path / "c.yaml", line, {"A": "1"}))
    assert exp.to_dict()["service"]["env"] == {"A": "1"}
    # the key of a launch that hands A over is not the one it had when A stayed outside
    import hashlib
    import json

    h = exp.health
    old = {
        "exec": list(exp.exec),
        "flags": [["port", 30000]],
        "env": [["A", "1"]],
        "unit": None,
        "workdir": None,
        "health": [h.path, h.port, h.timeout, h.ready_after, h.interval],
        "probe": None,
    }
    blob = json.dumps(old, sort_keys=True, separators=(",", ":"))
    assert exp.fingerprint() != hashlib.sha256(blob.encode()).hexdigest()[:16]
    plain = load_experiment(_config(tmp_path / "p.yaml", "python3 -m x", {"A": "1"}))
    old["exec"] = list(plain.exec)
    blob = json.dumps(old, sort_keys=True, separators=(",", ":"))
    assert plain.fingerprint() == hashlib.sha256(blob.encode()).hexdigest()[:16]


def test_a_recorded_detached_container_still_loads_but_never_runs(tmp_path: Path) -> None:
    """A run recorded before `-d` was refused still shows; running it again is refused."""
    import pytest

    from orchestrator.config.experiment import Experiment
    from orchestrator.errors import ConfigError

    data = {
        "name": "old",
        "service": {"exec": f"docker run -d {IMAGE} python3 -m x", "flags": {"port": 30000}},
    }
    exp = Experiment.from_dict(data)
    with pytest.raises(ConfigError) as e:
        _executor().launch_of(exp)
    assert "-d detaches" in str(e.value) and e.value.key == "service.exec"
