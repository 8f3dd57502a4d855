"""What a hostile user fed the CLI and the configs, and the clear answer each must get.

Fast tier: campaigns here run on the scripted host (`tests/support/scripted.py`) into a real store;
the CLI runs in-process. Each test names the row of the report it closes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.bisect import Bisection
from orchestrator.campaign.planning import make_plan
from orchestrator.cli import main
from orchestrator.config.experiment import MAX_ARG_BYTES
from orchestrator.config.loading import load_experiment
from orchestrator.errors import ConfigError
from orchestrator.store.store import Store
from tests.support.scripted import TARGET_ERROR, Faults, Oracle, Rule, factory, host, write_pair


def _cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _campaign(results: Path, tmp: Path, name: str = "h1") -> str:
    good, bad = write_pair(tmp / f"exp-{name}", 4)
    store = Store(results)
    try:
        oracle = Oracle([Rule(frozenset({2}), "cuda_graph", TARGET_ERROR)])
        out = Bisection(
            store,
            make_plan(good, bad),
            [host(name)],
            command="test",
            executor_factory=factory(oracle, Faults()),
        ).run()
        assert out.status == "found"
        return out.campaign_id
    finally:
        store.close()


def _base(tmp: Path) -> dict:
    good, _ = write_pair(tmp / "base", 1)
    return yaml.safe_load(good.read_text())


# ---- row 6: non-finite durations ------------------------------------------------------------


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_non_finite_durations_are_refused_at_load(tmp_path: Path, value: str) -> None:
    path = tmp_path / "x.yaml"
    text = yaml.safe_dump(_base(tmp_path)).replace("timeout: 60s", f"timeout: {value}")
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_experiment(path)
    assert exc.value.key == "health.timeout" and "duration" in str(exc.value)


# ---- row 7: read-only commands on a read-only results dir ----------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount needs root")
def test_read_only_commands_work_on_a_read_only_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.hosts.faults import read_only_dir

    results = tmp_path / "results"
    cid = _campaign(results, tmp_path)
    log = next((results / "logs").glob("*.log"))
    with read_only_dir(results):
        code, out, err = _cli(capsys, "runs", "--results", results)
        assert code == 0 and cid in out, err
        code, out, err = _cli(capsys, "runs", "--campaigns", "--results", results)
        assert code == 0 and cid in out, err
        code, out, err = _cli(capsys, "show", f"{cid}.2", "--results", results)
        assert code == 0 and "verdict" in out, err
        code, out, err = _cli(capsys, "classify", log, "--results", results)
        assert code == 0, err


def test_a_missing_results_dir_is_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere"
    code, _, err = _cli(capsys, "runs", "--results", missing)
    assert code != 0 and "no results" in err
    assert not missing.exists()


# ---- row 8: campaign id prefixes -------------------------------------------------------------


def test_campaign_prefixes_are_literal_and_never_silently_ambiguous(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = tmp_path / "results"
    ids = [_campaign(results, tmp_path, f"h{i}") for i in range(17)]
    # 17 hex ids: two start with the same digit, whatever the ids (16 digits)
    a, b = next((a, b) for a in ids for b in ids if a < b and a[0] == b[0])
    code, _, err = _cli(capsys, "report", a[0], "--results", results)
    assert code == 2 and "ambiguous prefix" in err and a in err and b in err
    for junk in ("%", "_", ""):
        code, _, err = _cli(capsys, "runs", "--campaign", junk, "--results", results)
        assert code == 2, (junk, err)
    code, out, _ = _cli(capsys, "runs", "--campaign", ids[0][:5], "--results", results)
    assert code == 0 and ids[0] in out


# ---- row 9: --json on error paths -------------------------------------------------------------


def test_json_output_is_one_document_on_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(
        capsys, "plan", "--good", tmp_path / "no.yaml", "--bad", tmp_path / "no.yaml", "--json"
    )
    assert code == 2 and json.loads(out)["error"].endswith("experiment file not found")
    code, out, _ = _cli(capsys, "bisect", "--max-runs", "0", "--json")
    assert code == 2 and "--max-runs" in json.loads(out)["error"]
    code, out, _ = _cli(capsys, "runs", "--json", "--results", tmp_path / "none")
    assert code != 0 and json.loads(out)["status"] == "error"


# ---- row 10: hostile structure and text --------------------------------------------------------


def test_deep_nesting_and_long_extends_chains_are_config_errors(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: x\nservice:\n  flags:\n    a: " + "[" * 600 + "]" * 600 + "\n")
    with pytest.raises(ConfigError):
        load_experiment(deep)
    base = tmp_path / "c0.yaml"
    base.write_text(yaml.safe_dump(_base(tmp_path)))
    for i in range(1, 1500):
        (tmp_path / f"c{i}.yaml").write_text(f"extends: c{i - 1}.yaml\n")
    with pytest.raises(ConfigError) as exc:
        load_experiment(tmp_path / "c1499.yaml")
    assert exc.value.key == "extends" and "longer than" in str(exc.value)


def test_markup_and_escapes_in_names_are_printed_inert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _base(tmp_path)
    data["name"] = "evil [/red] [bold]x\x1b[2J\x1b]0;pwned\x07"
    data["service"]["flags"]["bogus-key"] = {"nested": 1}
    path = tmp_path / "evil.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out, err = _cli(capsys, "plan", "--good", path, "--bad", path)
    assert code == 2 and "Traceback" not in err
    assert "\x1b" not in out + err and "\x07" not in out + err
    data["service"]["flags"]["bogus-key"] = True
    path.write_text(yaml.safe_dump(data))
    other = tmp_path / "other.yaml"
    data["service"]["flags"]["more"] = True
    other.write_text(yaml.safe_dump(data))
    code, out, err = _cli(capsys, "plan", "--good", path, "--bad", other)
    assert code == 0, err
    assert "\x1b" not in out + err


def test_import_of_binary_or_endless_input_is_a_clear_error(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    blob = tmp_path / "model.bin"
    blob.write_bytes(bytes(range(256)) * 64)
    for target in (blob, Path("/dev/zero")):
        code, _, err = _cli(capsys, "import", target)
        assert code == 2 and "Traceback" not in err, err


# ---- row 11: classify caps what it reads --------------------------------------------------------


def test_classify_of_endless_or_binary_input_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = _cli(capsys, "classify", "/dev/zero", "--results", tmp_path)
    assert code == 2 and "binary data" in err
    big = tmp_path / "big.log"
    with big.open("w") as fh:  # 24 MB of warnings, then the crash at the end
        line = "[2026-11-30 03:00:00 TP0] WARNING: something harmless happened here\n"
        fh.write(line * (24_000_000 // len(line)))
        fh.write('Traceback (most recent call last):\n  File "x.py", line 1, in f\n')
        fh.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    code, out, err = _cli(capsys, "classify", big, "--json", "--results", tmp_path)
    assert code == 0, err
    assert json.loads(out)["failed"] is True


# ---- row 12: values past the kernel's limits ----------------------------------------------------


@pytest.mark.parametrize("where", ["env", "flags"])
def test_a_megabyte_value_is_refused_at_load_naming_the_limit(tmp_path: Path, where: str) -> None:
    data = _base(tmp_path)
    data["service"].setdefault(where, {})["HUGE" if where == "env" else "huge"] = "x" * 1_000_000
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as exc:
        load_experiment(path)
    assert str(MAX_ARG_BYTES - 1) in str(exc.value) and exc.value.key.startswith(f"service.{where}")


# ---- row 13: nonsense options and duplicate keys ---------------------------------------------


def test_nonsense_options_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for args in (
        ["bisect", "--max-runs", "0"],
        ["bisect", "--max-runs", "-3"],
        ["bisect", "--repeat", "0"],
        ["show", "x", "--lines", "0"],
    ):
        code, _, err = _cli(capsys, *args)
        assert code == 2 and "1 or more" in err, (args, err)
    results = tmp_path / "results"
    cid = _campaign(results, tmp_path)
    good, _ = write_pair(tmp_path / "other", 2)
    code, _, err = _cli(capsys, "bisect", "--resume", cid, "--good", good, "--results", results)
    assert code == 2 and "--good cannot be given" in err.replace("\n", " "), err


def test_duplicate_yaml_keys_are_config_errors(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text(
        "name: a\nservice:\n  exec: python3 -m x\n  flags:\n    port: 30000\n"
        "    tp-size: 8\n    tp-size: 4\n"
    )
    with pytest.raises(ConfigError) as exc:
        load_experiment(path)
    assert "tp-size" in str(exc.value) and "twice" in str(exc.value)
