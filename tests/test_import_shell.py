"""Launch scripts and unit files read as the shell and systemd would read them (issue 35).

Each case used to import a different launch without a word: `--tp-size ${TP}` became the
config's secret syntax (and `plan` failed) while the same import put `TP: '8'` in env:;
`$MODEL` stayed literal; `"$@"` joined a JSON option's value; a `bash -c '...'` unit gave
no flags and the false note "the command has no --port"; `%%` stayed doubled;
`ExecStart=@` ran argv[0] as the script; `EnvironmentFile=` was dropped without a note.
What cannot be read is refused, naming it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.campaign.planning import make_plan
from orchestrator.cli import main
from orchestrator.config.importer import (
    import_command_line,
    import_file,
    import_unit_file,
    render_yaml,
    to_experiment_mapping,
)
from orchestrator.errors import ConfigError

SGLANG = "python -m sglang.launch_server"


def _write(tmp_path: Path, name: str, spec: dict) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(render_yaml(to_experiment_mapping(spec, name=name)))
    return path


def test_script_variables_are_expanded_and_plan_works(tmp_path: Path) -> None:
    script = (
        f"#!/bin/bash\nTP=8\nMODEL=/models/Kimi\nexport NCCL_DEBUG=WARN\n"
        f"exec {SGLANG} --model-path $MODEL --tp-size ${{TP}} --port 30000\n"
    )
    spec = import_command_line(script, source="launch.sh")
    assert spec["flags"] == {"model-path": "/models/Kimi", "tp-size": 8, "port": 30000}
    # only what the script exports reaches the server's environment
    assert spec["env"] == {"NCCL_DEBUG": "WARN"}
    good = _write(tmp_path, "good", spec)
    bad = _write(tmp_path, "bad", import_command_line(script.replace("TP=8", "TP=4")))
    assert [(d.key, d.old, d.new) for d in make_plan(good, bad).deltas] == [("tp-size", 8, 4)]


def test_quotes_defaults_and_field_splitting() -> None:
    script = (
        "ARGS='--enable-x --mem-fraction-static 0.9'\n"
        f'{SGLANG} $ARGS --served-model-name "${{NAME:-kimi k2}}" '
        "--chat-template '$NOT_A_VAR' --port ${PORT:-30000}\n"
    )
    spec = import_command_line(script)
    assert spec["flags"] == {
        "enable-x": True,
        "mem-fraction-static": 0.9,
        "served-model-name": "kimi k2",
        "chat-template": "$NOT_A_VAR",
        "port": 30000,
    }


def test_an_unknown_variable_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError) as err:
        import_command_line(f"{SGLANG} --model-path $MODEL_DIR --port 1", source="run.sh")
    assert "$MODEL_DIR" in str(err.value) and "run.sh" in str(err.value)
    with pytest.raises(ConfigError, match=r"command substitution \$\(hostname\)"):
        import_command_line(f"H=$(hostname)\n{SGLANG} --host $H --port 1")


def test_script_arguments_are_none_and_never_join_a_value() -> None:
    spec = import_command_line(
        f'{SGLANG} --json-model-override-args \'{{"a": 1}}\' "$@" --port 1\n'
    )
    assert spec["flags"]["json-model-override-args"] == '{"a": 1}'
    assert any('"$@"' in n for n in spec["notes"])


def test_bash_c_unit_is_read_with_its_script(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    unit = tmp_path / "sglang.service"
    unit.write_text(
        "[Service]\nEnvironment=TP=8\n"
        "ExecStart=/bin/bash -c 'cd /opt && exec python -m sglang.launch_server "
        "--tp-size $TP --port 30000 >> /var/log/s.log 2>&1'\n"
    )
    spec = import_file(unit)
    assert spec["exec"] == SGLANG
    assert spec["flags"] == {"tp-size": 8, "port": 30000}
    assert spec["env"] == {"TP": "8"}
    assert main(["import", str(unit)]) == 0
    captured = capsys.readouterr()
    assert "no --port" not in captured.err
    assert yaml.safe_load(captured.out)["service"]["flags"]["port"] == 30000


def test_specifiers_and_dollars_as_systemd_reads_them() -> None:
    spec = import_unit_file(
        "[Service]\nExecStart=/opt/srv --log-file /var/log/%n-%%d.log --name %N "
        "--price $$5 --port 1\n",
        source="/etc/systemd/system/srv.service",
    )
    assert spec["flags"] == {
        "log-file": "/var/log/srv.service-%d.log",
        "name": "srv",
        "price": "$5",
        "port": 1,
    }
    with pytest.raises(ConfigError, match="%h"):
        import_unit_file("[Service]\nExecStart=/opt/srv --dir %h --port 1\n", source="srv.service")


def test_exec_start_prefixes() -> None:
    spec = import_unit_file(
        "[Service]\nExecStart=-@/opt/venv/bin/python sglang-k26 -m sglang.launch_server --port 1\n",
        source="k.service",
    )
    assert spec["exec"] == "/opt/venv/bin/python -m sglang.launch_server"
    assert any("argv[0]" in n and "sglang-k26" in n for n in spec["notes"])
    # `:` turns systemd's substitution off: the `$` reaches the server as written
    spec = import_unit_file(
        "[Service]\nExecStart=:/opt/srv --price $5 --port 1\n", source="k.service"
    )
    assert spec["flags"]["price"] == "$5"
    spec = import_unit_file("[Service]\nExecStart=+/opt/srv --port 1\n", source="k.service")
    assert any("full privileges" in n for n in spec["notes"])


def test_environment_file_is_noted_and_its_variables_refused() -> None:
    spec = import_unit_file(
        "[Service]\nEnvironmentFile=-/etc/default/sglang\nExecStart=/opt/srv --port 1\n",
        source="s.service",
    )
    assert any("EnvironmentFile=/etc/default/sglang" in n for n in spec["notes"])
    with pytest.raises(ConfigError) as err:
        import_unit_file(
            "[Service]\nEnvironmentFile=/etc/default/sglang\n"
            "ExecStart=/opt/srv --model ${MODEL} --port 1\n",
            source="s.service",
        )
    assert "${MODEL}" in str(err.value) and "/etc/default/sglang" in str(err.value)


def test_unit_variables_are_expanded_as_systemd_does() -> None:
    spec = import_unit_file(
        '[Service]\nEnvironment=TP=8 "ARGS=--enable-x --mem-fraction-static 0.9"\n'
        "ExecStart=/opt/srv --tp-size ${TP} $ARGS --port 1\n",
        source="s.service",
    )
    assert spec["flags"] == {"tp-size": 8, "enable-x": True, "mem-fraction-static": 0.9, "port": 1}


def test_a_literal_reference_is_refused() -> None:
    with pytest.raises(ConfigError, match="reference to the environment variable X"):
        import_command_line(f"{SGLANG} --a '${{X}}' --port 1")


def test_a_template_units_instance_is_not_guessed() -> None:
    unit = "[Service]\nExecStart=/opt/srv --name %i --port 1\n"
    with pytest.raises(ConfigError, match="instance of the template unit"):
        import_unit_file(unit, source="srv@.service")
    assert import_unit_file(unit, source="srv@gpu0.service")["flags"]["name"] == "gpu0"


def test_a_unit_that_runs_a_script_says_to_import_the_script() -> None:
    spec = import_unit_file("[Service]\nExecStart=/bin/bash /opt/launch.sh\n", source="s.service")
    assert any("import that script" in n and "/opt/launch.sh" in n for n in spec["notes"])


_PIECES = list(" \t\n\\'\"$`{}()[];&|<>#=%@:+!-_aZ09./*?") + [
    "--x",
    "-t",
    "${A}",
    "$(",
    "$((",
    "bash -c ",
    "python -m sglang.launch_server ",
    "--port 1 ",
    "export ",
    "A=1 ",
    '"$@"',
    "%n",
    "%%",
    "\\\n",
    "<<EOF\n",
    "$'\\x41'",
    "${A:-b}",
    "${#A}",
    "2>&1",
    ">&",
    "<&-",
    "ExecStart=",
    "Environment=",
    "[Service]\n",
]


@settings(max_examples=120, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=30).map("".join))
def test_any_text_is_imported_or_refused_as_a_config_error(text: str) -> None:
    for read in (
        lambda: import_command_line(text, source="x.sh"),
        lambda: import_unit_file("[Service]\nExecStart=" + text, source="x@.service"),
        lambda: import_unit_file("[Service]\n" + text, source="x.service"),
    ):
        try:
            spec = read()
        except ConfigError:
            continue
        assert spec["exec"] and isinstance(spec["flags"], dict)


def test_crlf_line_ends_read_as_lf() -> None:
    script = f"TP=8\r\n{SGLANG} \\\r\n  --tp-size $TP \\\r\n  --port 1\r\n"
    assert import_command_line(script)["flags"] == {"tp-size": 8, "port": 1}
    unit = "[Service]\r\nExecStart=/opt/srv \\\r\n  --port 1\r\n"
    assert import_unit_file(unit, source="s.service")["flags"] == {"port": 1}


def test_a_script_imports_as_bash_runs_it(tmp_path: Path) -> None:
    # bash itself runs the script, with a `python` that records what it was given: the
    # import's argv and environment are those, word for word.
    import json
    import subprocess
    import sys

    from orchestrator.config.loading import load_experiment

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python"
    fake.write_text(
        f"#!/bin/sh\nexec {sys.executable} -c 'import json, os, sys; "
        'json.dump([sys.argv[1:], dict(os.environ)], open(os.environ["DUMP"], '
        '"w"))\' "$@"\n'
    )
    fake.chmod(0o755)
    script = tmp_path / "launch.sh"
    script.write_text(
        '#!/bin/bash\nset -e\nTP=8\nMODEL="/models/Kimi K2"\n'
        "ARGS='--enable-x --mem-fraction-static 0.9'\nexport NCCL_DEBUG=WARN\ncd /tmp\n"
        f'exec {SGLANG} --model-path "$MODEL" --tp-size ${{TP}} $ARGS \\\n'
        "  --served-model-name \"${NAME:-kimi k2}\" --chat-template '$NOT' -x 3 \\\n"
        '  --json-model-override-args \'{"a": [1, 2]}\' "$@" --port ${PORT:-30000} '
        "> /dev/null 2>&1\n"
    )
    dump = tmp_path / "dump.json"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "DUMP": str(dump)}
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=30)
    argv, seen = json.loads(dump.read_text())
    exp = load_experiment(_write(tmp_path, "imported", import_file(script)))
    assert argv == exp.argv()[1:]
    assert {k: seen.get(k) for k in exp.env_map()} == exp.env_map() == {"NCCL_DEBUG": "WARN"}
    assert "TP" not in seen  # not exported: bash did not pass it, nor does the import
