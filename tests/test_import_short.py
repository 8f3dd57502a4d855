"""Short options in imports and configs, read as the server's parser reads them (issue 35).

`import -- vllm serve /m --max-num-seqs 64 -tp 8 --port 8000` used to write
`max-num-seqs: [64, -tp, 8]`: two imports differing in `-tp` bisected to
`--max-num-seqs`, and with `-tp` after `--port` the tool refused its own output. The
table of vLLM's short options is checked against what the real vLLM 0.33 parser
registered (tests/data/help/vllm-0.33.0-serve.accepts.json).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.config.experiment import Experiment
from orchestrator.config.importer import import_command_line, render_yaml, to_experiment_mapping
from orchestrator.config.loading import load_experiment
from orchestrator.config.shortopts import VLLM, is_option
from orchestrator.errors import ConfigError, PlanError
from orchestrator.execution.preflight import follow, read_help, respell
from orchestrator.planner.deltas import check_differ, diff

HELP = Path(__file__).parent / "data" / "help"


def _load(tmp_path: Path, line: str, name: str) -> Experiment:
    spec = import_command_line(line)
    path = tmp_path / f"{name}.yaml"
    path.write_text(render_yaml(to_experiment_mapping(spec, name=name)))
    return load_experiment(path)


def test_a_short_option_is_its_long_option_not_the_previous_flags_value() -> None:
    spec = import_command_line("vllm serve /m --max-num-seqs 64 -tp 8 --port 8000")
    assert spec["exec"] == "vllm serve /m"
    assert spec["flags"] == {"max-num-seqs": 64, "tensor-parallel-size": 8, "port": 8000}


def test_a_short_option_after_the_port_loads(tmp_path: Path) -> None:
    exp = _load(tmp_path, "vllm serve /m --max-num-seqs 64 --port 8000 -tp 8", "after")
    assert exp.port == 8000
    assert exp.flag_map()["tensor-parallel-size"] == 8


def test_two_imports_differing_in_tp_differ_in_tp_only(tmp_path: Path) -> None:
    good = _load(tmp_path, "vllm serve /m --max-num-seqs 64 -tp 4 --port 8000", "good")
    bad = _load(tmp_path, "vllm serve /m --max-num-seqs 64 -tp 8 --port 8000", "bad")
    assert [(d.key, d.old, d.new) for d in diff(good, bad)] == [("tensor-parallel-size", 4, 8)]


def test_short_and_long_spellings_are_one_option(tmp_path: Path) -> None:
    short = _load(tmp_path, "vllm serve /m -tp 8 -pp=2 --port 8000", "short")
    long = _load(
        tmp_path,
        "vllm serve /m --tensor-parallel-size 8 --pipeline-parallel-size 2 --port 8000",
        "long",
    )
    assert diff(short, long) == []
    with pytest.raises(PlanError, match="launch the same server"):
        check_differ(diff(short, long), short, long)


@pytest.mark.parametrize("words", ["-O3", "-O=3", "-O 3"])
def test_vllm_optimization_level_spellings(words: str) -> None:
    spec = import_command_line(f"vllm serve /m {words} --port 1")
    assert spec["flags"] == {"optimization-level": 3, "port": 1}


def test_attached_values_and_switches() -> None:
    spec = import_command_line("vllm serve /m -qawq -ep -dp 2 --port 1")
    assert spec["flags"] == {
        "quantization": "awq",
        "enable-expert-parallel": True,
        "data-parallel-size": 2,
        "port": 1,
    }
    with pytest.raises(ConfigError, match="given twice"):
        import_command_line("vllm serve /m -tp 8 --tensor-parallel-size 8 --port 1")


def test_an_unknown_servers_short_option_is_kept_as_written(tmp_path: Path) -> None:
    spec = import_command_line("mysrv --a 1 -x 3 -y --b -2 --port 1")
    assert spec["flags"] == {"a": 1, "-x": 3, "-y": True, "b": -2, "port": 1}
    exp = _load(tmp_path, "mysrv --a 1 -x 3 -y --port 1", "mine")
    assert exp.argv() == ["mysrv", "--a", "1", "-x", "3", "-y", "--port", "1"]
    # SGLang has no short options: its parser refuses `-tp`, so it is kept for it to say
    spec = import_command_line("python -m sglang.launch_server --tp-size 8 -tp 8 --port 1")
    assert spec["flags"] == {"tp-size": 8, "-tp": 8, "port": 1}


def test_python_options_and_module_stay_the_command() -> None:
    spec = import_command_line("python3 -u -X dev -m mylab.server -x 1 --port 2")
    assert spec["exec"] == "python3 -u -X dev -m mylab.server"
    assert spec["flags"] == {"-x": 1, "port": 2}


def test_a_config_key_with_one_dash_is_a_short_option(tmp_path: Path) -> None:
    def load(exe: str) -> Experiment:
        path = tmp_path / "c.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "name": "c",
                    "service": {"exec": exe, "flags": {"-tp": 8, "--max-num-seqs": 4, "port": 1}},
                },
                sort_keys=False,
            )
        )
        return load_experiment(path)

    assert load("vllm serve /m").flag_map() == {
        "tensor-parallel-size": 8,
        "max-num-seqs": 4,
        "port": 1,
    }
    assert load("mysrv").argv() == ["mysrv", "-tp", "8", "--max-num-seqs", "4", "--port", "1"]


def test_the_servers_help_names_a_short_option_when_the_preflight_has_it() -> None:
    # a wrapper the table does not know, in front of vLLM: its help (vLLM's) tells
    facts = follow(
        read_help((HELP / "vllm-0.33.0-serve.help.txt").read_text()),
        read_help((HELP / "vllm-0.33.0-serve.help-all.txt").read_text()),
    )
    exp = Experiment.from_dict(
        {"name": "w", "service": {"exec": "/opt/run-server", "flags": {"-tp": 8, "port": 1}}}
    )
    again, renamed = respell(exp, facts)
    assert renamed == [("-tp", "tensor-parallel-size")]
    assert again.flag_map() == {"tensor-parallel-size": 8, "port": 1}


def test_the_vllm_table_is_the_real_parsers() -> None:
    recorded = json.loads((HELP / "vllm-0.33.0-serve.accepts.json").read_text())
    dest_long: dict[str, str] = {}  # a dest's first long option: the name its help gives
    for o in recorded["options"]:
        if o["option"].startswith("--") and not o["option"].startswith("--no-"):
            dest_long.setdefault(o["dest"], o["option"][2:])
    shorts = {
        o["option"]: (dest_long[o["dest"]], o["switch"])
        for o in recorded["options"]
        if not o["option"].startswith("--") and o["option"] != "-h"
    }
    assert shorts == VLLM
    assert all(recorded["forms"][f] == "ok" for f in ("-O3", "-O0", "-O=2"))


def test_what_reads_as_an_option() -> None:
    assert [
        w for w in ["-x", "--x", "-1", "-.5", "-", "-a b", "--x=a b", "-O3"] if is_option(w)
    ] == ["-x", "--x", "--x=a b", "-O3"]


def test_a_sweep_matrix_key_names_a_short_option_as_a_config_does(tmp_path: Path) -> None:
    from orchestrator.config.sweep import load_sweep

    (tmp_path / "base.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "b",
                "service": {
                    "exec": "vllm serve /m",
                    "flags": {"tensor-parallel-size": 2, "port": 1},
                },
            }
        )
    )
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"name": "s", "base": "base.yaml", "matrix": {"-tp": [4, 8]}}))
    flags = [it.exp.flag_map() for it in load_sweep(sweep).items]
    assert flags == [{"tensor-parallel-size": 4, "port": 1}, {"tensor-parallel-size": 8, "port": 1}]
