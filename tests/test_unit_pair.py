"""A pair (or a sweep) whose configs name different systemd units is refused, naming both.

Every variant runs as a drop-in on one unit; a bad config on another unit used to run on
the good one's unit without a word (issue 35). A unit is not a delta: what differs between
two unit files is not known, and no variant could take half of it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.planning import make_plan
from orchestrator.cli import main
from orchestrator.config.sweep import load_sweep
from orchestrator.errors import ConfigError, PlanError


def _config(path: Path, *, unit: str | None, tp: int = 8) -> Path:
    service: dict = {
        "exec": "python -m sglang.launch_server",
        "flags": {"tp-size": tp, "port": 30000},
    }
    if unit is not None:
        service["unit"] = unit
    path.write_text(yaml.safe_dump({"name": path.stem, "service": service}))
    return path


def test_a_different_unit_in_bad_is_refused_naming_both(tmp_path: Path) -> None:
    good = _config(tmp_path / "good.yaml", unit="sglang-a.service")
    bad = _config(tmp_path / "bad.yaml", unit="sglang-b.service", tp=4)
    with pytest.raises(PlanError) as err:
        make_plan(good, bad)
    text = str(err.value)
    assert "sglang-a.service" in text and "sglang-b.service" in text
    assert "drop-in on one unit" in text
    assert "same service.unit" in (err.value.hint or "")


def test_a_unit_on_one_side_only_is_refused(tmp_path: Path) -> None:
    good = _config(tmp_path / "good.yaml", unit="sglang-a.service")
    bad = _config(tmp_path / "bad.yaml", unit=None, tp=4)
    with pytest.raises(PlanError, match="no service.unit"):
        make_plan(good, bad)


def test_the_same_unit_plans_as_before(tmp_path: Path) -> None:
    good = _config(tmp_path / "good.yaml", unit="sglang-a.service")
    bad = _config(tmp_path / "bad.yaml", unit="sglang-a.service", tp=4)
    assert [d.key for d in make_plan(good, bad).deltas] == ["tp-size"]


def test_only_the_unit_differs_says_the_unit_not_nothing_to_bisect(tmp_path: Path) -> None:
    good = _config(tmp_path / "good.yaml", unit="sglang-a.service")
    bad = _config(tmp_path / "bad.yaml", unit="sglang-b.service")
    with pytest.raises(PlanError, match="sglang-b.service"):
        make_plan(good, bad)


def test_cli_plan_refuses_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _config(tmp_path / "good.yaml", unit="sglang-a.service")
    bad = _config(tmp_path / "bad.yaml", unit="sglang-b.service", tp=4)
    assert main(["plan", "--good", str(good), "--bad", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "sglang-a.service" in err and "sglang-b.service" in err


def test_a_sweep_over_configs_on_different_units_is_refused(tmp_path: Path) -> None:
    _config(tmp_path / "a.yaml", unit="sglang-a.service")
    _config(tmp_path / "b.yaml", unit="sglang-b.service", tp=4)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"name": "s", "configs": ["a.yaml", "b.yaml"]}))
    with pytest.raises(ConfigError) as err:
        load_sweep(sweep)
    assert "sglang-a.service" in str(err.value) and "sglang-b.service" in str(err.value)
    assert str(sweep) in str(err.value)
