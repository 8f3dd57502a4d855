"""Importing container units and command lines: the runtime's options read as docker and
podman read them (an option that takes a value never gives the image's place to its value;
one neither lists is refused, never guessed), what the image runs first (`--entrypoint`,
the entry point of vLLM's image), `-d`, `nvidia-docker`, a unit with two `ExecStart=`, and
where the variables go (env: is what the server inside the container sees)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from orchestrator.campaign.planning import make_plan
from orchestrator.config.builds import container_split
from orchestrator.config.importer import (
    import_command_line,
    import_unit_file,
    render_yaml,
    to_experiment_mapping,
)
from orchestrator.config.loading import load_experiment
from orchestrator.errors import ConfigError

SERVER = "python3 -m sglang.launch_server --model-path /m --tp-size 8 --port 30000"
IMAGE = "lmsysorg/sglang:v0.5.22"


def _unit(exec_start: str, *extra: str) -> str:
    return "[Service]\n" + "".join(f"{e}\n" for e in extra) + f"ExecStart={exec_start}\n"


def _write(spec: dict, path: Path) -> Path:
    mapping = to_experiment_mapping(spec, name=path.stem)
    path.write_text(render_yaml(mapping))
    return path


@pytest.mark.parametrize(
    "options",
    [
        "--health-start-interval 5s",
        "--health-on-failure kill",
        "--env-merge A=/x",
        "--detach-keys ctrl-x",
        "--cpu-count 4",
        "--health-startup-cmd true --health-log-destination /tmp/h",
        "-p8000:8000 -it --shm-size 16g",
    ],
)
def test_a_value_option_never_takes_the_images_place(options: str) -> None:
    spec = import_unit_file(_unit(f"podman run --rm {options} {IMAGE} {SERVER}"), source="u")
    assert spec["build"] == IMAGE, spec
    assert spec["flags"] == {"model-path": "/m", "tp-size": 8, "port": 30000}
    assert spec["exec"].endswith(f"{IMAGE} python3 -m sglang.launch_server")


def test_an_option_neither_runtime_lists_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError) as e:
        import_unit_file(_unit(f"docker run --frobnicate 5s {IMAGE} {SERVER}"), source="u")
    assert "--frobnicate" in str(e.value) and "--frobnicate=VALUE" in str(e.value)
    # written with its value attached it is unambiguous
    spec = import_unit_file(_unit(f"docker run --frobnicate=5s {IMAGE} {SERVER}"), source="u")
    assert spec["build"] == IMAGE


def test_a_config_whose_container_command_has_such_an_option_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(
        f"service:\n  exec: docker run --frobnicate 5s {IMAGE} python3 -m x\n"
        "  flags: {port: 30000}\n"
    )
    with pytest.raises(ConfigError) as e:
        load_experiment(path)
    assert e.value.key == "service.exec" and "--frobnicate" in str(e.value)


def test_entrypoint_python3_reads_the_module_as_the_command() -> None:
    line = f"docker run --rm --entrypoint python3 {IMAGE} -m sglang.launch_server --tp-size 8"
    spec = import_command_line(line + " --port 30000")
    assert spec["exec"].endswith(f"--entrypoint python3 {IMAGE} -m sglang.launch_server")
    assert spec["flags"] == {"tp-size": 8, "port": 30000}, spec["flags"]


@pytest.mark.parametrize(
    "args",
    ["--model /models/q -tp 8 --port 8000", "/models/q -tp 8 --port 8000"],
)
def test_vllm_image_runs_vllm_serve_so_its_short_options_are_vllms(args: str) -> None:
    spec = import_unit_file(
        _unit(f"docker run --gpus all docker.io/vllm/vllm-openai:v0.11.0 {args}"), source="u"
    )
    assert spec["flags"]["tensor-parallel-size"] == 8, spec["flags"]
    assert "-tp" not in spec["flags"]


def test_vllm_image_config_reads_tp_as_its_long_option(tmp_path: Path) -> None:
    path = tmp_path / "v.yaml"
    path.write_text(
        "service:\n  exec: docker run --rm vllm/vllm-openai:latest\n  flags: {-tp: 8, port: 8000}\n"
    )
    assert dict(load_experiment(path).flags) == {"tensor-parallel-size": 8, "port": 8000}


def test_two_imported_images_differ_by_their_build_alone(tmp_path: Path) -> None:
    good = import_unit_file(_unit(f"docker run --rm {IMAGE} {SERVER}"), source="sglang.service")
    bad = import_unit_file(
        _unit(f"docker run --rm lmsysorg/sglang:v0.5.23 {SERVER} --enable-nccl-nvls"),
        source="sglang.service",
    )
    plan = make_plan(_write(good, tmp_path / "good.yaml"), _write(bad, tmp_path / "bad.yaml"))
    assert sorted(d.kind for d in plan.deltas) == ["build", "flag"], [d.label for d in plan.deltas]


def test_nvidia_docker_run_is_a_container_command() -> None:
    spec = import_unit_file(_unit(f"/usr/bin/nvidia-docker run --rm {IMAGE} {SERVER}"), source="u")
    assert spec["build"] == IMAGE and spec["flags"]["tp-size"] == 8


def test_a_unit_with_two_execstart_lines_is_refused() -> None:
    text = _unit("python3 -m x --port 1", f"ExecStart=/usr/bin/{SERVER}")
    with pytest.raises(ConfigError) as e:
        import_unit_file(text, source="two.service")
    assert "2 ExecStart= commands" in str(e.value)
    # an empty ExecStart= resets the list, as systemd reads it: one command is left
    spec = import_unit_file(_unit(SERVER, "ExecStart=python3 -m x", "ExecStart="), source="u")
    assert spec["flags"]["tp-size"] == 8


@pytest.mark.parametrize(
    ("given", "kept"), [("-d", ""), ("--detach", ""), ("-dit", "-it"), ("-dp 80:80", "-p 80:80")]
)
def test_docker_run_d_is_dropped_on_import_and_said(given: str, kept: str) -> None:
    spec = import_unit_file(_unit(f"docker run {given} --rm {IMAGE} {SERVER}"), source="u")
    cc = container_split(shlex.split(spec["exec"]))
    assert cc is not None and not cc.detached()
    assert list(cc.options) == [*kept.split(), "--rm"]
    assert any("-d is dropped" in n for n in spec["notes"])


def test_a_config_that_runs_a_detached_container_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    path.write_text(f"service:\n  exec: podman run -d {IMAGE} python3 -m x\n  flags: {{port: 1}}\n")
    with pytest.raises(ConfigError) as e:
        load_experiment(path)
    assert e.value.key == "service.exec" and "-d detaches" in str(e.value)


def test_a_docker_units_environment_reaches_docker_not_the_server() -> None:
    text = _unit(
        f"docker run --rm -e NCCL_DEBUG=INFO --env HF_TOKEN -e NCCL_ALGO {IMAGE} {SERVER}",
        "Environment=DOCKER_HOST=unix:///run/d.sock NCCL_ALGO=Tree",
    )
    spec = import_unit_file(text, source="u")
    # the container's own variables, as its server sees them
    assert spec["env"] == {"NCCL_DEBUG": "INFO", "NCCL_ALGO": "Tree"}
    # HF_TOKEN comes from an environment the import cannot see: left as written
    assert "--env HF_TOKEN" in spec["exec"] and "NCCL" not in spec["exec"]
    assert any("DOCKER_HOST reaches docker itself" in n for n in spec["notes"]), spec["notes"]


def test_a_command_lines_runtime_variable_stays_before_the_runtime() -> None:
    spec = import_command_line(f"CONTAINERS_CONF=/etc/c.conf podman run --rm {IMAGE} {SERVER}")
    assert spec["env"] == {}
    assert spec["exec"].startswith("env CONTAINERS_CONF=/etc/c.conf podman run --rm ")


def test_a_rendered_container_command_imports_back_the_same() -> None:
    from orchestrator.config.importer import render_command

    text = _unit(f"docker run --rm -e NCCL_DEBUG=INFO {IMAGE} {SERVER}", "Environment=HF_HOME=/h")
    spec = import_unit_file(text, source="u")
    again = import_command_line(render_command(spec))
    assert {k: again[k] for k in ("exec", "flags", "env", "build")} == {
        k: spec[k] for k in ("exec", "flags", "env", "build")
    }


@pytest.mark.parametrize(
    "runtime",
    [
        "sudo -u svc -E docker",
        "docker --context gpu",
        "/usr/bin/docker -H unix:///run/d.sock",
        "podman --root=/srv/c --log-level warn",
    ],
)
def test_sudos_and_the_runtimes_own_options_before_run(tmp_path: Path, runtime: str) -> None:
    """A container command still, so env: goes into the container and builds apply."""
    spec = import_unit_file(_unit(f"{runtime} run --rm {IMAGE} {SERVER}"), source="u")
    assert spec["build"] == IMAGE and spec["flags"]["tp-size"] == 8
    cc = container_split(shlex.split(spec["exec"]))
    assert cc is not None and list(cc.runtime) == [*runtime.split(), "run"]
