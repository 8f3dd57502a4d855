"""Secrets never reach results/, reports or terminal output; rerun takes them from the
environment again. The end-to-end part runs a real lab bisection (local transport and
process manager: what is under test here is everything the controller writes)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.config import load_experiment
from orchestrator.config.importer import import_command_line, secret_references
from orchestrator.config.secrets import Redactor, secrets_of
from orchestrator.errors import ConfigError
from orchestrator.lab.sshd import free_port

REPO = Path(__file__).resolve().parents[1]
TOKEN = "hf_QmVyeVNlY3JldFRva2VuVmFsdWUxMjM0NTY"
API_KEY = "sk-live-5ecretApiKeyForTheServer0099"


def test_what_counts_as_secret() -> None:
    found = secrets_of(
        {"HF_TOKEN": "abcd1234", "NCCL_DEBUG": "WARN", "X": TOKEN},
        [("api-key", "plainvalue"), ("tp-size", 8), ("model-path", "/m")],
    )
    assert found == {"HF_TOKEN": "abcd1234", "X": TOKEN, "API_KEY": "plainvalue"}
    red = Redactor(found)
    assert red.text(f"token={TOKEN} key=plainvalue") == "token=[REDACTED:X] key=[REDACTED:API_KEY]"
    # token-shaped strings are caught even when nobody declared them
    assert "ghp_" not in (Redactor().text("ghp_abcdefghijklmnopqrstuvwxyz0123") or "")


def test_references_resolve_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "x.yaml"
    p.write_text(
        "service:\n  exec: srv\n  flags: {port: 1, api-key: '${API_KEY}'}\n"
        "  env: {HF_TOKEN: '${HF_TOKEN}'}\n"
    )
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("API_KEY", API_KEY)
    with pytest.raises(ConfigError, match=r"\$\{HF_TOKEN\}, which is not set") as err:
        load_experiment(p)
    assert "service.env.HF_TOKEN" in str(err.value)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    exp = load_experiment(p)
    assert exp.env_map()["HF_TOKEN"] == TOKEN and exp.flag_map()["api-key"] == API_KEY
    assert set(exp.secrets()) == {"HF_TOKEN", "API_KEY"}


def test_import_writes_references_not_values() -> None:
    spec = import_command_line(f"HF_TOKEN={TOKEN} python -m x --api-key {API_KEY} --port 1")
    assert secret_references(spec) == ["HF_TOKEN", "API_KEY"]
    assert spec["env"]["HF_TOKEN"] == "${HF_TOKEN}"
    assert spec["flags"]["api-key"] == "${API_KEY}"


def _hosts(tmp_path: Path) -> Path:
    p = tmp_path / "hosts.yaml"
    p.write_text(
        "hosts:\n  here:\n    address: localhost\n    transport: local\n"
        f"    service_manager: process\n    run_dir: {tmp_path / 'run'}\n"
        "    env: {ORCH_LAB_TIME_SCALE: '0.1'}\n"
    )
    return p


def _grep(root: Path, needle: str) -> list[str]:
    r = subprocess.run(["grep", "-rl", "--", needle, str(root)], capture_output=True, text=True)
    return r.stdout.split()


@pytest.mark.slow
def test_no_secret_under_results_or_in_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("API_KEY", API_KEY)
    lab = REPO / "experiments/lab/b300"
    good = tmp_path / "good.yaml"
    # on a port of its own: the lab's default (30000) may be taken by a server of someone else
    good.write_text(
        f"extends: {lab / 'good.yaml'}\nservice:\n  flags: {{api-key: '${{API_KEY}}', "
        f"port: {free_port()}}}\n  env: {{HF_TOKEN: '${{HF_TOKEN}}'}}\n"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"extends: {good}\nservice:\n  flags: {{ep-size: 8, enable-nccl-nvls: true}}\n")
    results = tmp_path / "results"
    rc = main(
        [
            "bisect",
            "--good",
            str(good),
            "--bad",
            str(bad),
            "--host",
            "here",
            "--hosts",
            str(_hosts(tmp_path)),
            "--results",
            str(results),
            "--fresh",
        ]
    )
    out = capsys.readouterr()
    assert rc == 0, out.out + out.err
    assert "--ep-size 8 + --enable-nccl-nvls" in out.out
    # the lab server prints its arguments (the api key among them) into its log
    logs = list((results / "logs").glob("*.log"))
    assert logs and any("REDACTED:API_KEY" in p.read_text() for p in logs)
    for secret in (TOKEN, API_KEY):
        assert secret not in out.out + out.err
        assert _grep(results, secret) == []
    # files are private
    assert (results / "orchestrator.db").stat().st_mode & 0o077 == 0
    assert all(p.stat().st_mode & 0o077 == 0 for p in logs)
    # rerun takes the secrets from the environment again, and says so when they are missing
    run_id = "{}.2".format(next(results.glob("reports/*.md")).stem)
    assert main(["rerun", run_id, "--hosts", str(_hosts(tmp_path)), "--results", str(results)]) == 0
    assert "same verdict and signature" in capsys.readouterr().out
    monkeypatch.delenv("API_KEY")
    assert main(["rerun", run_id, "--hosts", str(_hosts(tmp_path)), "--results", str(results)]) == 2
    assert "needs the secret API_KEY" in capsys.readouterr().err
    assert _grep(results, TOKEN) == [] and _grep(results, API_KEY) == []
