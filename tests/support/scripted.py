"""A scripted stand-in for `Executor` at the campaign's `executor_factory` boundary.

It runs no server: each run's outcome comes from an oracle (lab-style fault rules over the
variant's flags, first match wins) plus faults injected on purpose (the server killed from
outside at a random moment, a port clash, a dropped SSH connection). What it hands back is
judged by the real classifier (`classify.judge`: `judge`, `outside_cause`) from a log tail
written the way the lab server (and SGLang) writes it, so the campaign, the planner, the
store and the classifier are all the real ones; only the host is scripted.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.diagnosis.classify.judge import (
    ProbeOutcome,
    RunEvidence,
    judge,
    outside_cause,
)
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict, relative
from orchestrator.errors import TransportError
from orchestrator.events import Listener
from orchestrator.execution.answers import NO_COMPLETION, not_ready
from orchestrator.execution.contract import RunResult
from orchestrator.execution.inputs import LaunchInputs, launch_inputs
from orchestrator.lab import sglang_text
from orchestrator.lab.scenario_model import ModelInfo
from tests.support import scripted_answers

PHASES = ["init", "load_weights", "kv_cache", "cuda_graph", "warmup"]
TARGET_ERROR = (
    "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling "
    "`cublasGemmStridedBatchedEx(handle, opa, opb, m, n, k, &falpha, a, CUDA_R_16BF, "
    "lda, stridea, b, CUDA_R_16BF, ldb, strideb, &fbeta, c, CUDA_R_16BF, ldc, "
    "stridec, num_batches, compute_type, CUBLAS_GEMM_DEFAULT_TENSOR_OP)`"
)
OTHER_ERROR = "AttributeError: 'NoneType' object has no attribute 'dtype'"
PORT_CLASH = "OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): address already in use"  # noqa: E501


def flag(i: int) -> str:
    return f"feature-{i}"


def write_pair(root: Path, n: int, port: int = 30000) -> tuple[Path, Path]:
    """A good config and a bad one that adds `--feature-0` .. `--feature-{n-1}`."""
    root.mkdir(parents=True, exist_ok=True)
    good = {
        "name": "scripted-good",
        "service": {
            "unit": "scripted.service",
            "exec": "python3 -m sglang.launch_server",
            "flags": {"model-path": "/models/m", "tp-size": 8, "port": port},
        },
        "health": {"path": "/health", "timeout": "60s", "ready_after": 2},
    }
    bad = {
        "name": "scripted-bad",
        "extends": "good.yaml",
        "service": {"flags": {flag(i): True for i in range(n)}},
    }
    (root / "good.yaml").write_text(yaml.safe_dump(good))
    (root / "bad.yaml").write_text(yaml.safe_dump(bad))
    return root / "good.yaml", root / "bad.yaml"


def present(exp: Experiment) -> frozenset[int]:
    flags = exp.flag_map()
    return frozenset(int(k.split("-")[1]) for k in flags if k.startswith("feature-"))


@dataclass(frozen=True)
class Rule:
    """Good + a variant containing `needs` fails in `phase` with `error` (first match wins).

    With `probability` below 1 the rule is flaky, like the lab's: each start draws, and a
    draw that does not come up passes the rule over (the next matching rule may fire)."""

    needs: frozenset[int]
    phase: str
    error: str
    probability: float = 1.0
    #: host environment variables (the hosts file's `env:`) the rule needs as well
    env: frozenset[tuple[str, str]] = frozenset()
    #: a failure of the checkpoint's values (a missing tensor, a NaN): never on dummy weights
    real_weights: bool = False
    #: (knob, x): fires only while the launch's flag or environment variable `knob` is
    #: below x (unset counts as below), as a resource limit does; `above`: over x
    below: tuple[tuple[str, float], ...] = ()
    above: tuple[tuple[str, float], ...] = ()

    def holds(self, knobs: dict[str, object]) -> bool:
        def num(k: str) -> float | None:
            v = knobs.get(k)
            try:
                return None if v is None or isinstance(v, bool) else float(v)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                return None

        return all((x := num(k)) is None or x < lim for k, lim in self.below) and all(
            (x := num(k)) is not None and x > lim for k, lim in self.above
        )


@dataclass
class Oracle:
    rules: list[Rule]
    seed: int = 0  # the draws of flaky rules: one seeded sequence per oracle
    #: (needs, kind): a ready variant containing `needs` answers wrong that way (first
    #: match wins; kinds of tests/support/scripted_answers.py)
    answers: list[tuple[frozenset[int], str]] = field(default_factory=list)
    #: how good's second pass on its start answers (None: as the first: no noise)
    repeat: str | None = None
    #: a probe's figures: (variant, rng, runs) -> one start's `runs` figures, warm-up
    #: first (e.g. a lab `MetricModel.start`); None: the probe is not scripted
    metric: Callable[[frozenset[int], random.Random, int], list[float]] | None = None
    #: the probe's command fails (its exit status) on a variant containing this set, or
    #: with `probe_fails_exactly`, on this variant alone
    probe_fails: frozenset[int] | None = None
    probe_fails_exactly: bool = False

    def answer_kind(self, variant: frozenset[int]) -> str | None:
        return next((kind for needs, kind in self.answers if needs <= variant), None)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.lock = threading.Lock()

    def outcome(
        self,
        variant: frozenset[int],
        env: Iterable[tuple[str, str]] = (),
        weights: str = "real",
        knobs: dict[str, object] | None = None,
    ) -> Rule | None:
        have = set(env)
        for rule in self.rules:
            if not rule.needs <= variant or not rule.env <= have:
                continue
            if knobs is not None and not rule.holds(knobs):
                continue
            if rule.real_weights and weights != "real":
                continue
            if rule.probability < 1.0:
                with self.lock:
                    if self.rng.random() >= rule.probability:
                        continue
            return rule
        return None

    def target_terms(self, target_error: str = TARGET_ERROR) -> list[frozenset[int]]:
        return [r.needs for r in self.rules if r.error == target_error]


@dataclass
class Faults:
    """What goes wrong on the host, drawn per run from a seeded generator."""

    kill: float = 0.0  # the server killed by SIGKILL from outside at a random moment
    port_clash: float = 0.0  # another process took the port before the server bound it
    ssh_drop: float = 0.0  # the connection dropped past the reconnect budget
    seed: int = 0
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.lock = threading.Lock()

    def draw(self) -> str | None:
        with self.lock:
            x = self.rng.random()
            for name, p in (
                ("kill", self.kill),
                ("port_clash", self.port_clash),
                ("ssh_drop", self.ssh_drop),
            ):
                if x < p:
                    return name
                x -= p
            return None

    def moment(self, upto: int) -> int:
        with self.lock:
            return self.rng.randrange(upto + 1)


def _lines(lines: Iterable[sglang_text.Line]) -> list[str]:
    out = []
    for rank, text in lines:
        if rank == sglang_text.RAW:
            out.append(text)
        elif rank is None:
            out.append(f"[2026-11-30 03:00:00] {text}")
        else:
            out.append(f"[2026-11-30 03:00:00 TP{rank}] {text}")
    return out


@functools.lru_cache(maxsize=16)
def _startup_log(upto: int) -> tuple[str, ...]:
    """The milestone lines of the first `upto` phases, as the lab server prints them."""
    model = ModelInfo()
    flags = {"tp-size": 2}
    n = sglang_text.numbers(model, flags, {}, 2)
    out: list[str] = []
    for phase in PHASES[:upto]:
        out += _lines(sglang_text.phase_begin(phase, n, model, flags, "127.0.0.1", 30000, 4242))
        out += _lines(sglang_text.phase_end(phase, n, model, 1.0))
    return tuple(out)


def startup_log(upto: int) -> list[str]:
    """The milestone lines of the first `upto` phases, as the lab server prints them."""
    return list(_startup_log(upto))


class ScriptedExecutor:
    """The `Executor` interface (open, close, run, cancel_event) over an oracle and faults."""

    def __init__(
        self, host: Host, oracle: Oracle, faults: Faults, listener: Listener | None = None
    ) -> None:
        self.host = host
        self.oracle = oracle
        self.faults = faults
        self.cancel_event = threading.Event()
        self.runs = 0
        #: (run id, asked twice) of every run asked the answers check
        self.asked: list[tuple[str, bool]] = []

    def open(self) -> ScriptedExecutor:
        return self

    def close(self, *, restore: bool = True) -> list[str]:
        return []

    def __enter__(self) -> ScriptedExecutor:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self,
        exp: Experiment,
        *,
        run_id: str,
        label: str = "",
        target: Signature | None = None,
        env_keys: Iterable[str] = (),
        good_metric: float | None = None,
        ask_twice: bool = False,
    ) -> RunResult:
        self.runs += 1
        variant = present(exp)
        # (the weights only when they matter: oracles of other tests take two arguments)
        if any(r.below or r.above for r in getattr(self.oracle, "rules", ())):
            # rules on a knob's value (a resource limit): the launch's flags and environment
            rule = self.oracle.outcome(
                variant, self.host.env, exp.weights, knobs=exp.flag_map() | exp.env_map()
            )
        else:
            rule = (
                self.oracle.outcome(variant, self.host.env, exp.weights)
                if exp.weights != "real"
                else self.oracle.outcome(variant, self.host.env)
            )
        fault = self.faults.draw()
        crash_at = PHASES.index(rule.phase) if rule else len(PHASES)
        log = startup_log(min(crash_at, len(PHASES)))
        evidence: RunEvidence
        if fault == "ssh_drop":
            evidence = RunEvidence(
                infra_error=str(
                    TransportError(f"{self.host.name}: connection lost (Connection reset by peer)")
                )
            )
        elif fault == "port_clash":
            log = startup_log(4) + _lines(
                sglang_text.traceback_lines("warmup", PORT_CLASH.format(port=exp.port))
            )
            evidence = RunEvidence(log_tail="\n".join(log), exit_code=1)
        elif fault == "kill" and (at := self.faults.moment(crash_at + 1)) <= crash_at:
            # killed before its own crash (or before it was ready, or while serving)
            if at == len(PHASES) and rule is None:
                evidence = RunEvidence(
                    log_tail="\n".join(log),
                    became_ready=True,
                    died_after_ready=True,
                    exit_signal="KILL",
                )
            else:
                evidence = RunEvidence(
                    log_tail="\n".join(startup_log(at)),
                    exit_signal="KILL",
                    last_phase=Phase(PHASES[min(at, 4)]),
                )
        elif rule is None:
            evidence = RunEvidence(log_tail="\n".join(log), became_ready=True)
        else:
            log += _lines(sglang_text.traceback_lines(rule.phase, rule.error))
            evidence = RunEvidence(
                log_tail="\n".join(log), exit_signal="KILL", last_phase=Phase(rule.phase)
            )
        self.faults.log.append(f"{run_id} {sorted(variant)} {fault}")
        evidence, host_record = self._probe(exp, variant, evidence, good_metric)
        verdict, sig = judge(evidence, target)
        detail = evidence.infra_error or outside_cause(evidence) or ""
        answers = None
        check = exp.answers
        if (
            verdict is Verdict.PASS
            and check is not None
            and (check.enabled or check.ready_completion)
        ):
            answers = scripted_answers.record(
                exp.answers,
                getattr(self.oracle, "answer_kind", lambda v: None)(variant),
                twice=ask_twice,
                repeat_kind=getattr(self.oracle, "repeat", None),
            )
            self.asked.append((run_id, ask_twice))
            why = not_ready(answers)
            if why is not None:  # as the executor judges it
                sig, detail = NO_COMPLETION, why
                verdict = relative(Verdict.FAIL, sig, target)
        return RunResult(
            run_id=run_id,
            host=self.host.name,
            host_class=self.host.host_class,
            experiment=exp,
            label=label,
            verdict=verdict,
            signature=sig,
            started_at=time.time(),
            duration_s=0.0,
            log_tail=evidence.log_tail,
            detail=detail,
            last_phase=evidence.last_phase,
            inputs=self.inputs(exp),
            answers=answers,
            probe_metric=evidence.probe.metric if evidence.probe else None,
            host_record=host_record,
        )

    def _probe(
        self,
        exp: Experiment,
        variant: frozenset[int],
        evidence: RunEvidence,
        good_metric: float | None,
    ) -> tuple[RunEvidence, dict[str, object] | None]:
        """The scripted probe of a ready start: the evidence with its outcome, and its
        figures as the executor records them."""
        probe, draw = exp.probe, getattr(self.oracle, "metric", None)
        if probe is None or draw is None or not evidence.became_ready or evidence.exit_signal:
            return evidence, None
        fails = self.oracle.probe_fails
        exact = self.oracle.probe_fails_exactly
        exit_code = (
            2 if fails is not None and (fails == variant if exact else fails <= variant) else 0
        )
        with self.oracle.lock:
            figures = [] if exit_code else list(draw(variant, self.oracle.rng, probe.runs))
        metric, passed = probe.judge(figures, good_metric) if figures else (None, None)
        outcome = ProbeOutcome(
            exit_code=exit_code, metric=metric, passed=passed, condition=probe.pass_if
        )
        record = {"probe": {"values": figures, "warmup": probe.warmup, "metric": metric}}
        return dataclasses.replace(evidence, probe=outcome), record

    def inputs(self, exp: Experiment) -> LaunchInputs:
        """What reaches the scripted server besides its config: the host's `env:` (the
        oracle reads it) and a fixed environment."""
        return launch_inputs(self.host, unit="", environment="scripted")


def factory(oracle: Oracle, faults: Faults) -> Callable[..., ScriptedExecutor]:
    def make(host: Host, service: str, campaign: str, listener: Listener) -> ScriptedExecutor:
        return ScriptedExecutor(host, oracle, faults, listener)

    return make


def host(name: str = "scripted") -> Host:
    return Host(name=name, address="192.0.2.1", host_class=name, service_manager="process")


__all__ = [
    "Faults",
    "Oracle",
    "Rule",
    "ScriptedExecutor",
    "Verdict",
    "factory",
    "host",
    "present",
    "write_pair",
]


def first_draw_passes(p: float = 0.5) -> int:
    """An `Oracle` seed whose first draw (the bad endpoint's, when good matches no rule)
    passes a rule of probability `p`."""
    import random

    return next(s for s in range(100) if random.Random(s).random() >= p)
