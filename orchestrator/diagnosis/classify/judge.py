"""Judging a run: from a whole run's evidence (log tail, exit, signal, probe) to a
verdict and a signature; the part the executors use."""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.diagnosis.classify.analyze import LogAnalysis, analyze_log
from orchestrator.diagnosis.classify.lines import last_milestone, last_phase, strip_prefix
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict

# ---------------------------------------------------------------------------------------
# Judging a run
# ---------------------------------------------------------------------------------------

HANG_MESSAGE = "no readiness before the deadline"


def hang_message(log_tail: str) -> str:
    """A silent hang named by what it waited on: the last milestone before the silence."""
    last = last_milestone(log_tail[-2_000_000:].splitlines()) if log_tail else None
    return f"{HANG_MESSAGE} after '{last}'" if last else HANG_MESSAGE


_SIGNAL_NAMES = {
    1: "SIGHUP",
    2: "SIGINT",
    3: "SIGQUIT",
    4: "SIGILL",
    6: "SIGABRT",
    7: "SIGBUS",
    8: "SIGFPE",
    9: "SIGKILL",
    11: "SIGSEGV",
    13: "SIGPIPE",
    15: "SIGTERM",
}


def signal_name(value: str | int) -> str:
    """'KILL', 'SIGKILL', 9, '9/KILL' -> 'SIGKILL' (unknown values are kept as given)."""
    text = str(value).strip()
    if "/" in text:  # systemd's "status=9/KILL"
        text = text.split("/", 1)[1]
    if text.isdigit():
        return _SIGNAL_NAMES.get(int(text), f"signal {text}")
    text = text.upper()
    return text if text.startswith("SIG") else f"SIG{text}"


@dataclass(frozen=True)
class ProbeOutcome:
    """The optional load/benchmark probe run after the server became ready."""

    exit_code: int | None = None
    metric: float | None = None
    passed: bool | None = None  # None: no pass condition was evaluated
    condition: str | None = None  # the config's pass_if, e.g. ">= 3000"
    server_alive: bool = True  # checked after the probe
    #: the probe ran but printed no figure its metric regex finds: the probe's failure,
    #: never a slow server
    no_metric: bool = False


@dataclass(frozen=True)
class RunEvidence:
    """Everything the executor observed about one run, for `judge`."""

    log_tail: str = ""
    became_ready: bool = False
    died_after_ready: bool = False  # ready, then the unit/process went away
    exit_code: int | None = None
    exit_signal: str | int | None = None  # "KILL", "SIGKILL", 9
    unit_result: str | None = None  # systemd Result=: exit-code, signal, oom-kill, ...
    timed_out: bool = False
    time_limit: bool = False  # ended by the scheduler's time limit, not by our health deadline
    stopped_by: str | None = None  # the host's record that someone stopped the server
    last_phase: Phase | None = None  # tracked live from the log; the log is used otherwise
    invalid_reason: str | None = None  # preflight or read-back mismatch
    infra_error: str | None = None
    probe: ProbeOutcome | None = None


def _process_signature(evidence: RunEvidence, phase: Phase) -> Signature:
    """A signature from how the process ended, for crashes the log does not explain."""
    result = (evidence.unit_result or "").lower()
    if result == "oom-kill":
        return Signature(phase, "signal", "SIGKILL (oom-kill)")
    if evidence.exit_signal is not None:
        return Signature(phase, "signal", signal_name(evidence.exit_signal))
    shell_signal = _shell_signal(evidence.exit_code)
    if shell_signal is not None:
        return Signature(phase, "signal", signal_name(shell_signal))
    if evidence.exit_code is not None:
        return Signature(phase, "exit", f"exit status {evidence.exit_code}")
    return Signature(phase, "exit", result or "exited")


def _crash_signature(evidence: RunEvidence, analysis: LogAnalysis, phase: Phase) -> Signature:
    silent = analysis.error_class == "child_died"  # the log only says a child went away
    known_exit = (
        evidence.exit_signal is not None
        or evidence.exit_code is not None
        or bool(evidence.unit_result)
    )
    if analysis.signature is not None and not (silent and known_exit):
        return analysis.signature
    return _process_signature(evidence, analysis.phase or phase if silent else phase)


def _verdict_for(sig: Signature, target: Signature | None) -> Verdict:
    if target is None or sig == target:
        return Verdict.FAIL
    return Verdict.OTHER


# Signals a server does not send itself when it crashes: SGLang's kill_process_tree sends
# SIGKILL to its own tree too, but only after a child's traceback is in the log.
OUTSIDE_SIGNALS = frozenset({"SIGKILL", "SIGTERM", "SIGINT", "SIGHUP"})
_KILL_NOTICES = frozenset({"Killed", "Terminated"})
_PORT_CLASH_RE = re.compile(
    r"address already in use|EADDRINUSE|errno:? ?98\b|\[Errno 98\]", re.IGNORECASE
)


#: the server's own words for a stop signal it received (and then, often, exit 0); never
#: SIGQUIT, which SGLang's parent gets from a child that failed
_STOP_NOTICE_RE = re.compile(
    r"\b(?:received|caught|got)\s+(?:signal\s+)?(?:SIGTERM|SIGINT|SIGHUP|15|2|1)\b"
    r"|\b(?:SIGTERM|SIGINT|SIGHUP) received\b"  # SGLang's TokenizerManager
    r"|Shutting down FastAPI HTTP server",
    re.IGNORECASE,
)  # vLLM's, on SIGTERM/SIGINT


def _died_by_signal(evidence: RunEvidence) -> str | None:
    if evidence.exit_signal is not None:
        return signal_name(evidence.exit_signal)
    shell_signal = _shell_signal(evidence.exit_code)
    return signal_name(shell_signal) if shell_signal is not None else None


#: the highest signal number (Linux: SIGRTMAX); a status of 128 + more is no signal's
MAX_SIGNAL = 64


def _shell_signal(exit_code: int | None) -> int | None:
    """N when `exit_code` is a shell's or runtime's 128 + N for death by signal N, else None
    (systemd's own statuses 200 and up, `219/CGROUP`, are no signal: 219 is not SIGRT)."""
    if exit_code is None or not 128 < exit_code <= 128 + MAX_SIGNAL:
        return None
    return exit_code - 128


def port_clash(log: str) -> str | None:
    """'port clash: ...' with the log's own line, when the server could not bind an
    address because another process holds it."""
    m = _PORT_CLASH_RE.search(log)
    if m is None:
        return None
    start = log.rfind("\n", 0, m.start()) + 1
    end = log.find("\n", m.end())
    line = strip_prefix(log[start : end if end >= 0 else len(log)]).strip()[:200]
    return f"port clash: another process holds an address the server binds ({line})"


#: failures of the host under the server, whatever its config: the GPU's memory or link
#: reports a hardware error (NVIDIA: "should be recovered by a new run"; repeated, the
#: hardware is broken), or the disk is full
_HOST_FAULT_RE = re.compile(
    r"uncorrectable ECC error|ECC_UNCORRECTABLE|uncorrectable NVLink error"
    r"|NVLINK_UNCORRECTABLE|No space left on device",
    re.IGNORECASE,
)


def host_fault(sig: Signature | None) -> str | None:
    """'the host failed under the server (...)' when the run's own failure is one no
    config causes (a GPU's uncorrectable ECC or NVLink error, a full disk), else None."""
    if sig is None or not _HOST_FAULT_RE.search(sig.message):
        return None
    return (
        f"the host failed under the server ({sig.error_class}: {sig.message}); not a "
        "verdict about the config"
    )


def outside_cause(evidence: RunEvidence, analysis: LogAnalysis | None = None) -> str | None:
    """Why a failed run says nothing about its config, or None. `analysis`: the log's
    analysis when the caller has it already (judge does), else it is made when needed.

    Three things end a run from outside the campaign: a port the server binds taken by
    another process (it binds late, after the port check), the host failing under it (a
    GPU's uncorrectable ECC or NVLink error, a full disk: `host_fault`), and a kill nobody
    in the campaign sent (a person, another tool, a host watchdog): the server died by
    SIGKILL, SIGTERM, SIGINT or SIGHUP and its log shows no failure of its own. Such runs
    are `infra`: retried, never cached, never a finding. The kernel's OOM killer, which
    systemd reports as `oom-kill`, stays a failure of the config.
    """
    if evidence.infra_error or evidence.invalid_reason:
        return None
    died = not evidence.became_ready and not evidence.timed_out
    died = (
        died
        or evidence.died_after_ready
        or (evidence.probe is not None and not evidence.probe.server_alive)
    )
    if not died:
        return None
    tail = evidence.log_tail[-200_000:]
    clash = port_clash(tail)
    if clash is not None:
        return f"{clash}; not a verdict about the config"
    analysis = analysis or analyze_log(tail)
    fault = host_fault(analysis.signature)
    if fault is not None:
        return fault
    if (evidence.unit_result or "").lower() == "oom-kill":
        return None
    sig = _died_by_signal(evidence)
    # A server that handles the stop signal may exit 0: then who sent it is told by the host
    # (systemd logged a stop of the unit) or by the server's own notice of the signal.
    notice = _STOP_NOTICE_RE.search(tail)
    stopped = evidence.stopped_by or (f"its log: {notice[0]!r}" if notice else None)
    if sig in OUTSIDE_SIGNALS or stopped:
        own = analysis.signature
        # A shell's "Killed" line is the kill itself, not a failure of the server; a parent's
        # "a child process died" note is the kill seen from the parent. A failure of its own
        # (a crash, then an exit 0 on its own) stays the config's.
        if own is None or _kill_notice(own) or own.error_class == "child_died":
            if sig in OUTSIDE_SIGNALS:
                return (
                    f"the server was killed by {sig} from outside the campaign (its log "
                    "shows no failure of its own: a person, a watchdog, the kernel's OOM "
                    "killer?); not a verdict about the config"
                )
            return (
                f"the server was stopped from outside the campaign ({stopped}) and its "
                "log shows no failure of its own; not a verdict about the config"
            )
    return None


#: the error class of a launch that never reached the server (`launch_failure`)
LAUNCH_CLASS = "launch"
#: a shell's exit status when it could not run a command: 126 found but not runnable,
#: 127 not found (POSIX; `exec` of a launch script, `env`, `srun` report the same)
LAUNCHER_EXITS = frozenset({126, 127})
#: how a launcher says it could not run a command (dash, bash, env, execve's errors)
_CANNOT_RUN_RE = re.compile(
    r"(?:not found|No such file or directory|[Pp]ermission denied|cannot execute[^\n]*"
    r"|Exec format error|Is a directory)\s*$"
)
#: a launch script's own place in the line: "/run/launch.sh: 4: ", "launch.sh: line 4: "
_SCRIPT_PLACE_RE = re.compile(r"^\S+: (?:line )?\d+: ")


def launch_failure(evidence: RunEvidence, analysis: LogAnalysis | None = None) -> Signature | None:
    """The signature of a launch that never reached the server: the launcher (the launch
    script's shell, systemd's `ExecStart`, a job's `srun`) could not run the server's
    command at all (a typo'd interpreter, a build that is not installed, a file that is not
    executable). It exited 126 or 127 with its own words for that, and the server printed
    nothing of a startup. Such a start says nothing about the config's flags: `invalid`,
    never a failure to bisect (None when the server ran)."""
    if evidence.became_ready or evidence.exit_code not in LAUNCHER_EXITS:
        return None
    analysis = analysis or analyze_log(evidence.log_tail)
    if analysis.reached is not None or evidence.last_phase not in (None, Phase.INIT):
        return None  # the server got as far as its own startup: its own exit status
    for line in reversed(evidence.log_tail.splitlines()):
        text = strip_prefix(line).strip()
        if text and _CANNOT_RUN_RE.search(text):
            said = _SCRIPT_PLACE_RE.sub("", text, count=1)
            return Signature(Phase.INIT, LAUNCH_CLASS, said[:300])
    return None


def launch_detail(sig: Signature, exit_code: int | None, build: str | None = None) -> str:
    """What a user reads about a launch that never reached the server, and what to check."""
    status = f" (exit {exit_code})" if exit_code is not None else ""
    check = (
        f"is build '{build}' installed on the host (the hosts file's `builds:`)?"
        if build
        else "check the config's `service.exec` on the host"
    )
    return (
        f"the launch never reached the server: {sig.message}{status}; not a verdict about "
        f"the config's flags ({check})"
    )


def _kill_notice(sig: Signature) -> bool:
    """The log's failure is only a shell's notice of a kill (`Killed`, `Terminated`)."""
    return sig.error_class == "signal" and sig.message in _KILL_NOTICES


def judge(evidence: RunEvidence, target: Signature | None) -> tuple[Verdict, Signature | None]:
    """The verdict of one run, and its failure signature (None for pass/infra, and for
    invalid unless the server itself refused its command line: then the `args` one).

    `target` is the campaign's target failure; None while judging the bad endpoint
    itself, in which case any failure (crash, hang, missed probe) is FAIL and its
    signature becomes the target.
    """
    if evidence.infra_error:
        return Verdict.INFRA, None
    if evidence.invalid_reason:
        return Verdict.INVALID, None
    analysis = analyze_log(evidence.log_tail)
    if outside_cause(evidence, analysis) is not None:
        return Verdict.INFRA, None
    launch = launch_failure(evidence, analysis)
    if launch is not None:
        return Verdict.INVALID, launch
    reached = evidence.last_phase or analysis.reached or Phase.INIT

    if evidence.timed_out and not evidence.became_ready:
        # A log error during the wait is a crash that left the unit hanging; report it.
        # Not a shell's kill notice alone (`Killed`): that is how the hang ended (a
        # watchdog, the deadline's stop), so the hang is named by what it waited on.
        if analysis.signature is not None and not _kill_notice(analysis.signature):
            sig = analysis.signature
            return _verdict_for(sig, target), sig
        sig = Signature(reached, "hang", hang_message(evidence.log_tail))
        # The scheduler's time limit ended it before the health deadline could say anything
        # (a slow start, a short --time): no hang was shown, whatever the target.
        if evidence.time_limit:
            return Verdict.TIMEOUT, sig
        if target is None or sig == target:
            return Verdict.FAIL, sig
        return Verdict.TIMEOUT, sig

    if not evidence.became_ready:
        sig = _crash_signature(evidence, analysis, reached)
        if sig.phase is Phase.ARGS:
            # The server refused its command line (argparse: usage, `error:`, exit 2):
            # rejected before it could run, whether or not the preflight saw it coming.
            return Verdict.INVALID, sig
        return _verdict_for(sig, target), sig

    probe = evidence.probe
    died = evidence.died_after_ready or (probe is not None and not probe.server_alive)
    if died:
        # The server crashed under load: a serving crash, named by the log's error.
        base = _crash_signature(evidence, analysis, Phase.SERVING)
        sig = Signature(Phase.SERVING, base.error_class, base.message)
        return _verdict_for(sig, target), sig

    if probe is None:
        return Verdict.PASS, None
    missed = probe.exit_code not in (None, 0) or probe.passed is False or probe.no_metric
    if missed and analysis.signature is not None:
        # The probe failed and the server logged an error under its load: a crash under
        # load that had not ended the process yet when it was looked at (vLLM's engine dies
        # first; its API server exits, with status 0, seconds later). Named by the error.
        sig = Signature(Phase.SERVING, analysis.signature.error_class, analysis.signature.message)
        return _verdict_for(sig, target), sig
    if probe.exit_code not in (None, 0):
        sig = Signature(Phase.PROBE, "probe_error", f"probe exit status {probe.exit_code}")
        return _verdict_for(sig, target), sig
    if probe.no_metric:
        sig = Signature(Phase.PROBE, "probe_error", "probe printed no value its metric matches")
        return _verdict_for(sig, target), sig
    if probe.passed is False:
        bar = probe.condition or "its bar"
        sig = Signature(Phase.PROBE, "probe_threshold", f"metric missed {bar}")
        return _verdict_for(sig, target), sig
    return Verdict.PASS, None


def resign(old: Signature | None, log_tail: str) -> Signature | None:
    """The signature a run recorded as `old` gets from this version of the classifier.

    Only the stored log tail is left of the run, so `judge` is replayed from what the old
    signature says about it: a probe miss stays what it was; a hang with nothing in the log
    stays a hang unless the log now names one; a crash after readiness stays a serving crash;
    a crash named only by its exit status keeps that name unless the log now explains it.
    """
    if old is None or old.error_class in ("probe_error", "probe_threshold"):
        return old
    analysis = analyze_log(log_tail) if log_tail else None
    new = analysis.signature if analysis is not None else None
    if new is None:
        if old.error_class == "hang" and old.message == HANG_MESSAGE:
            return Signature(old.phase, "hang", hang_message(log_tail))
        return old
    if old.phase == Phase.SERVING and new.phase != Phase.SERVING:
        return Signature(Phase.SERVING, new.error_class, new.message)
    return new


# `last_phase` (lines) is named here too: the executors watch a live log's progress with
# it, and this module is all of the classifier they import
__all__ = [
    "HANG_MESSAGE",
    "LAUNCH_CLASS",
    "OUTSIDE_SIGNALS",
    "ProbeOutcome",
    "RunEvidence",
    "launch_detail",
    "launch_failure",
    "hang_message",
    "host_fault",
    "judge",
    "last_phase",
    "outside_cause",
    "port_clash",
    "resign",
    "signal_name",
]
