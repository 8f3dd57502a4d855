"""`orchestrator import`: unit files, scripts and command lines, and their round trips."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.cli import main
from orchestrator.config import load_experiment
from orchestrator.config.importer import (
    import_command_line,
    import_file,
    import_unit_file,
    render_command,
    render_yaml,
    to_experiment_mapping,
)
from orchestrator.errors import ConfigError

UNIT = """\
[Unit]
Description=SGLang Kimi
After=network-online.target

[Service]
User=sglang
Environment=NCCL_DEBUG=WARN "HF_HOME=/data/hf cache"
Environment=CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
ExecStart=/opt/sglang/bin/python -m sglang.launch_server \\
    --model-path /models/Kimi-K2.6 --tp-size 8 \\
    --mem-fraction-static=0.92 --enable-nccl-nvls --port 30000
Restart=always

[Install]
WantedBy=multi-user.target
"""

SCRIPT = """\
#!/usr/bin/env bash
# launch_ep8.sh
set -e
export NCCL_DEBUG=INFO
cd /opt/sglang
SGLANG_TORCH_PROFILER_DIR=/tmp/prof python -m sglang.launch_server \\
  --model-path "/models/GLM 5" \\
  --tp-size 8 --ep-size 8 \\
  --max-running-requests 256 \\
  --cuda-graph-bs 1 2 4 8 \\
  --chat-template='{{ x }}' \\
  --port 8000   # the port we actually use
"""


def test_unit_file(tmp_path: Path) -> None:
    spec = import_unit_file(UNIT, source=str(tmp_path / "sglang-k26.service"))
    assert spec["exec"] == "/opt/sglang/bin/python -m sglang.launch_server"
    assert spec["flags"] == {
        "model-path": "/models/Kimi-K2.6",
        "tp-size": 8,
        "mem-fraction-static": 0.92,
        "enable-nccl-nvls": True,
        "port": 30000,
    }
    assert spec["env"] == {
        "NCCL_DEBUG": "WARN",
        "HF_HOME": "/data/hf cache",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
    }
    assert spec["unit"] == "sglang-k26.service"


def test_launch_script() -> None:
    spec = import_command_line(SCRIPT)
    assert spec["exec"] == "python -m sglang.launch_server"
    assert spec["flags"]["model-path"] == "/models/GLM 5"
    assert spec["flags"]["cuda-graph-bs"] == [1, 2, 4, 8]
    assert spec["flags"]["chat-template"] == "{{ x }}"
    assert spec["flags"]["port"] == 8000
    assert spec["env"] == {"NCCL_DEBUG": "INFO", "SGLANG_TORCH_PROFILER_DIR": "/tmp/prof"}


def test_values_keep_text_that_would_not_print_back() -> None:
    spec = import_command_line("python -m x --a 08 --b 0.90 --c 1e3 --d 0.9 --e -1 --port 1")
    assert spec["flags"] == {"a": "08", "b": "0.90", "c": "1e3", "d": 0.9, "e": -1, "port": 1}


def test_round_trip_import_render_import(tmp_path: Path) -> None:
    for spec in (import_command_line(SCRIPT), import_unit_file(UNIT, source="u.service")):
        again = import_command_line(render_command(spec))
        assert again["exec"] == spec["exec"]
        assert again["flags"] == spec["flags"]
        assert again["env"] == spec["env"]


def test_rendered_yaml_loads_as_the_same_launch(tmp_path: Path) -> None:
    spec = import_command_line(SCRIPT)
    path = tmp_path / "glm.yaml"
    path.write_text(render_yaml(to_experiment_mapping(spec, name="glm")))
    exp = load_experiment(path)
    assert exp.argv()[:3] == ["python", "-m", "sglang.launch_server"]
    assert import_command_line(exp.command_line())["flags"] == spec["flags"]
    assert exp.env_map() == spec["env"]


_word = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12
).filter(lambda s: not s.startswith("-") and s.strip() == s and "\\" not in s)


@settings(max_examples=200, deadline=None)
@given(
    flags=st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True),
        st.one_of(st.just(True), st.integers(-5, 10**6), _word),
        max_size=6,
    )
)
def test_round_trip_property(flags: dict[str, object]) -> None:
    spec = {"exec": "python -m sglang.launch_server", "flags": flags, "env": {}}
    again = import_command_line(render_command(spec))
    expected = {k: (v if not isinstance(v, str) else again["flags"][k]) for k, v in flags.items()}
    assert again["flags"] == expected
    for k, v in flags.items():
        if isinstance(v, str):  # a string that looks like a number is typed back as one
            assert str(again["flags"][k]) == v


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "no launch command"),
        ("set -e\ncd /opt\n", "no launch command"),
        ("echo hello\n", "no launch command"),
        ("python -m x --a 'unclosed\n", "cannot parse"),
        ("python -m x --a 1 --a 2", "given twice"),
    ],
)
def test_bad_scripts(text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        import_command_line(text, source="launch.sh")


def test_unit_without_execstart(tmp_path: Path) -> None:
    p = tmp_path / "x.service"
    p.write_text("[Service]\nUser=x\n")
    with pytest.raises(ConfigError, match="no ExecStart") as err:
        import_file(p)
    assert str(p) in str(err.value)


def test_cli_import_unit_and_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unit = tmp_path / "sglang-k26.service"
    unit.write_text(UNIT)
    assert main(["import", str(unit)]) == 0
    data = yaml.safe_load(capsys.readouterr().out)
    assert data["name"] == "sglang-k26" and data["service"]["unit"] == "sglang-k26.service"
    out = tmp_path / "cmd.yaml"
    rc = main(
        ["import", "--name", "cmd", "-o", str(out), "--", "A=1", "python", "-m", "x", "--y", "2"]
    )
    assert rc == 0
    assert "no --port" in capsys.readouterr().err
    assert yaml.safe_load(out.read_text())["service"] == {
        "exec": "python -m x",
        "flags": {"y": 2},
        "env": {"A": "1"},
    }
    assert main(["import", str(tmp_path / "missing.sh")]) == 2
    assert "missing.sh" in capsys.readouterr().err
