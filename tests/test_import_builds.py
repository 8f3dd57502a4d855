"""Importing the build: `docker run` / `podman run` unit lines (the image is the build,
the server's own argv its flags) and `source VENV/bin/activate` in launch scripts (the
virtualenv is the build), on recorded files under tests/data/units."""

from __future__ import annotations

from pathlib import Path

from orchestrator.config import builds
from orchestrator.config.importer import import_file, render_yaml, to_experiment_mapping
from orchestrator.config.loading import load_experiment

UNITS = Path(__file__).parent / "data" / "units"


def _loaded(spec: dict, tmp: Path):  # noqa: ANN202
    mapping = to_experiment_mapping(spec, name="imported")
    mapping["service"]["flags"].setdefault("port", 30000)
    p = tmp / "imported.yaml"
    p.write_text(render_yaml(mapping))
    return load_experiment(p)


def test_docker_run_unit_gives_the_image_as_build_and_the_servers_flags(tmp_path: Path) -> None:
    spec = import_file(UNITS / "sglang-docker.service")
    assert spec["build"] == "lmsysorg/sglang:v0.5.22-cu129"
    # the server's own flags, none of docker's (--gpus, --shm-size, -v, -e, --name, ...)
    assert spec["flags"] == {
        "model-path": "moonshotai/Kimi-K2-Instruct",
        "tp-size": 8,
        "ep-size": 8,
        "enable-nccl-nvls": True,
        "trust-remote-code": True,
        "host": "0.0.0.0",
        "port": 30000,
    }
    assert spec["exec"].startswith("/usr/bin/docker run --rm --name sglang-k2 --gpus all")
    assert spec["exec"].endswith("lmsysorg/sglang:v0.5.22-cu129 python3 -m sglang.launch_server")
    # env: is what the server in the container sees: its `-e NCCL_DEBUG=WARN`; the unit's
    # HF_HOME reaches docker itself (no -e hands it on), which is said, not moved
    assert spec["env"] == {"NCCL_DEBUG": "WARN"}
    assert "NCCL_DEBUG" not in spec["exec"] and "--env HF_TOKEN" in spec["exec"]
    assert any("HF_HOME reaches docker itself" in n for n in spec["notes"]), spec["notes"]
    exp = _loaded(spec, tmp_path)
    assert exp.build == "lmsysorg/sglang:v0.5.22-cu129"
    # another tag runs in place of the image, the rest of the line as it was
    other = builds.resolve(
        exp.__class__(**{**exp.__dict__, "build": "lmsysorg/sglang:v0.5.23"}), {}
    )
    cc = builds.container_split(other.exec)
    assert cc is not None and cc.image == "lmsysorg/sglang:v0.5.23"
    assert other.argv()[len(other.exec) :] == exp.argv()[len(exp.exec) :]


def test_podman_unit_whose_image_runs_the_server(tmp_path: Path) -> None:
    spec = import_file(UNITS / "vllm-podman.service")
    assert spec["build"] == "docker.io/vllm/vllm-openai:v0.11.0"
    assert spec["flags"] == {
        "model": "/models/Qwen3-8B",
        "tensor-parallel-size": 2,
        "max-num-seqs": 128,
        "port": 8000,
    }
    assert "--security-opt=label=disable" in spec["exec"] and "-p 8000:8000" in spec["exec"]
    assert _loaded(spec, tmp_path).build == "docker.io/vllm/vllm-openai:v0.11.0"


def test_launch_script_activating_a_venv(tmp_path: Path) -> None:
    spec = import_file(UNITS / "launch-venv.sh")
    assert spec["build"] == "/opt/sglang-0.5.23"
    assert spec["exec"] == "python -m sglang.launch_server"
    assert spec["flags"]["tp-size"] == 8 and spec["env"] == {"NCCL_DEBUG": "WARN"}
    exp = _loaded(spec, tmp_path)
    assert builds.resolve(exp, {}).exec[0] == "/opt/sglang-0.5.23/bin/python"


def test_activation_and_command_on_one_line() -> None:
    spec = import_file(UNITS / "launch-venv-oneline.sh")
    assert spec["build"] == "/srv/venvs/vllm-0.30.0"
    assert spec["exec"] == "vllm serve /models/tiny"
    assert spec["flags"] == {"max-model-len": 512, "port": 8000}


def test_a_plain_command_has_no_build(tmp_path: Path) -> None:
    p = tmp_path / "run.sh"
    p.write_text("python -m sglang.launch_server --tp-size 8 --port 30000\n")
    assert "build" not in import_file(p)
