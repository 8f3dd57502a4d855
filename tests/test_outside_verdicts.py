"""Who stopped a server decides its verdict (the rules; the real hosts are in
test_outside_stop.py and test_slurm_timelimit.py).

A server stopped from outside is `infra` whatever its exit status, when the host recorded
the stop (systemd's stop job) or the server said it got a stop signal, and its log shows
no failure of its own. A failure of its own followed by exit 0 stays a failure; an exit 0
with nothing said stays a failure too (nothing tells who ended it). A job ended by the
scheduler's time limit is `timeout`, with or without a target.
"""

from __future__ import annotations

from orchestrator.diagnosis.classify.judge import RunEvidence, hang_message, judge, outside_cause
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict

START = "[2026-12-01 10:00:00 TP0] Load weight begin. avail mem=78.00 GB\n"
SGLANG_TERM = (
    "[2026-12-01 10:00:05] SIGTERM received. signum=None frame=None. Draining "
    "requests and shutting down...\n"
)
VLLM_TERM = "INFO 12-01 10:00:05 [launcher.py:80] Shutting down FastAPI HTTP server.\n"
CRASH = (
    'Traceback (most recent call last):\n  File "/x/engine.py", line 10, in step\n'
    "    out = self.model(x)\nRuntimeError: CUDA error: an illegal memory access was "
    "encountered\n"
)
SIGQUIT = (
    "[2026-12-01 10:00:05] Received sigquit from a child process. It usually means "
    "the child failed.\n"
)


def test_a_stop_the_host_recorded_is_infra_even_at_exit_0() -> None:
    ev = RunEvidence(
        log_tail=START,
        exit_code=0,
        unit_result="success",
        stopped_by="systemd: 'Stopping lab-b300.service...'",
    )
    assert judge(ev, None) == (Verdict.INFRA, None)
    assert "stopped from outside the campaign (systemd:" in (outside_cause(ev) or "")


def test_a_server_that_says_it_got_a_stop_signal_and_exits_0_is_infra() -> None:
    for notice in (SGLANG_TERM, VLLM_TERM, "got signal 15, exiting\n"):
        ev = RunEvidence(log_tail=START + notice, exit_code=0)
        assert judge(ev, None) == (Verdict.INFRA, None), notice
    ready = RunEvidence(
        log_tail=START + SGLANG_TERM, became_ready=True, died_after_ready=True, exit_code=0
    )
    assert judge(ready, None) == (Verdict.INFRA, None)


def test_a_failure_of_its_own_then_exit_0_stays_a_failure() -> None:
    # vLLM after an engine death exits 0 by itself; even a stop notice after the crash (its
    # own shutdown) does not make the crash someone else's
    for tail in (START + CRASH, START + CRASH + VLLM_TERM):
        ev = RunEvidence(log_tail=tail, exit_code=0)
        verdict, sig = judge(ev, None)
        assert verdict is Verdict.FAIL and sig is not None, tail
        assert "illegal memory access" in sig.message
    stopped = RunEvidence(log_tail=START + CRASH, exit_code=0, stopped_by="systemd: 'Stopping'")
    assert judge(stopped, None)[0] is Verdict.FAIL


def test_an_exit_0_nobody_explains_stays_a_failure() -> None:
    for tail in (START, START + SIGQUIT):  # SGLang's SIGQUIT is a child's failure
        verdict, sig = judge(RunEvidence(log_tail=tail, exit_code=0), None)
        assert verdict is Verdict.FAIL and sig is not None, tail
        assert outside_cause(RunEvidence(log_tail=tail, exit_code=0)) is None


def test_the_time_limit_is_a_timeout_with_or_without_a_target() -> None:
    cut = RunEvidence(
        log_tail=START, timed_out=True, time_limit=True, last_phase=Phase.LOAD_WEIGHTS
    )
    hang = Signature(Phase.LOAD_WEIGHTS, "hang", hang_message(START))
    assert hang.message.startswith("no readiness before the deadline")
    assert judge(cut, None) == (Verdict.TIMEOUT, hang)
    assert judge(cut, hang) == (Verdict.TIMEOUT, hang)
    # our own health deadline still shows a hang (the bad endpoint's failure)
    assert judge(RunEvidence(log_tail=START, timed_out=True), None)[0] is Verdict.FAIL


def test_the_host_failing_under_the_server_is_infra_not_the_configs_failure() -> None:
    # A GPU's uncorrectable ECC or NVLink error, a full disk: no config causes them, and a
    # run that met one must not clear its variant as "another failure" (public reports:
    # NVIDIA's ECC error "should be recovered by a new run").
    ecc = (
        "[2025-01-29 08:52:44 TP5] Scheduler hit an exception: Traceback (most recent "
        'call last):\n  File "/x/scheduler.py", line 1, in event_loop\n    self.run_batch()'
        "\nRuntimeError: CUDA error: uncorrectable ECC error encountered\nCUDA kernel errors"
        " might be asynchronously reported at some other API call, so the stacktrace below "
        "might be incorrect.\n"
    )
    nvlink = (
        "RuntimeError: CUDA error: an uncorrectable NVLink error was detected during the "
        "execution\n"
    )
    disk = (
        'Traceback (most recent call last):\n  File "/x/jit.py", line 3, in build\n    '
        "f.write(so)\nOSError: [Errno 28] No space left on device: '/root/.cache/x.so'\n"
    )
    target = Signature(Phase.CUDA_GRAPH, "cublas", "CUBLAS_STATUS_EXECUTION_FAILED")
    for tail, what in (
        (ecc, "uncorrectable ECC error"),
        (nvlink, "uncorrectable NVLink"),
        (disk, "No space left on device"),
    ):
        for ev in (
            RunEvidence(log_tail=START + tail, exit_code=1),
            RunEvidence(
                log_tail=START + tail, became_ready=True, died_after_ready=True, exit_code=1
            ),
        ):
            assert judge(ev, target) == (Verdict.INFRA, None), tail
            assert judge(ev, None) == (Verdict.INFRA, None), tail
            cause = outside_cause(ev) or ""
            assert cause.startswith("the host failed under the server (") and what in cause
    # a warning about a full disk before a failure of the server's own stays that failure
    warned = START + "WARNING: could not write the cache: No space left on device\n" + CRASH
    verdict, sig = judge(RunEvidence(log_tail=warned, exit_code=1), None)
    assert verdict is Verdict.FAIL and sig is not None and "illegal memory" in sig.message
