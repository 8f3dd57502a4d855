"""The executor's watch/poll decisions, on a scripted host and a scripted clock (fast tier).

The real `Executor`, process service manager, host lock, classifier and tenacity retrying
drive a scripted host (`tests/support/scripted_transport.py`): its servers print SGLang's real
startup lines phase by phase and crash, hang, die or are killed at scripted moments, and
the clock moves only when the executor sleeps, so poll times, deadlines and the settle are
exact and a 15-minute deadline costs nothing. What needs the real things (process groups
and signals, drop-ins, `systemctl show`, journald, network faults, sshd restarts) is
proven on the real hosts in test_executor_process.py, test_executor_systemd.py,
test_executor_errors.py, test_faults_server.py and test_faults_net.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest

from orchestrator.config.experiment import Experiment
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict
from orchestrator.events import Event, PhaseReached, Polled, RunFinished, StepDone
from orchestrator.execution.contract import RunCancelled, RunResult
from orchestrator.execution.executor import Executor
from tests.support.scripted import OTHER_ERROR, TARGET_ERROR
from tests.support.scripted_transport import (
    PHASES,
    FakeClock,
    Probe,
    ScriptedTransport,
    Server,
    UnscriptedCommand,
    host,
)

PORT = 30000
READY = sum(s for _, s in PHASES)  # 13 s after the start: /health answers 200 from then
#: the default backoff's poll times after the start (0.25 s doubling, capped at 1 s)
BACKOFF = [0.0, 0.25, 0.75, 1.75, 2.75]


def experiment(*, timeout: float = 60.0, probe: bool = False, **health: object) -> Experiment:
    data: dict[str, object] = {
        "name": "scripted",
        "service": {
            "exec": "python3 -m sglang.launch_server",
            "flags": {"model-path": "/models/m", "tp-size": 8, "port": PORT},
        },
        "health": {"path": "/health", "timeout": timeout, **health},
    }
    if probe:
        data["probe"] = {
            "run": "python3 -m sglang.bench_serving --port {port} --num-prompts 200",
            "metric": r"Output token throughput \(tok/s\):\s+([\d.]+)",
            "pass_if": ">= 80",
        }
    return Experiment.from_dict(data)


@dataclass
class Rig:
    """One executor over one scripted host; `events` holds what the executor emitted."""

    t: ScriptedTransport
    clock: FakeClock
    ex: Executor
    events: list[Event] = field(default_factory=list)
    on_event: Callable[[Event], None] | None = None

    def run(self, exp: Experiment, run_id: str = "r", target: Signature | None = None) -> RunResult:
        self.t0, self.mark = self.clock.now, len(self.t.log)
        return self.ex.run(exp, run_id=run_id, target=target)

    def polls(self) -> list[float]:
        """Poll times of the last run, in seconds after its start."""
        return [
            round(t - self.t0, 6)
            for t, kind in self.t.log[self.mark :]
            if kind in ("poll", "unit_poll")
        ]


def rig(
    *starts: Server, poll_min: float = 0.25, poll_max: float = 1.0, **host_events: object
) -> Rig:
    clock = FakeClock()
    h = host()
    t = ScriptedTransport(h, clock, list(starts), **host_events)  # type: ignore[arg-type]
    r = Rig(t, clock, None)  # type: ignore[arg-type]

    def listener(event: Event) -> None:
        r.events.append(event)
        if r.on_event is not None:
            r.on_event(event)

    r.ex = Executor(
        h,
        service="sglang",
        campaign="c-watch",
        listener=listener,
        transport=t,
        poll_min=poll_min,
        poll_max=poll_max,
        sleep=clock.sleep,
        clock=clock.monotonic,
        wall_clock=clock.time,
    ).open()
    return r


def expected_polls(until: float, poll_min: float = 0.25, poll_max: float = 1.0) -> list[float]:
    """The capped exponential backoff's poll times from 0 up to `until` (inclusive)."""
    out, t, k = [0.0], 0.0, 0
    while True:
        t += min(poll_min * 2**k, poll_max)
        k += 1
        if t > until:
            return out
        out.append(t)


# ---- pass -------------------------------------------------------------------------------------


def test_pass_after_ready_after_200s_and_one_poll_after_the_settle() -> None:
    r = rig(Server())
    result = r.run(experiment())
    assert result.verdict is Verdict.PASS, (result.detail, result.log_tail[-1500:])
    assert result.signature is None
    # Backoff up to the first 200 (13.75: the first poll after 13 s), the second 200 at once
    # (poll_min: a healthy server is not made to wait out the backoff), then the settle
    # (health.settle, 1 s by default) and one more poll, which must still see it alive.
    first_200 = expected_polls(READY)[-1] + 1.0
    assert r.polls() == [
        *expected_polls(READY),
        first_200,
        first_200 + 0.25,
        first_200 + 0.25 + 1.0,
    ]
    assert result.ready_s == first_200 + 0.25
    assert result.duration_s == first_200 + 0.25 + 1.0
    assert result.polls == len(r.polls())
    assert result.started_at == r.clock.epoch + r.t0
    # Every phase seen live, in order, each when the first poll after its start saw it.
    seen = [e.phase for e in r.events if isinstance(e, PhaseReached)]
    assert seen == [
        Phase.INIT,
        Phase.LOAD_WEIGHTS,
        Phase.KV_CACHE,
        Phase.CUDA_GRAPH,
        Phase.WARMUP,
        Phase.SERVING,
    ]
    times = dict(result.phase_times)
    assert times["init"] == 0.0 and times["load_weights"] == 2.75  # first poll after 2 s
    assert times["serving"] == first_200  # "fired up" in its log; ready at the 2nd 200
    assert "The server is fired up and ready to roll!" in result.log_tail
    assert [e.verdict for e in r.events if isinstance(e, RunFinished)] == [Verdict.PASS]


def test_ready_after_counts_consecutive_200s_only() -> None:
    r = rig(Server())
    result = r.run(experiment(ready_after=3))
    codes = [e.http_code for e in r.events if isinstance(e, Polled)]
    assert codes[-4:] == [200, 200, 200, 200]  # three to be ready, one after the settle
    assert codes.count(200) == 4 and set(codes[:-4]) == {0}
    assert result.verdict is Verdict.PASS
    assert result.ready_s == expected_polls(READY)[-1] + 1.0 + 2 * 0.25


# ---- the backoff, the interval ----------------------------------------------------------------


@pytest.mark.parametrize(("poll_min", "poll_max"), [(0.25, 1.0), (0.5, 4.0), (2.0, 2.0)])
def test_backoff_doubles_from_poll_min_up_to_poll_max(poll_min: float, poll_max: float) -> None:
    r = rig(Server(hang_in="cuda_graph"), poll_min=poll_min, poll_max=poll_max)
    r.run(experiment(timeout=30.0))
    polls = r.polls()
    # Capped exponential backoff up to the deadline; the last wait is cut to end on it.
    schedule = expected_polls(30.0, poll_min, poll_max)
    assert polls == (schedule if schedule[-1] == 30.0 else [*schedule, 30.0])
    gaps = [b - a for a, b in zip(polls, polls[1:], strict=False)]
    assert gaps[0] == poll_min and max(gaps) == poll_max


def test_health_interval_replaces_the_backoff() -> None:
    r = rig(Server())
    result = r.run(experiment(interval=5.0))
    # Every 5 s, also between the 200s and for the settle's poll (the settle is its own).
    assert r.polls() == [0.0, 5.0, 10.0, 15.0, 20.0, 21.0]
    assert result.verdict is Verdict.PASS and result.ready_s == 20.0


def test_settle_is_the_configured_wait_before_the_last_poll() -> None:
    r = rig(Server())
    result = r.run(experiment(settle=7.0))
    assert result.verdict is Verdict.PASS
    polls = r.polls()
    assert polls[-1] - polls[-2] == 7.0
    assert 7.0 in r.clock.sleeps


# ---- fail in each phase -------------------------------------------------------------------------


@pytest.mark.parametrize("phase", [name for name, _ in PHASES])
def test_crash_in_each_phase_fails_with_that_phase(phase: str) -> None:
    r = rig(Server(crash_in=phase, error=TARGET_ERROR))
    result = r.run(experiment())
    assert result.verdict is Verdict.FAIL, (result.detail, result.log_tail[-1500:])
    assert result.signature is not None
    assert result.signature.phase is Phase(phase)
    assert result.signature.error_class == "cublas"
    assert result.last_phase is Phase(phase)
    assert result.ready_s is None
    # Ended at the first poll that saw it dead: no later than one backoff step after.
    begins = dict((p, b) for p, b, _ in Server().phase_starts())[phase]
    died = begins + 0.5
    assert died <= r.polls()[-1] <= died + 1.0
    assert "Traceback (most recent call last)" in result.log_tail


def test_a_different_crash_is_other_and_the_same_one_fail() -> None:
    r = rig(
        Server(crash_in="cuda_graph", error=TARGET_ERROR),
        Server(crash_in="init", error=OTHER_ERROR),
        Server(crash_in="cuda_graph", error=TARGET_ERROR),
    )
    bad = r.run(experiment(), "bad")
    other = r.run(experiment(), "other", target=bad.signature)
    again = r.run(experiment(), "again", target=bad.signature)
    assert bad.verdict is Verdict.FAIL and bad.signature is not None
    assert other.verdict is Verdict.OTHER
    assert other.signature is not None and other.signature.phase is Phase.INIT
    assert other.signature.error_class == "AttributeError"
    assert again.verdict is Verdict.FAIL and again.signature == bad.signature


# ---- timeout ----------------------------------------------------------------------------------


def test_hang_times_out_exactly_at_the_deadline_with_its_last_phase() -> None:
    r = rig(Server(crash_in="cuda_graph", error=TARGET_ERROR), Server(hang_in="cuda_graph"))
    target = r.run(experiment(), "bad").signature
    result = r.run(experiment(timeout=300.0), "hang", target=target)
    assert result.verdict is Verdict.TIMEOUT, (result.detail, result.log_tail[-1500:])
    assert result.last_phase is Phase.CUDA_GRAPH
    assert result.signature is not None
    assert (result.signature.phase, result.signature.error_class) == (Phase.CUDA_GRAPH, "hang")
    polls = r.polls()
    assert polls[-1] == 300.0  # the last look is at the deadline, not a backoff after it
    gaps = [b - a for a, b in zip(polls, polls[1:], strict=False)]
    assert gaps[:3] == [0.25, 0.5, 1.0] and set(gaps[3:-1]) == {1.0}  # capped at poll_max
    assert 0 < gaps[-1] <= 1.0  # the last wait cut short to end on the deadline
    assert result.duration_s == 300.0
    assert result.ready_s is None
    # no port hint (the server listens on the port polled); the server is alive and never
    # healthy: the detail names what it printed last
    # (the server's own last log line, not the progress bar a library printed under it)
    assert result.detail == (
        "not ready after 300s; last phase: cuda_graph; last log line: "
        "Capture cuda graph bs [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, "
        "64, 72, 80, 88, 96, 104, 112, 120, 128, 136, 144, 152, 160, 168, "
        "176, 184, 192, 200, 208, 216, 224, 232, 240, 248, 256]"
    )
    assert r.t.procs[-1].stopped == r.t0 + 300.0  # and it is stopped at once


def test_hang_without_a_target_is_the_failure_itself() -> None:
    r = rig(Server(hang_in="load_weights"))
    result = r.run(experiment(timeout=20.0))
    assert result.verdict is Verdict.FAIL
    assert result.signature is not None and result.signature.error_class == "hang"
    assert result.last_phase is Phase.LOAD_WEIGHTS
    assert "not ready after 20s; last phase: load_weights" in result.detail


def test_timeout_names_the_port_the_server_listens_on() -> None:
    r = rig(Server(listen_port=PORT + 1))
    result = r.run(experiment(timeout=30.0))
    assert result.verdict is Verdict.FAIL  # no target: a hang is the failure itself
    assert r.polls()[-1] == 30.0
    assert result.last_phase is Phase.SERVING  # it started fine, on another port
    assert result.detail == (
        "not ready after 30s; last phase: serving; the server listens on "
        f"{PORT + 1} but the health check polls port {PORT}: check --port and health.port in "
        "the experiment config; last log line: The server is fired up and ready to roll!"
    )


def test_deadline_counts_from_the_run_start_not_from_the_first_poll() -> None:
    # The variant is installed and started at t0; a scripted start costs nothing, so the
    # first poll is at 0 and the deadline is at exactly timeout after t0.
    r = rig(Server(hang_in="init"))
    r.run(experiment(timeout=3.0))
    assert r.polls() == [0.0, 0.25, 0.75, 1.75, 2.75, 3.0]


# ---- dead after ready, under the probe --------------------------------------------------------


def test_server_dying_right_after_ready_is_not_pass() -> None:
    ready = expected_polls(READY)[-1] + 1.0 + 0.25  # the second 200
    r = rig(Server(dies_at=ready + 0.5), Server(dies_at=ready + 1.5))
    dies = r.run(experiment(), "dies")  # dead within the settle: caught by its poll
    later = r.run(experiment(), "later")  # dead after it: outside the window, and a pass
    assert dies.ready_s == ready
    assert dies.verdict is Verdict.FAIL, (dies.detail, dies.log_tail[-1500:])
    assert dies.signature is not None and dies.signature.phase is Phase.SERVING
    assert "illegal memory access" in dies.signature.message
    assert later.verdict is Verdict.PASS


def test_probe_pass_and_its_metric() -> None:
    r = rig(Server(probe=Probe(seconds=30.0)))
    result = r.run(experiment(probe=True))
    assert result.verdict is Verdict.PASS, (result.detail, result.log_tail[-1500:])
    assert result.probe_metric == 89.5
    # After the probe (its warm-up run and three repeats, 30 s each): two looks, half a
    # second apart (or the settle when shorter).
    polls = r.polls()
    assert polls[-1] - polls[-2] == 0.5 and polls[-2] == result.ready_s + 1.0 + 4 * 30.0


def test_probe_repeats_inside_one_start_and_keeps_every_figure() -> None:
    """The probe runs warm-up + repeats times in one start; the metric is the median of
    the runs after the warm-up, and every figure is kept with the run."""
    figures = ("10.0", "90.0", "70.0", "95.0")
    outputs = tuple(f"Output token throughput (tok/s): {f}\n" for f in figures)
    r = rig(Server(probe=Probe(outputs=outputs)))
    result = r.run(experiment(probe=True))
    assert result.verdict is Verdict.PASS, (result.detail, result.log_tail[-1500:])
    assert result.probe_metric == 90.0  # the slow warm-up run is not counted
    assert result.host_record is not None
    probe = result.host_record["probe"]
    assert isinstance(probe, dict)
    assert probe["values"] == [10.0, 90.0, 70.0, 95.0] and probe["warmup"] == 1


def test_probe_that_prints_no_metric_is_the_probes_failure() -> None:
    """A probe that ran but printed nothing its metric matches is the probe's failure
    (`probe_error`), not a metric that missed its bar."""
    r = rig(Server(probe=Probe(output="Traceback: the benchmark could not connect\n")))
    result = r.run(experiment(probe=True))
    assert result.verdict is Verdict.FAIL
    assert result.signature is not None
    assert (result.signature.phase, result.signature.error_class) == (Phase.PROBE, "probe_error")
    assert result.probe_metric is None


def test_death_during_the_probe_is_a_serving_crash() -> None:
    ready = expected_polls(READY)[-1] + 1.25
    r = rig(Server(dies_at=ready + 1.0 + 10.0, probe=Probe(seconds=30.0)))
    result = r.run(experiment(probe=True))
    assert result.ready_s == ready
    assert result.verdict is Verdict.FAIL, (result.detail, result.log_tail[-1500:])
    assert result.signature is not None
    assert (result.signature.phase, result.signature.error_class) == (
        Phase.SERVING,
        "illegal_address",
    )


def test_death_right_after_the_probe_is_seen_by_the_second_look() -> None:
    ready = expected_polls(READY)[-1] + 1.25
    r = rig(Server(dies_at=ready + 1.0 + 30.0 + 0.25, probe=Probe(seconds=30.0)))
    result = r.run(experiment(probe=True))
    assert result.verdict is Verdict.FAIL, (result.detail, result.log_tail[-1500:])
    assert result.signature is not None and result.signature.phase is Phase.SERVING
    assert result.probe_metric == 89.5  # the probe itself went fine


def test_probe_below_its_bar_fails_with_the_bar() -> None:
    r = rig(Server(probe=Probe(output="Output token throughput (tok/s): 41.00\n")))
    result = r.run(experiment(probe=True))
    assert result.verdict is Verdict.FAIL
    assert result.signature is not None
    assert (result.signature.phase, result.signature.error_class) == (
        Phase.PROBE,
        "probe_threshold",
    )
    assert result.probe_metric == 41.0


# ---- the host ---------------------------------------------------------------------------------


def test_reboot_mid_run_is_infra_and_the_next_run_judges() -> None:
    r = rig(
        Server(crash_in="cuda_graph", error=TARGET_ERROR),
        Server(crash_in="cuda_graph", error=TARGET_ERROR),
        reboots=[1000.0 + 5.0],
    )
    first = r.run(experiment(), "rebooted")
    retry = r.run(experiment(), "retry")
    assert first.verdict is Verdict.INFRA, (first.detail, first.log_tail[-1500:])
    assert first.signature is None  # never judged: nothing about the config was learnt
    assert "rebooted during the run (its boot id changed)" in first.detail
    assert retry.verdict is Verdict.FAIL and retry.signature is not None
    assert retry.signature.phase is Phase.CUDA_GRAPH


@pytest.mark.parametrize("lead", [0.5, 3.0])
def test_a_server_seen_dead_while_its_host_shuts_down_is_infra(lead: float) -> None:
    # The shutdown stops the server before the boot id changes: the poll that sees it dead
    # still reads the old boot; the host's own state (stopping, or a new boot by the time
    # the death's evidence was read) says the run judged nothing.
    r = rig(
        Server(crash_in="cuda_graph", error=TARGET_ERROR),
        Server(crash_in="cuda_graph", error=TARGET_ERROR),
        reboots=[1000.0 + 6.0],
        shutdown_lead=lead,
    )
    first = r.run(experiment(), "shutdown")
    r.clock.now = max(r.clock.now, 1000.0 + 6.0)  # the next run starts on the booted host
    retry = r.run(experiment(), "retry")
    assert first.verdict is Verdict.INFRA, (first.detail, first.log_tail[-1500:])
    assert first.signature is None
    assert "shutting down" in first.detail or "rebooted" in first.detail, first.detail
    assert retry.verdict is Verdict.FAIL and retry.signature is not None


def test_link_lost_mid_poll_is_infra_and_the_next_run_works() -> None:
    r = rig(Server(), Server(), link_down=[(1000.0 + 5.0, 1000.0 + 6.0)])
    lost = r.run(experiment(), "lost")
    first = r.t.procs[0]
    again = r.run(experiment(), "again")
    assert lost.verdict is Verdict.INFRA, (lost.detail, lost.log_tail[-1500:])
    assert lost.signature is None
    assert "lost and not re-established after 4 attempts" in lost.detail
    assert again.verdict is Verdict.PASS, (again.detail, again.log_tail[-1500:])
    # The first run's server was stopped before the next start (by that run's own stop).
    assert first.stopped is not None and first.stopped <= r.t.procs[1].started


def test_killed_from_outside_is_infra() -> None:
    r = rig(Server(killed_at=4.0))
    result = r.run(experiment())
    assert result.verdict is Verdict.INFRA, (result.detail, result.log_tail[-1500:])
    assert result.signature is None
    assert "killed by SIGKILL from outside the campaign" in result.detail
    assert result.last_phase is Phase.LOAD_WEIGHTS


def test_cancel_stops_the_server_and_raises() -> None:
    r = rig(Server())
    polled: list[float] = []

    def cancel_at_the_third_poll(event: Event) -> None:
        if isinstance(event, Polled):
            polled.append(event.elapsed_s)
            if len(polled) == 3:
                r.ex.cancel_event.set()

    r.on_event = cancel_at_the_third_poll
    with pytest.raises(RunCancelled):
        r.run(experiment())
    assert len(r.polls()) == 3  # no poll after the cancel was seen
    proc = r.t.procs[0]
    assert proc.stopped is not None  # the server was stopped, not left running
    assert r.t.times("stop")[-1] == r.clock.now
    assert not any(isinstance(e, RunFinished) for e in r.events)


# ---- the scripted host itself -----------------------------------------------------------------


def test_an_unknown_command_fails_the_test_loudly() -> None:
    r = rig(Server())
    with pytest.raises(UnscriptedCommand, match="does not know this command"):
        r.t.run("nvidia-smi -L")
    # A probe of a shape it does not know (another tool) is not answered either.
    data = experiment(probe=True).to_dict()
    exp = Experiment.from_dict({**data, "probe": {"run": "curl localhost:{port}"}})
    with pytest.raises(UnscriptedCommand):
        r.run(exp)


# ---- the same decisions with the systemd manager ------------------------------------------------
# The scripted host answers the systemd manager's commands too (systemctl show, start,
# stop, daemon-reload, busctl, journalctl): the unit's state decides alive or dead, the
# InvocationID tells one start from the next. What systemd itself does with a drop-in is
# proven on the real systemd host (test_executor_systemd.py, test_faults_server.py).


def systemd_rig(*starts: Server, **host_events: object) -> Rig:
    r = rig(*starts, **host_events)
    r.ex.close()
    h = replace(host(), service_manager="systemd")
    r.t.host = h
    r.ex = Executor(
        h,
        service="sglang.service",
        campaign="c-watch",
        listener=r.events.append,
        transport=r.t,
        sleep=r.clock.sleep,
        clock=r.clock.monotonic,
        wall_clock=r.clock.time,
    ).open()
    return r


def test_systemd_runs_are_judged_on_their_own_invocation() -> None:
    r = systemd_rig(Server(), Server(crash_in="cuda_graph", error=TARGET_ERROR))
    good = r.run(experiment(), "good")
    bad = r.run(experiment(), "bad")
    assert good.verdict is Verdict.PASS, (good.detail, good.log_tail[-1500:])
    assert bad.verdict is Verdict.FAIL, (bad.detail, bad.log_tail[-1500:])
    assert bad.signature is not None and bad.signature.phase is Phase.CUDA_GRAPH
    assert good.invocation and bad.invocation and good.invocation != bad.invocation
    assert "The server is fired up" not in bad.log_tail  # the journal of its invocation only
    assert good.host_record is not None
    assert good.host_record["journal_command"] == (
        f"journalctl _SYSTEMD_INVOCATION_ID={good.invocation} --no-pager"
    )
    assert good.ready_s == expected_polls(READY)[-1] + 1.25


def test_systemd_unit_restarted_by_systemd_ends_the_run_at_the_first_death() -> None:
    # A Restart=always that wins over our drop-in: systemd starts the server again 0.2 s
    # after it died; the run ends at the first poll that sees another InvocationID, and is
    # judged on the first start's journal.
    r = systemd_rig(Server(crash_in="init", error=OTHER_ERROR), restart_after=0.2)
    result = r.run(experiment())
    first, again = r.t.procs[0], r.t.procs[1]
    assert result.verdict is Verdict.FAIL, (result.detail, result.log_tail[-1500:])
    assert result.signature is not None and result.signature.phase is Phase.INIT
    assert result.invocation == first.invocation
    assert result.log_tail.count("Traceback (most recent call last)") == 1
    assert r.polls()[-1] == 0.75  # the first poll after the restart at 0.7 s
    assert again.stopped is not None  # the restarted server is stopped, not left running


def test_systemd_kill_from_outside_is_infra_and_a_crash_is_not() -> None:
    r = systemd_rig(Server(killed_at=4.0), Server(crash_in="kv_cache", error=TARGET_ERROR))
    killed = r.run(experiment(), "killed")
    crashed = r.run(experiment(), "crashed")  # SIGKILLs itself too, after its traceback
    assert killed.verdict is Verdict.INFRA, (killed.detail, killed.log_tail[-1500:])
    assert "killed by SIGKILL from outside the campaign" in killed.detail
    assert crashed.verdict is Verdict.FAIL and crashed.signature is not None
    assert crashed.signature.phase is Phase.KV_CACHE


def test_systemd_timeout_names_the_port_the_unit_listens_on() -> None:
    r = systemd_rig(Server(listen_port=PORT + 1))
    result = r.run(experiment(timeout=20.0))
    assert r.polls()[-1] == 20.0
    assert f"the server listens on {PORT + 1} but the health check polls port {PORT}" in (
        result.detail
    )


def test_systemd_answering_half_while_its_host_shuts_down_is_the_shutdown() -> None:
    # Going down, systemd answers `systemctl show` with nothing (its bus is closing) while
    # the boot id is still the old one: the run is `infra` for the shutdown, not for a
    # reply the executor could not read.
    r = systemd_rig(
        Server(crash_in="cuda_graph", error=TARGET_ERROR),
        Server(crash_in="cuda_graph", error=TARGET_ERROR),
        reboots=[1000.0 + 6.0],
        shutdown_lead=3.0,
        show_fails_while_stopping=True,
    )
    first = r.run(experiment(), "shutdown")
    r.clock.now = max(r.clock.now, 1000.0 + 6.0)
    retry = r.run(experiment(), "retry")
    assert first.verdict is Verdict.INFRA, (first.detail, first.log_tail[-1500:])
    assert first.signature is None
    assert "was shutting down" in first.detail, first.detail
    assert retry.verdict is Verdict.FAIL and retry.signature is not None


# ---- GPU memory another process holds ---------------------------------------------------------


def test_a_start_waits_for_gpu_memory_another_process_frees() -> None:
    # A server still exiting, a job that ends: its GPU memory is freed within the wait;
    # the run starts then, and its deadline is counted from there.
    r = rig(Server(), gpu_held=[(0.0, 1000.0 + 40.0, 0)])  # ready 13 s after its start
    result = r.run(experiment(timeout=20.0), "after-wait")
    assert result.verdict is Verdict.PASS, (result.detail, result.log_tail[-1500:])
    assert r.t.procs[0].started >= 1000.0 + 40.0  # started once GPU 0 was free
    waits = [e.detail for e in r.events if isinstance(e, StepDone) and e.step == "waiting"]
    assert waits[0].startswith("GPU 0: 70000 MiB held by pid 7000 (python3): waiting up to 180s"), (
        waits
    )
    assert waits[-1].startswith("the GPUs are free after 4")


def test_gpu_memory_held_past_the_wait_is_infra_naming_the_holder() -> None:
    r = rig(Server(), gpu_held=[(0.0, 1e9, 3)])
    result = r.run(experiment(), "held")
    assert result.verdict is Verdict.INFRA and result.signature is None
    assert "GPU 3: 70000 MiB held by pid 7003 (python3), still after 180s" in result.detail
    assert "not this run's server" in result.detail
    assert r.t.procs == []  # never started beside it


def test_gpus_the_config_does_not_use_are_not_waited_for() -> None:
    r = rig(Server(), gpu_held=[(0.0, 1e9, 0)])
    e = experiment().with_changes(env={"CUDA_VISIBLE_DEVICES": "1,2"})
    result = r.run(e, "other-gpus")
    assert result.verdict is Verdict.PASS, (result.detail, result.log_tail[-1500:])
    assert not [e for e in r.events if isinstance(e, StepDone) and e.step == "waiting"]
