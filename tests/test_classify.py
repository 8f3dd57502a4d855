"""The classifier's rules one at a time: each test feeds one hand-picked log (the recorded
SGLang and vLLM logs of tests/data/logs/, from public issue threads) or a few literal lines
and names the exact phase, error class, message, signature or verdict it must give. It
proves the parts: the phase of a line, the root error under wrappers and SIGQUIT, the
excerpt, message normalisation, the rule table, `judge` for every kind of run evidence
(pass, crash, timeout and hang, signal, probe, infra, invalid) and `orchestrator classify`.

The other two classifier test files: test_diagnosis.py measures the whole classifier on
the labelled corpus (the figures the benchmark prints) and on input nobody planned for;
test_real_logs.py reads what this project's own real vLLM printed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.diagnosis.classify.analyze import analyze_log
from orchestrator.diagnosis.classify.judge import (
    HANG_MESSAGE,
    ProbeOutcome,
    RunEvidence,
    judge,
    outside_cause,
    signal_name,
)
from orchestrator.diagnosis.classify.lines import last_phase, phase_of_line
from orchestrator.diagnosis.classify.normalize import normalize_message
from orchestrator.diagnosis.classify.rules import ERROR_RULES
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict

LOGS = Path(__file__).parent / "data" / "logs"


def log(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


# --- phases --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "phase"),
    [
        ("usage: launch_server.py [-h] --model-path MODEL_PATH", Phase.ARGS),
        ("launch_server.py: error: unrecognized arguments: --x", Phase.ARGS),
        ("[2025-07-16 05:13:20] Init torch distributed begin.", Phase.INIT),
        ("[2025-07-16 05:13:21] Load weight begin. avail mem=78.50 GB", Phase.LOAD_WEIGHTS),
        (
            "[2025-08-04 10:10:08] KV Cache is allocated. #tokens: 30192, K size: 1.38 GB",
            Phase.KV_CACHE,
        ),
        (
            "[23:17:01 TP3] Capture cuda graph begin. This can take up to several minutes.",
            Phase.CUDA_GRAPH,
        ),
        ("[2024-12-13 01:45:02] INFO:     Application startup complete.", Phase.WARMUP),
        ("[2025-03-19 22:50:20] The server is fired up and ready to roll!", Phase.SERVING),
        (
            "(VllmWorkerProcess pid=13109) INFO 08-19 07:51:12 model_runner.py:1024] Capturing the "
            "model for CUDA graphs.",
            Phase.CUDA_GRAPH,
        ),
        ("INFO 08-19 07:51:08 distributed_gpu_executor.py:56] # GPU blocks: 22982", Phase.KV_CACHE),
        ("[2025-02-21 22:59:28 TP0] Decode batch. #running-req: 1", Phase.SERVING),
        ("[2025-02-21 22:59:28 TP0] Prefill batch. #new-seq: 1", None),
    ],
)
def test_phase_of_line(line: str, phase: Phase | None) -> None:
    assert phase_of_line(line) == phase


def test_last_phase_recorded_logs() -> None:
    assert last_phase(log("sglang_cuda_graph_capture_tp8.log").splitlines()) == Phase.CUDA_GRAPH
    assert last_phase(log("sglang_kv_cache_8ranks.log").splitlines()) == Phase.KV_CACHE
    assert last_phase(log("vllm_cuda_graph_capture_start.log").splitlines()) == Phase.CUDA_GRAPH
    assert last_phase(log("sglang_warmup_assertion.log").splitlines()) == Phase.WARMUP


# --- analyze_log on recorded logs ------------------------------------------------------

SG = "sglang"
CASES = [
    # file, phase, error class, normalized message (@ the innermost own frames: file:function)
    (
        "sglang_cublas_serving.log",
        Phase.SERVING,
        "cublas",
        f"CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx @ {SG}/scheduler.py:run_batch",
    ),
    (
        "sglang_cuda_oom_cuda_graph.log",
        Phase.CUDA_GRAPH,
        "cuda_oom",
        f"CUDA out of memory. Tried to allocate <size> @ {SG}/cuda_graph_runner.py:__init__",
    ),
    (
        "sglang_not_enough_memory.log",
        Phase.KV_CACHE,
        "not_enough_memory",
        "Not enough memory. Please try to increase --mem-fraction-static",
    ),
    (
        "sglang_illegal_address_serving.log",
        Phase.SERVING,
        "illegal_address",
        f"cuda an illegal memory access was encountered @ {SG}/scheduler.py:"
        f"process_batch_result_decode",
    ),
    # the checker that raised it is the place every report of the failure keeps
    (
        "sglang_nccl_init.log",
        Phase.INIT,
        "nccl",
        f"NCCL error: unhandled system error @ {SG}/pynccl_wrapper.py:NCCL_CHECK",
    ),
    (
        "sglang_attribute_error_cuda_graph.log",
        Phase.CUDA_GRAPH,
        "AttributeError",
        "'Glm4MoeSparseMoeBlock' object has no attribute '_enable_a2a_moe' @ "
        f"{SG}/cuda_graph_runner.py:__init__",
    ),
    (
        "sglang_warmup_assertion.log",
        Phase.WARMUP,
        "AssertionError",
        f"res=<Response [<n>]>, res.text='' @ {SG}/server.py:_wait_and_warmup",
    ),
    (
        "sglang_argparse_unrecognized.log",
        Phase.ARGS,
        "argparse",
        "unrecognized arguments: --reasoning_parser",
    ),
    (
        "sglang_argparse_unrecognized_usage.log",
        Phase.ARGS,
        "argparse",
        "unrecognized arguments: --enable-reasoning",
    ),
    (
        "argparse_ambiguous.log",
        Phase.ARGS,
        "argparse",
        "ambiguous option: --expect-worker could match --expect-workers, --expect-workers-max-wait",
    ),
    # a message in the server's own words is named by its first sentence, without the place
    (
        "vllm_free_memory_init.log",
        Phase.INIT,
        "ValueError",
        # the head of the message (server_logs.KEY_WORDS) without its values (VALUE_PARTS)
        "Free memory on device on startup is less than desired GPU memory...",
    ),
    # the tail lost the worker's traceback: the engine's frames printed after it say where
    (
        "vllm_nccl_worker.log",
        Phase.INIT,
        "nccl",
        "NCCL error: unhandled system error @ vllm/engine.py:__init__",
    ),
]


@pytest.mark.parametrize(("name", "phase", "error_class", "message"), CASES)
def test_recorded_log(name: str, phase: Phase, error_class: str, message: str) -> None:
    analysis = analyze_log(log(name))
    assert analysis.signature == Signature(phase, error_class, message), analysis
    assert analysis.excerpt  # the traceback/error lines people read
    assert not any(line.startswith("# source:") for line in analysis.excerpt)


def test_excerpt_is_the_traceback_and_error() -> None:
    analysis = analyze_log(log("sglang_illegal_address_serving.log"))
    assert analysis.excerpt[0].endswith("Traceback (most recent call last):")
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in analysis.excerpt
    assert analysis.raw_message == "cuda an illegal memory access was encountered"
    assert analysis.site == "sglang/scheduler.py:process_batch_result_decode"


def test_truncated_traceback_without_error_is_no_signature() -> None:
    # The stored thread cuts #1479's traceback before its error line: the phase reached is
    # still known, but nothing is invented about the error.
    analysis = analyze_log(log("sglang_cuda_graph_capture_tp8.log"))
    assert analysis.signature is None and analysis.phase == Phase.CUDA_GRAPH


def test_watchdog_what_line() -> None:
    analysis = analyze_log(log("sglang_illegal_address_watchdog.log"))
    assert analysis.error_class == "illegal_address"


def test_no_error_log() -> None:
    analysis = analyze_log(log("sglang_kv_cache_8ranks.log"))
    assert not analysis.failed and analysis.phase == Phase.KV_CACHE


# --- same bug, one signature; different bugs, different signatures ---------------------

_SGLANG_PREFIX = re.compile(r"^\[(?P<ts>[\d: -]+?)(?: (?P<ranks>(?:[A-Z]{2}\d+ ?)+))?\] ")


def as_rank(text: str, rank: int, day: str, pid_shift: int) -> str:
    """A recorded log re-stamped as another rank on another day, with other pids/addresses.

    Ranks of one server print the same lines with their own tags; this is exactly what
    differs between the eight copies of a multi-rank failure.
    """
    out = []
    for line in text.splitlines():
        stamp = f"[{day} 0{rank}:1{rank}:2{rank} DP{rank} TP{rank} EP{rank}] "
        line = _SGLANG_PREFIX.sub(stamp, line)
        line = re.sub(r"0x[0-9a-f]+", lambda m: hex(int(m.group(0), 16) + pid_shift), line)
        line = re.sub(r"pid=(\d+)", lambda m: f"pid={int(m.group(1)) + pid_shift}", line)
        line = re.sub(r"GPU \d", f"GPU {rank}", line)
        out.append(line)
    return "\n".join(out)


@pytest.mark.parametrize(
    "name",
    [
        "sglang_illegal_address_serving.log",
        "sglang_cuda_oom_cuda_graph.log",
        "sglang_illegal_address_watchdog.log",
        "vllm_free_memory_init.log",
    ],
)
def test_eight_ranks_and_two_days_share_one_signature(name: str) -> None:
    one = analyze_log(log(name)).signature
    assert one is not None  # else logs that all get none would pass as sharing one
    eight = "\n".join(as_rank(log(name), r, "2026-01-0" + str(r + 1), 4096 * r) for r in range(8))
    sigquit = (
        "[2026-01-01 00:00:01] Received sigquit from a child process. "
        "It usually means the child failed."
    )
    assert analyze_log(eight).signature == one
    assert analyze_log(sigquit + "\n" + eight).signature == one
    other_day = as_rank(log(name), 3, "2027-12-31", 77)
    assert analyze_log(other_day).signature == one


def test_same_nccl_bug_from_two_reports_has_one_signature() -> None:
    first = analyze_log(log("sglang_nccl_init.log")).signature
    second = analyze_log(log("sglang_nccl_init_other_day.log")).signature
    assert first is not None and first == second


def test_different_bugs_have_different_signatures() -> None:
    sigs = [analyze_log(log(name)).signature for name, *_ in CASES]
    keys = [s.key() for s in sigs if s is not None]
    # the two argparse "unrecognized" logs are different flags; the two NCCL ones are the
    # same message from two servers' own code (SGLang's and vLLM's pynccl): two signatures
    assert len(set(keys)) == len(keys)
    # same class and phase but a different message stays apart
    a = Signature(Phase.CUDA_GRAPH, "AttributeError", "'NoneType' object has no attribute 'dtype'")
    b = analyze_log(log("sglang_attribute_error_cuda_graph.log")).signature
    assert a != b


def test_root_error_skips_sigquit_and_wrappers() -> None:
    text = (
        "[2025-03-11 15:02:53] Received sigquit from a child process. It usually means the "
        "child failed.\n" + log("sglang_illegal_address_serving.log") + "\n"
        "ChildProcessError: Scheduler exited\n"
    )
    assert analyze_log(text).error_class == "illegal_address"


def test_normalize_message() -> None:
    assert normalize_message("Tried to allocate 2.00 GiB") == "Tried to allocate <size>"
    assert normalize_message("[2025-11-17 20:37:08 DP3 TP3 EP3] x at 0x7f84171cc918") == (
        "x at <hex>"
    )
    assert normalize_message('File "a.py", line 147, in f') == 'File "a.py", line <n>, in f'
    assert "cublasGemmStridedBatchedEx" in normalize_message(
        "CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmStridedBatchedEx"
    )


def test_rule_table_is_data() -> None:
    classes = {rule.error_class for rule in ERROR_RULES}
    assert {
        "cublas",
        "cuda_oom",
        "not_enough_memory",
        "illegal_address",
        "nccl",
        "argparse",
        "signal",
    } <= classes
    priorities = [rule.priority for rule in ERROR_RULES]
    assert priorities == sorted(priorities)


# --- judge ---------------------------------------------------------------------------

CUBLAS_LOG = log("sglang_cublas_serving.log")
CUBLAS = analyze_log(CUBLAS_LOG).signature
ATTR = analyze_log(log("sglang_attribute_error_cuda_graph.log")).signature


def test_judge_infra_and_invalid_first() -> None:
    assert judge(RunEvidence(infra_error="ssh: connection reset", log_tail=CUBLAS_LOG), CUBLAS) == (
        Verdict.INFRA,
        None,
    )
    assert judge(RunEvidence(invalid_reason="ambiguous option"), CUBLAS) == (Verdict.INVALID, None)


def test_judge_pass() -> None:
    assert judge(RunEvidence(became_ready=True), CUBLAS) == (Verdict.PASS, None)
    probe = ProbeOutcome(exit_code=0, metric=3100.0, passed=True, condition=">= 3000")
    assert judge(RunEvidence(became_ready=True, probe=probe), None) == (Verdict.PASS, None)


def test_judge_crash_fail_other_and_endpoint() -> None:
    crash = RunEvidence(log_tail=CUBLAS_LOG, exit_code=1, unit_result="exit-code")
    assert judge(crash, CUBLAS) == (Verdict.FAIL, CUBLAS)
    assert judge(crash, ATTR) == (Verdict.OTHER, CUBLAS)
    assert judge(crash, None) == (Verdict.FAIL, CUBLAS)  # judging the bad endpoint itself


def test_judge_timeout_and_hang_target() -> None:
    hang = RunEvidence(
        log_tail=log("sglang_cuda_graph_capture_tp8.log").split("Exception")[0], timed_out=True
    )
    verdict, sig = judge(hang, CUBLAS)
    assert verdict == Verdict.TIMEOUT
    # named by what it waited on: the last milestone before the silence
    assert sig == Signature(
        Phase.CUDA_GRAPH, "hang", f"{HANG_MESSAGE} after 'Capture cuda graph begin'"
    )
    assert judge(hang, sig) == (Verdict.FAIL, sig)
    other_phase = Signature(Phase.KV_CACHE, "hang", HANG_MESSAGE)
    assert judge(hang, other_phase)[0] == Verdict.TIMEOUT
    live = RunEvidence(timed_out=True, last_phase=Phase.WARMUP)
    assert judge(live, None) == (Verdict.FAIL, Signature(Phase.WARMUP, "hang", HANG_MESSAGE))


def test_judge_killed_by_signal_without_log_error() -> None:
    killed = RunEvidence(
        log_tail="[2025-06-10 14:02:31 TP0] Load weight begin. avail mem=78 GB",
        exit_signal="KILL",
        unit_result="signal",
    )
    # Killed, and nothing in its log explains it: someone outside the campaign did it (a
    # person, a watchdog): host trouble, not a verdict about the config.
    assert judge(killed, None) == (Verdict.INFRA, None)
    assert "killed by SIGKILL from outside" in (outside_cause(killed) or "")
    assert judge(RunEvidence(exit_code=137), None) == (Verdict.INFRA, None)
    termed = RunEvidence(exit_code=143, log_tail="Load weight begin.")
    assert judge(termed, None)[0] is Verdict.INFRA
    # The kernel's OOM killer (systemd says oom-kill) is the config's own failure.
    oom = RunEvidence(exit_code=137, unit_result="oom-kill", last_phase=Phase.LOAD_WEIGHTS)
    assert judge(oom, None)[1] == Signature(Phase.LOAD_WEIGHTS, "signal", "SIGKILL (oom-kill)")
    # A crash that SGLang ends with SIGKILL to its own tree has its traceback in the log.
    crash = RunEvidence(log_tail=log("sglang_illegal_address_serving.log"), exit_signal="KILL")
    assert judge(crash, None)[0] is Verdict.FAIL and outside_cause(crash) is None
    # A signal a crash sends itself (SIGSEGV, SIGABRT) stays a failure.
    assert judge(RunEvidence(exit_signal="SEGV"), None)[1] == Signature(
        Phase.INIT, "signal", "SIGSEGV"
    )
    assert signal_name("9/KILL") == signal_name(9) == signal_name("SIGKILL") == "SIGKILL"


def test_judge_probe_threshold_and_crash_under_load() -> None:
    missed = ProbeOutcome(exit_code=0, metric=2400.0, passed=False, condition=">= 3000")
    verdict, sig = judge(RunEvidence(became_ready=True, probe=missed), None)
    assert verdict == Verdict.FAIL
    assert sig == Signature(Phase.PROBE, "probe_threshold", "metric missed >= 3000")
    # the metric value does not enter the signature: another miss is the same failure
    again = ProbeOutcome(exit_code=0, metric=2000.0, passed=False, condition=">= 3000")
    assert judge(RunEvidence(became_ready=True, probe=again), sig) == (Verdict.FAIL, sig)

    crashed = ProbeOutcome(exit_code=1, passed=None, server_alive=False)
    under_load = RunEvidence(
        became_ready=True, probe=crashed, log_tail=log("sglang_illegal_address_serving.log")
    )
    verdict, sig = judge(under_load, None)
    assert sig == Signature(
        Phase.SERVING,
        "illegal_address",
        "cuda an illegal memory access was encountered @ sglang/scheduler.py:"
        "process_batch_result_decode",
    )
    died = RunEvidence(became_ready=True, died_after_ready=True, exit_signal=9)
    assert judge(died, sig) == (Verdict.INFRA, None)  # killed while serving, no error: outside
    segv = RunEvidence(became_ready=True, died_after_ready=True, exit_signal=11)
    assert judge(segv, sig) == (Verdict.OTHER, Signature(Phase.SERVING, "signal", "SIGSEGV"))


def test_judge_reads_128_plus_n_as_a_signal_only_for_a_signal() -> None:
    # a shell's 139 is SIGSEGV; 200 and up are no signal (systemd's own setup statuses,
    # 219/CGROUP would be "signal 91"): an exit status, kept as the number it was
    segv = judge(RunEvidence(exit_code=139), None)[1]
    assert segv == Signature(Phase.INIT, "signal", "SIGSEGV")
    for code in (200, 219, 255):
        sig = judge(RunEvidence(exit_code=code), None)[1]
        assert sig == Signature(Phase.INIT, "exit", f"exit status {code}"), sig


def test_judge_probe_command_error() -> None:
    broken = ProbeOutcome(exit_code=2, passed=None)
    assert judge(RunEvidence(became_ready=True, probe=broken), None)[1] == Signature(
        Phase.PROBE, "probe_error", "probe exit status 2"
    )


# --- orchestrator classify -----------------------------------------------------------


def test_cli_classify_json(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from orchestrator.cli import main

    assert main(["classify", "--json", str(LOGS / "sglang_cuda_oom_cuda_graph.log")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["signature"] == (
        "cuda_graph|cuda_oom|CUDA out of memory. Tried to allocate <size> @ "
        "sglang/cuda_graph_runner.py:__init__"
    )
    assert doc["phase"] == "cuda_graph" and doc["failed"] is True


def test_cli_classify_stdin_and_text(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from orchestrator.cli import main

    # stdin is read as bytes (its .buffer), as a real one is
    stdin = io.TextIOWrapper(io.BytesIO(log("sglang_warmup_assertion.log").encode()))
    monkeypatch.setattr("sys.stdin", stdin)
    assert main(["classify", "-"]) == 0
    out = capsys.readouterr().out
    assert "warmup" in out and "AssertionError" in out and "_wait_and_warmup" in out


def test_cli_classify_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import main

    assert main(["classify", "/nonexistent/server.log"]) == 2
    err = capsys.readouterr().err
    assert "/nonexistent/server.log: no such file" in err and "Traceback" not in err


def test_a_port_clash_is_infra_with_its_own_message() -> None:
    """A server that cannot bind (another process took the port after the port check) says
    nothing about its config: infra, named as a port clash, never a finding."""
    clash = (
        "[2026-11-30 03:00:00] INFO:     Started server process [4242]\n"
        "[2026-11-30 03:00:00] ERROR:    [Errno 98] error while attempting to bind on "
        "address ('127.0.0.1', 30000): address already in use\n"
        "[2026-11-30 03:00:00] INFO:     Waiting for application shutdown.\n"
    )
    ev = RunEvidence(log_tail=clash, exit_code=1)
    assert judge(ev, None) == (Verdict.INFRA, None)
    reason = outside_cause(ev) or ""
    assert reason.startswith("port clash") and "address already in use" in reason
    # torch.distributed's store port taken: the same kind of trouble
    store = RunEvidence(
        log_tail="RuntimeError: The server socket has failed to listen on any "
        "local network address. port: 29500, useIPv6: 0 (errno: 98 - Address "
        "already in use)",
        exit_code=1,
    )
    assert judge(store, None)[0] is Verdict.INFRA
    # a healthy server that logs the phrase is not judged by it
    assert judge(RunEvidence(log_tail=clash, became_ready=True), None) == (Verdict.PASS, None)


# --- the real message under a generic header; hangs named by what they wait on ---------

_API = "(APIServer pid=4021) "
_SCHED_TB = [
    "Traceback (most recent call last):",
    '  File "/opt/venv/bin/vllm", line 10, in <module>',
    "    sys.exit(main())",
    '  File "/opt/venv/lib/python3.12/site-packages/vllm/engine/arg_utils.py", line 1702, in '
    "create_engine_config",
    "    scheduler_config = SchedulerConfig(",
    '  File "/opt/venv/lib/python3.12/site-packages/pydantic/_internal/_dataclasses.py", '
    "line 121, in __init__",
    "    s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)",
    "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig",
]


def _scheduler_error(value_error: str) -> str:
    lines = [
        *_SCHED_TB,
        f"  Value error, {value_error} [type=value_error, input_value="
        "ArgsKwargs((), {'runner_type': 'generate', ...}), input_type=ArgsKwargs]",
        "    For further information visit https://errors.pydantic.dev/2.12/v/value_error",
    ]
    return "\n".join(_API + line for line in lines) + "\n"


def test_three_scheduler_config_errors_get_three_signatures() -> None:
    """vLLM's config validation raises one pydantic header for all of them; the `Value
    error, ...` line under it is the failure (and it is the validator's ValueError)."""
    errors = [
        "max_num_batched_tokens (64) is smaller than max_model_len (2048). This effectively "
        "limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject "
        "longer sequences. Please increase max_num_batched_tokens or decrease max_model_len.",
        "max_num_batched_tokens (64) must be greater than or equal to max_num_seqs (128).",
        "long_prefill_token_threshold (1500) cannot be greater than the max_model_len (1024).",
    ]
    sigs = [analyze_log(_scheduler_error(e)).signature for e in errors]
    assert all(
        s is not None and s.phase == Phase.INIT and s.error_class == "ValueError" for s in sigs
    )
    assert len({s.key() for s in sigs if s}) == 3
    assert sigs[0] is not None and sigs[0].message == (
        "max_num_batched_tokens is smaller than max_model_len"
    )
    assert all("validation error" not in (s.message if s else "") for s in sigs)
    # the same error at other sizes is the same failure
    again = _scheduler_error(errors[1].replace("(64)", "(32)").replace("(128)", "(256)"))
    assert analyze_log(again).signature == sigs[1]


def test_engine_dead_error_printed_on_sigterm_is_not_a_failure() -> None:
    """vLLM prints an EngineDeadError traceback on every SIGTERM: a server that served and
    was stopped shows no failure; a crash before the stop still does."""
    served = [
        "(APIServer pid=88) INFO 11-30 10:00:00 [api_server.py:1886] Starting vLLM API server 0 "
        "on http://0.0.0.0:8000",
        "(APIServer pid=88) INFO:     Application startup complete.",
        '(APIServer pid=88) INFO:     127.0.0.1:40312 - "GET /health HTTP/1.1" 200 OK',
        "(APIServer pid=88) INFO 11-30 10:01:00 [launcher.py:110] Shutting down FastAPI HTTP "
        "server.",
        "(APIServer pid=88) ERROR 11-30 10:01:00 [async_llm.py:480] AsyncLLM output_handler "
        "failed.",
        "(APIServer pid=88) ERROR 11-30 10:01:00 [async_llm.py:480] Traceback (most recent "
        "call last):",
        '(APIServer pid=88) ERROR 11-30 10:01:00 [async_llm.py:480]   File "/opt/venv/lib/'
        'python3.12/site-packages/vllm/v1/engine/async_llm.py", line 439, in output_handler',
        "(APIServer pid=88) ERROR 11-30 10:01:00 [async_llm.py:480]     outputs = await "
        "engine_core.get_output_async()",
        "(APIServer pid=88) ERROR 11-30 10:01:00 [async_llm.py:480] vllm.v1.engine.exceptions."
        "EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the "
        "root cause.",
        "(APIServer pid=88) INFO:     Shutting down",
    ]
    text = "\n".join(served) + "\n"
    assert analyze_log(text).signature is None
    assert judge(RunEvidence(log_tail=text, became_ready=True), None) == (Verdict.PASS, None)
    crashed = (
        served[:3]
        + ["(APIServer pid=88) RuntimeError: CUDA error: an illegal memory access was encountered"]
        + served[3:]
    )
    sig = analyze_log("\n".join(crashed)).signature
    assert sig is not None and sig.error_class == "illegal_address"


def _watchdog(seq: int, rank: int, op: str, numel: int) -> str:
    return (
        f"[rank{rank}]:[E226 11:16:37.170295281 ProcessGroupNCCL.cpp:616] [Rank {rank}] "
        f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}"
        f", NumelIn={numel}, NumelOut={numel}, Timeout(ms)=600000) ran for 600077 "
        "milliseconds before timing out.\n"
    )


def test_nccl_watchdog_timeout_is_named_by_its_collective_and_a_kill_ends_it() -> None:
    start = "[2025-02-26 11:06:01 TP0] Decode batch. #running-req: 3, #token: 900\n"
    a = analyze_log(start + _watchdog(5653, 7, "ALLREDUCE", 58720256))
    b = analyze_log(start + _watchdog(808, 1, "ALLREDUCE", 9801523) + "Killed\n")
    c = analyze_log(start + _watchdog(7753, 0, "_REDUCE_SCATTER_BASE", 544997376))
    assert a.signature is not None and a.kind == "timeout"
    assert a.signature == b.signature  # another run, rank and size; the watchdog's kill
    assert "ALLREDUCE" in a.signature.message and a.signature != c.signature
    stuck = analyze_log(
        start + "[rank6]:[E429 13:55:49.384372190 ProcessGroupNCCL.cpp:1743] "
        "[PG ID 0 PG GUID 0(default_pg) Rank 6] ProcessGroupNCCL's watchdog "
        "got stuck for 480 seconds without making progress in monitoring "
        "enqueued collectives.\nKilled\n"
    )
    assert stuck.kind == "hang" and stuck.signature is not None
    assert stuck.signature.error_class == "hang"


def test_a_store_client_timeout_is_a_timeout_not_a_crash() -> None:
    # A node that never reached rank 0's store (rank 0 died or never listened) waited for
    # it: a consequence of the other node, like the NCCL watchdog's, never a crash.
    analysis = analyze_log(log("torch_store_client_timeout.log"))
    assert analysis.kind == "timeout", analysis
    assert analysis.signature == Signature(
        Phase.INIT, "timeout", "the client socket timed out connecting to the distributed store"
    )


def test_a_silent_hang_is_named_by_its_last_milestone() -> None:
    def run(bs: int, done: int) -> str:
        return (
            "[2025-10-06 20:05:22 DP0 TP0] Capture cuda graph begin. This can take up to "
            "several minutes. avail mem=3.66 GB\n"
            f"Capturing batches (bs={bs} avail_mem=3.10 GB):   {done}%|      | 0/52 "
            "[00:04<?, ?it/s]\n[2025-10-06 20:05:27 DP0 TP0] Registering 0 cuda graph "
            "addresses\n"
        )

    sigs = [
        judge(RunEvidence(log_tail=run(bs, d), timed_out=True), None)[1]
        for bs, d in ((512, 0), (160, 12))
    ]
    assert (
        sigs[0]
        == sigs[1]
        == Signature(Phase.CUDA_GRAPH, "hang", f"{HANG_MESSAGE} after 'Capturing batches'")
    )


def test_nccl_summary_is_named_by_the_warn_line_that_names_the_cause() -> None:
    def crash(warn: str) -> str:
        return (
            f"node1:36748:36748 [0] misc/socket.cc:484 NCCL WARN {warn}\n"
            "node1:36748:36748 [0] NCCL INFO init.cc:1234 -> 2\n"
            "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO "
            "for details)\n"
        )

    refused = analyze_log(
        crash("socketStartConnect: Connect to 10.0.0.5<35221> failed : Connection refused")
    )
    refused2 = analyze_log(
        crash("socketStartConnect: Connect to 10.0.0.9<41007> failed : Connection refused")
    )
    shm = analyze_log(
        crash("Error while creating shared memory segment /dev/shm/nccl-x (size 9637888)")
    )
    assert refused.signature is not None and shm.signature is not None
    assert refused.signature == refused2.signature != shm.signature
    # NCCL prints the WARN before its summary: the first error of the failure names it
    assert refused.signature.message.startswith(
        "NCCL WARN socketStartConnect: Connect to <addr> failed"
    )


def test_a_failure_while_the_server_prints_its_progress_gets_that_phase() -> None:
    """vLLM captures its CUDA graphs inside its KV-cache initialization: the stack says
    kv_cache, the capture progress printed right above the traceback says cuda_graph."""
    text = "\n".join(
        [
            "(EngineCore_DP0 pid=7) INFO 08-01 10:00:00 [kv_cache_utils.py:833] GPU KV cache size: "
            "1,024,000 tokens",
            "(EngineCore_DP0 pid=7) Capturing CUDA graph shapes:  45%|████▌     | 30/67 "
            "[00:05<00:06,  5.9it/s]",
            "(EngineCore_DP0 pid=7) ERROR 08-01 10:00:06 [core.py:700] EngineCore failed to start.",
            "(EngineCore_DP0 pid=7) ERROR 08-01 10:00:06 [core.py:700] Traceback (most recent call "
            "last):",
            '(EngineCore_DP0 pid=7) ERROR 08-01 10:00:06 [core.py:700]   File "/opt/vllm/v1/engine/'
            'core.py", line 83, in __init__',
            "(EngineCore_DP0 pid=7) ERROR 08-01 10:00:06 [core.py:700]     self._initialize_kv_"
            "caches(vllm_config)",
            '(EngineCore_DP0 pid=7) ERROR 08-01 10:00:06 [core.py:700]   File "/opt/vllm/v1/engine/'
            'core.py", line 169, in _initialize_kv_caches',
            "(EngineCore_DP0 pid=7) ERROR 08-01 10:00:06 [core.py:700]     self.model_executor."
            "initialize_from_config(kv_cache_configs)",
            "(EngineCore_DP0 pid=7) ERROR 08-01 10:00:06 [core.py:700] torch.OutOfMemoryError: "
            "CUDA out of memory. Tried to allocate 2.00 GiB.",
        ]
    )
    a = analyze_log(text)
    assert a.signature is not None and a.phase == Phase.CUDA_GRAPH
    # without the progress line the stack alone speaks
    a2 = analyze_log("\n".join(ln for ln in text.splitlines() if "ERROR" in ln))
    assert a2.phase == Phase.KV_CACHE


def test_quoted_names_tell_failures_apart_and_variable_values_do_not() -> None:
    """A short quoted name (a module, a method) is part of what broke; a path, a repo id or
    a printed list of the input's values is not, and the quoting style never matters."""

    def sig(exc: str) -> str:
        log = (
            "Traceback (most recent call last):\n"
            '  File "/opt/x/vllm/engine.py", line 3, in start\n    f()\n' + exc + "\n"
        )
        analysis = analyze_log(log)
        assert analysis.signature is not None, exc
        return str(analysis.signature)

    assert sig("ModuleNotFoundError: No module named 'flash_attn'") != sig(
        "ModuleNotFoundError: No module named 'vllm._C'"
    )
    assert sig("ValueError: Unsupported quantization method 'fp8' for this model here") != sig(
        "ValueError: Unsupported quantization method 'awq' for this model here"
    )
    assert sig("ModuleNotFoundError: No module named 'vllm._C'") == sig(
        'ModuleNotFoundError: No module named "vllm._C"'
    )
    assert sig("OSError: Can't load the config of '/models/a/Llama-3-8B' from the hub") == sig(
        "OSError: Can't load the config of '/root/m/Llama-3-8B' from the hub"
    )
    assert sig(
        "ValueError: Model architectures ['Glm4ForCausalLM'] are not supported for now"
    ) == sig("ValueError: Model architectures ['GlmForCausalLM'] are not supported for now")


def test_an_exception_quoted_in_a_warning_is_advice_not_a_failure() -> None:
    """vLLM warns on every start that a low ulimit 'can cause fd limit errors like
    `OSError: [Errno 24] Too many open files`': advice, not an error it raised. The same
    quote in an ERROR record, or in a report's prose, still counts."""
    warn = (
        "(APIServer pid=12) WARNING 12-01 18:30:36 [system_utils.py:255] Found ulimit of "
        "20000 and failed to automatically increase it. This can cause fd limit errors "
        "like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n\n"
        "(APIServer pid=12) INFO 12-01 18:30:40 [api_server.py:1] Starting vLLM API server\n"
    )
    assert analyze_log(warn).signature is None
    error = warn.replace("WARNING 12-01", "ERROR 12-01")
    assert analyze_log(error).signature is not None


def test_a_printed_set_of_names_signs_alike_in_any_order() -> None:
    """Python prints a set in an order that changes from process to process (string hashes
    are randomized): vLLM's missing-weights error must sign the same on every start."""
    from orchestrator.diagnosis.classify.normalize import normalize_message

    names = [
        "'model.layers.2.post_attention_layernorm.weight'",
        "'model.layers.2.input_layernorm.weight'",
    ]
    msgs = [
        f"ValueError: Following weights were not initialized from checkpoint: "
        f"{{{', '.join(order)}}}"
        for order in (names, names[::-1])
    ]
    from orchestrator.diagnosis.classify.normalize import _mask_variable_quotes

    a, b = (_mask_variable_quotes(normalize_message(x)) for x in msgs)
    assert a == b and a.endswith("{'<v>'}")
    assert _mask_variable_quotes("got {'a': 1}") == "got {'a': 1}"  # a dict stays
