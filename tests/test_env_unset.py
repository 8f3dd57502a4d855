"""`env: {X: null}` removes X from the launch, whichever command runs it (issue 35).

`run` used to leave the unit's own `X` set (its drop-in had no `UnsetEnvironment=`) and
record the run as the launch without X; `bisect` later reused that verdict for its variant
without X, which did remove it. Now the launch (`Experiment.unset`) is decided once, and
every command (run, rerun, bisect, sweep) runs and records the same thing: a run that
left the unit's X in place and one that removed it have different fingerprints.

Fast: the real executor and systemd service manager over the scripted host. What systemd
itself does with the drop-in is proven on the real systemd host in
test_executor_systemd.py (test_run_with_a_null_env_var_removes_the_units_own_value).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml

from orchestrator.campaign.planning import make_plan
from orchestrator.campaign.single import single_run
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.config.loading import load_experiment
from orchestrator.config.sweep import load_sweep
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.execution.executor import Executor
from orchestrator.store.store import Store
from tests.support.scripted_transport import FakeClock, ScriptedTransport, Server, host

UNIT = (
    "[Service]\nEnvironment=PYTHONPATH=/opt/srv NCCL_ALGO=Tree\n"
    "ExecStart=/bin/sleep infinity\nRestart=no\n"
)


def _config(path: Path, env: dict | None) -> Path:
    service: dict = {
        "unit": "sglang.service",
        "exec": "python3 -m sglang.launch_server",
        "flags": {"model-path": "/models/m", "tp-size": 8, "port": 30000},
    }
    if env is not None:
        service["env"] = env
    path.write_text(
        yaml.safe_dump({"name": path.stem, "service": service, "health": {"timeout": 60}})
    )
    return path


def _systemd_factory(transports: list[ScriptedTransport]):  # noqa: ANN202
    clock = FakeClock()

    def factory(h: Host, service: str, campaign: str, listener) -> Executor:  # noqa: ANN001
        t = ScriptedTransport(h, clock, [Server()], unit_text=UNIT)
        transports.append(t)
        return Executor(
            h,
            service=service,
            campaign=campaign,
            listener=listener,
            transport=t,
            sleep=clock.sleep,
            clock=clock.monotonic,
            wall_clock=clock.time,
        )

    return factory


def _run(store: Store, exp: Experiment) -> str:
    transports: list[ScriptedTransport] = []
    h = replace(host(), service_manager="systemd")
    row = single_run(
        store,
        exp,
        h,
        kind="run",
        command="orchestrator run",
        label=exp.name,
        executor_factory=_systemd_factory(transports),
    )
    assert row.verdict is Verdict.PASS, row.detail
    return row.id


def test_run_removes_a_null_variable_from_the_units_environment(tmp_path: Path) -> None:
    store = Store(tmp_path / "results")
    exp = load_experiment(_config(tmp_path / "no-tree.yaml", {"NCCL_ALGO": None}))
    assert exp.unset == ("NCCL_ALGO",)
    row = store.run(_run(store, exp))
    assert row.rendered is not None and "UnsetEnvironment=NCCL_ALGO" in row.rendered
    # recorded as that launch: a rerun runs the recorded config, X removed again
    again = row.experiment(resolve_secrets=True)
    assert again.unset == ("NCCL_ALGO",) and again.fingerprint() == exp.fingerprint()
    rerun = store.run(_run(store, again))
    assert rerun.rendered is not None and "UnsetEnvironment=NCCL_ALGO" in rerun.rendered


def test_a_config_silent_about_x_leaves_the_unit_value_and_says_so(tmp_path: Path) -> None:
    store = Store(tmp_path / "results")
    exp = load_experiment(_config(tmp_path / "plain.yaml", None))
    row = store.run(_run(store, exp))
    assert row.rendered is not None and "UnsetEnvironment" not in row.rendered


def test_a_bisect_variant_and_a_run_share_a_key_only_when_they_launch_alike(
    tmp_path: Path,
) -> None:
    good = _config(tmp_path / "good.yaml", {"NCCL_ALGO": "Ring"})
    bad = _config(tmp_path / "bad.yaml", {"NCCL_ALGO": None})
    plain = load_experiment(_config(tmp_path / "plain.yaml", None))
    plan = make_plan(good, bad)
    without = plan.variant(frozenset(range(plan.n)))  # NCCL_ALGO removed: as bisect runs it
    assert without.unset == ("NCCL_ALGO",)
    # `run bad.yaml` is that launch: its verdict may serve the bisection
    assert load_experiment(bad).fingerprint() == without.fingerprint()
    # a run that left the unit's NCCL_ALGO in place is another launch: never reused for it
    assert plain.fingerprint() != without.fingerprint()
    # (and a launch removing nothing keeps the key it always had)
    assert "unset" not in str(plain.to_dict())


def test_the_recorded_config_round_trips_the_removal(tmp_path: Path) -> None:
    exp = load_experiment(_config(tmp_path / "x.yaml", {"NCCL_ALGO": None, "A": "1"}))
    data = exp.to_dict()
    assert data["service"]["env"] == {"A": "1", "NCCL_ALGO": None}
    back = Experiment.from_dict(data)
    assert back == exp and back.fingerprint() == exp.fingerprint()


def test_sweep_items_are_recorded_with_the_other_items_variables_removed(
    tmp_path: Path,
) -> None:
    _config(tmp_path / "a.yaml", {"NCCL_ALGO": "Ring"})
    _config(tmp_path / "b.yaml", None)
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"name": "s", "configs": ["a.yaml", "b.yaml"]}))
    items = load_sweep(sweep).items
    assert items[0].exp.unset == () and items[1].exp.unset == ("NCCL_ALGO",)


def test_an_issue_reports_reproduction_removes_the_variable_too() -> None:
    from orchestrator.reports.issue_report import command_block

    text = command_block(["python3", "-m", "x", "--a", "1", "-tp", "8"], {"A": "1"}, ["NCCL_ALGO"])
    assert text.splitlines()[0] == "env -u NCCL_ALGO \\"
    assert "  -tp 8" in text.splitlines()  # a short option is a flag line of its own


def test_a_child_config_setting_a_variable_false_removes_it(tmp_path: Path) -> None:
    """`env: {X: false}` in a child removes X, as a flag set to false is removed
    (docs/formats.md): never `Environment="X=false"` in the drop-in."""
    _config(tmp_path / "parent.yaml", {"NCCL_DEBUG": "INFO", "A": "1"})
    child = tmp_path / "child.yaml"
    child.write_text(
        yaml.safe_dump({"extends": "parent.yaml", "service": {"env": {"NCCL_DEBUG": False}}})
    )
    exp = load_experiment(child)
    assert exp.env_map() == {"A": "1"} and exp.unset == ("NCCL_DEBUG",)
    store = Store(tmp_path / "results")
    row = store.run(_run(store, exp))
    assert row.rendered is not None
    assert "NCCL_DEBUG=false" not in row.rendered
    assert "UnsetEnvironment=NCCL_DEBUG" in row.rendered
    # the quoted text stays a value
    quoted = _config(tmp_path / "quoted.yaml", {"NCCL_DEBUG": "false"})
    assert load_experiment(quoted).env_map() == {"NCCL_DEBUG": "false"}
