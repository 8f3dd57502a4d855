"""Which hosts file a command read is never a guess: without --hosts (and no hosts.yaml)
the fallback to hosts.example.yaml is said once, and every host error names the file the
host came from. The host here is a closed port on 127.0.0.1: the connection is refused at
once, as a mistyped address or a host that is down would be."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.lab.sshd import free_port

REPO = Path(__file__).resolve().parents[1]


def hosts_text(tmp_path: Path) -> str:
    known = tmp_path / "known_hosts"
    known.write_text("")
    return (
        f"hosts:\n  gone:\n    address: 127.0.0.1\n    port: {free_port()}\n"
        f"    known_hosts: {known}\n    service_manager: process\n"
        "    connect_timeout: 5\n"
    )


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with a hosts.example.yaml and no hosts.yaml."""
    monkeypatch.delenv("ORCH_HOSTS", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts.example.yaml").write_text(hosts_text(tmp_path))
    for name in ("tp8.yaml", "ep8_nvls.yaml"):
        (tmp_path / name).write_text((REPO / "experiments" / name).read_text())
    return tmp_path


@pytest.mark.parametrize(
    "command",
    [
        ["run", "tp8.yaml", "--host", "gone"],
        ["bisect", "--good", "tp8.yaml", "--bad", "ep8_nvls.yaml", "--host", "gone"],
        ["plan", "--good", "tp8.yaml", "--bad", "ep8_nvls.yaml", "--host", "gone"],
    ],
)
def test_the_example_fallback_is_said_once_and_host_errors_name_the_file(
    here: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([*command, *(["--results", str(here / "res")] if command[0] != "plan" else [])])
    out, err = capsys.readouterr()
    assert code == 3, out + err
    example = str((here / "hosts.example.yaml").resolve())
    assert err.count("using the example hosts file") == 1, err
    assert example in err.split("using the example hosts file", 1)[1].splitlines()[0]
    [error] = [line for line in err.splitlines() if line.startswith("error:")]
    assert "gone" in error and f"(host from {example})" in error, err


def test_a_named_hosts_file_is_named_in_host_errors_and_json(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = here / "mine.yaml"
    mine.write_text(hosts_text(here))
    code = main(
        [
            "run",
            "tp8.yaml",
            "--host",
            "gone",
            "--hosts",
            str(mine),
            "--json",
            "--results",
            str(here / "res"),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 3
    assert "example" not in err  # no fallback: nothing to say about it
    doc = json.loads(out)
    assert doc["exit_code"] == 3 and f"(host from {mine.resolve()})" in doc["error"], doc


def test_an_unknown_host_names_the_file_it_was_looked_up_in(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "tp8.yaml", "--host", "gonne", "--results", str(here / "res")])
    _, err = capsys.readouterr()
    assert code == 2
    assert "hosts.example.yaml; did you mean 'gone'?" in err, err
