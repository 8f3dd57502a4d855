"""A server that dies under a unit that restarts it, on the real systemd host.

A unit whose own configuration says `Restart=always`: our drop-in's `Restart=no` ends the
run at the first death, and even when a drop-in of someone else's forces `Restart=always`
over ours, the run ends at the first death (the InvocationID/NRestarts change is seen) and
is judged on that first invocation's log. Afterwards the unit's own `Restart=` is back.

(A server that answers `/health` `ready_after` times and dies at once is not `pass`: a
decision of the watch loop, proven on the scripted host in test_executor_watch.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Phase, Verdict
from orchestrator.events import Event, StepDone
from orchestrator.execution.executor import Executor
from tests.hosts.faults import B300, UNIT_DIR, SdLab

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "experiments" / "lab"
LAB_UNIT_RESTART = "always"  # the shared `sd_box` installs the lab unit with Restart=always


# ---- Restart=always that flaps -------------------------------------------------------------


@pytest.mark.parametrize(
    "forced", [False, True], ids=["unit-restart-always", "foreign-dropin-forces-restart"]
)
def test_restart_always_unit_run_ends_at_the_first_death(sd: SdLab, forced: bool) -> None:
    assert sd.show("Restart")["Restart"] == "always"
    if forced:
        # Someone else's drop-in, read after ours, puts Restart=always back: the unit flaps.
        sd.box.install_unit(
            f"{B300}.d/zz-flap.conf", "[Service]\nRestart=always\nRestartSec=100ms\n"
        )
    seen: dict[str, str] = {}

    def listener(event: Event) -> None:
        if isinstance(event, StepDone) and event.step == "started" and not seen:
            # The event carries the InvocationID the executor noted at start; asking systemd
            # again here could already see the next start (RestartSec=100ms) on a slow machine.
            seen["InvocationID"] = event.detail
            seen.update(sd.show("Restart"))

    ep8 = load_experiment(LAB / "b300" / "ep8_only.yaml")  # dies at init, every start
    with Executor(sd.host, service=B300, campaign="c-flap", listener=listener) as ex:
        r = ex.run(ep8, run_id="flap")
        after_run = sd.show("ActiveState", "NRestarts")
    assert r.verdict is Verdict.FAIL, (r.detail, r.log_tail[-1500:])
    assert r.signature is not None
    assert (r.signature.phase, r.signature.error_class) == (Phase.INIT, "AttributeError")
    assert r.invocation == seen["InvocationID"]  # judged on the first start's own log
    assert r.log_tail.count("AttributeError: 'NoneType'") == 1  # one death, one traceback
    assert after_run["ActiveState"] in ("inactive", "failed")  # stopped, not flapping on
    if forced:
        assert seen["Restart"] == "always"
    else:
        assert seen["Restart"] == "no"  # our drop-in's Restart=no was in force
        assert after_run["NRestarts"] == "0"
    # The unit's own Restart=always is back; theirs is left alone.
    assert sd.show("Restart")["Restart"] == "always"
    if forced:
        assert sd.exists(f"{UNIT_DIR}/{B300}.d/zz-flap.conf")
        assert "99-orchestrator" not in sd.show("DropInPaths")["DropInPaths"]
        assert sd.show("ActiveState")["ActiveState"] == "inactive"
        assert not sd.locks()
    else:
        assert sd.restored_problems() == []
