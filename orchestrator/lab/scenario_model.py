"""Lab scenarios, the model: a scenario's rules, their conditions and how they match a
command line and environment, the random draw of a flaky rule, and the server's figures.

The file format and its checks are `orchestrator.lab.scenario` (its docstring tells the
matching rules in full). Like it, this module runs inside minimal hosts that only have
python3 and PyYAML.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.lab import flags as flagcat

#: Startup phases in the order the server goes through them.
STARTUP_PHASES = ("init", "load_weights", "kv_cache", "cuda_graph", "warmup")
#: Phases a fault rule may name: argument parsing, startup, and serving (under load).
RULE_PHASES = ("args", *STARTUP_PHASES, "serving")
DEFAULT_STARTUP = {
    "init": 0.3,
    "load_weights": 1.0,
    "kv_cache": 0.2,
    "cuda_graph": 0.6,
    "warmup": 0.2,
}
EFFECTS = ("crash", "hang")
#: what an `answers:` rule does to the answers it takes
ANSWER_EFFECTS = ("garbled", "wrong", "drift")
OPERATORS = ("lt", "le", "gt", "ge", "ne", "in")

#: Flags that steer the simulation, not the simulated server: never part of a fault's
#: random draw, so a flaky rule depends on the seed and the server's own flags only.
#: the OpenAI routes a lab server may serve (`routes:`): /v1/completions, /v1/chat/completions
ROUTES = ("completions", "chat")
LAB_ONLY_FLAGS = ("scenario", "seed", "time-scale")
#: (nor the load format: a dummy-weight start draws as the real one of the same flags does)
_NOT_IN_DRAW = (*LAB_ONLY_FLAGS, "port", "host", "load-format")
#: the load format that loads random weights of the checkpoint's shapes (SGLang and vLLM)
DUMMY = "dummy"

_INT = re.compile(r"^[-+]?\d+$")
_FLOAT = re.compile(r"^[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?$")

FlagValue = Any  # True (switch), int, float, str, or a list of int/float/str


class ScenarioError(Exception):
    """A scenario file that cannot be used; the message is one line for the user."""


def coerce(text: str) -> int | float | str:
    """A command-line value as the server would read it: int or float when it looks so."""
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    return text


# ---------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Condition:
    """One condition on one flag or environment variable."""

    key: str
    op: str  # eq, present, absent, lt, le, gt, ge, ne, in
    value: Any = None
    #: keys inside the flag's JSON object value (a key-path condition); () for the flag
    path: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return ".".join((self.key, *self.path))

    def holds(self, actual: FlagValue | None, present: bool, text: str | None = None) -> bool:
        """Whether the condition holds of a value (`actual`, read as the server reads it)
        whose text is `text` (an environment variable's own; None: rendered from actual)."""
        if self.op == "present":
            return present
        if self.op == "absent":
            return not present
        if actual is None:
            # Absent and no default: only "not equal to X" can be said of it.
            return self.op == "ne"
        if self.op == "eq":
            return _equal(actual, self.value, text)
        if self.op == "ne":
            return not _equal(actual, self.value, text)
        if self.op == "in":
            return any(_equal(actual, v, text) for v in self.value)
        if not is_number(actual):
            return False
        return {
            "lt": actual < self.value,
            "le": actual <= self.value,
            "gt": actual > self.value,
            "ge": actual >= self.value,
        }[self.op]


@dataclass(frozen=True)
class When:
    """All conditions of a rule: on flags and on environment variables."""

    flags: tuple[Condition, ...] = ()
    env: tuple[Condition, ...] = ()
    #: conditions on the server's version, by its position in the scenario's `versions:`
    version: tuple[Condition, ...] = ()

    def holds(
        self,
        flags: Mapping[str, FlagValue],
        env: Mapping[str, str],
        defaults: Mapping[str, Any] | None = None,
        version: int | None = None,
    ) -> bool:
        defaults = defaults or {}
        for c in self.version:
            if not c.holds(version, version is not None):
                return False
        for c in self.flags:
            if c.path:
                present, actual = json_key(flags.get(c.key), c.path)
                if not present:
                    actual = defaults.get(c.name)
            else:
                present = c.key in flags
                actual = flags[c.key] if present else defaults.get(c.key)
            if not c.holds(actual, present):
                return False
        for c in self.env:
            present = c.key in env
            raw = env[c.key] if present else None
            if not c.holds(coerce(raw) if raw is not None else None, present, raw):
                return False
        return True


@dataclass(frozen=True)
class Frame:
    """An innermost traceback frame a rule may supply to make its crash look like the bug."""

    file: str
    line: int
    func: str
    code: str


@dataclass(frozen=True)
class Rule:
    index: int
    when: When
    phase: str
    effect: str = "crash"
    error: str = ""
    after_requests: int | None = None
    probability: float | None = None
    exit_code: int = 1
    kill: bool = False
    frames: tuple[Frame, ...] = ()
    #: a failure of the checkpoint's values (a missing tensor, a NaN): never with dummy weights
    needs_real_weights: bool = False


@dataclass(frozen=True)
class AnswerRule:
    """An `answers:` rule: the server starts and serves, but answers wrong."""

    index: int
    when: When
    effect: str  # garbled, wrong, drift
    #: the share of the prompts it takes (of a known prompt set: exactly that share)
    fraction: float = 1.0
    #: only while at least this many requests are in flight
    concurrency: int | None = None
    #: only for prompts at least this long (usage.prompt_tokens / characters)
    min_prompt_tokens: int | None = None
    min_prompt_chars: int | None = None
    #: flaky: holds on this share of the starts (drawn from the start's seed)
    probability: float | None = None
    #: drift: the first position whose greedy token may change
    from_token: int = 16

    def takes(self, in_flight: int, prompt_tokens: int, prompt_chars: int) -> bool:
        """Whether a request with these figures is one this rule applies to."""
        return (
            (self.concurrency is None or in_flight >= self.concurrency)
            and (self.min_prompt_tokens is None or prompt_tokens >= self.min_prompt_tokens)
            and (self.min_prompt_chars is None or prompt_chars >= self.min_prompt_chars)
        )


@dataclass(frozen=True)
class Factor:
    """Multiplies the metric when its conditions all hold: a `when` naming several flags is
    an effect those flags have only together; every matching factor applies (they multiply)."""

    when: When
    multiply: float


@dataclass(frozen=True)
class MetricNoise:
    """How a benchmark's figure varies: a log-normal variation between starts (`between`,
    a CV) and between the runs of one start (`within`), the first `warmup_runs` runs of a
    start worse by `warmup_worse` (halving on each next one), and an outlier run, worse by
    `outlier_worse`, with probability `outlier_probability`. Worse is slower for a
    throughput and later for a latency. All zero: the figure itself, every time."""

    within: float = 0.0
    between: float = 0.0
    warmup_runs: int = 0
    warmup_worse: float = 0.0
    outlier_probability: float = 0.0
    outlier_worse: float = 0.3


@dataclass(frozen=True)
class MetricModel:
    """A served figure (throughput in tok/s, or a latency in seconds) under the flags and
    environment of a start, and its noise."""

    base: float
    factors: tuple[Factor, ...] = ()
    higher_is_better: bool = True
    noise: MetricNoise = MetricNoise()

    def value(
        self,
        flags: Mapping[str, FlagValue],
        env: Mapping[str, str],
        defaults: Mapping[str, Any] | None = None,
    ) -> float:
        """The figure without noise: the base times every factor whose conditions hold."""
        out = self.base
        for factor in self.factors:
            if factor.when.holds(flags, env, defaults):
                out *= factor.multiply
        return out

    def start(
        self,
        flags: Mapping[str, FlagValue],
        env: Mapping[str, str],
        rng: random.Random,
        runs: int,
        defaults: Mapping[str, Any] | None = None,
    ) -> list[float]:
        """The figures of `runs` benchmark runs inside one start, drawn from `rng` (a
        start's own level first, then each run's)."""
        level = self.value(flags, env, defaults) * self.level(rng)
        return [level * self.run_factor(rng, i) for i in range(runs)]

    def level(self, rng: random.Random) -> float:
        """A start's own level, as a multiplier of the figure (drawn first)."""
        return _lognormal(rng, self.noise.between)

    def run_factor(self, rng: random.Random, i: int) -> float:
        """The `i`-th run's (0: the first) multiplier of its start's level: the warm-up,
        a rare outlier, and the variation inside a start."""
        n = self.noise
        worse = 0.0
        if i < n.warmup_runs:
            worse += n.warmup_worse / 2**i
        if n.outlier_probability and rng.random() < n.outlier_probability:
            worse += n.outlier_worse
        factor = 1 / (1 + worse) if self.higher_is_better else 1 + worse
        return _lognormal(rng, n.within) * factor


def _lognormal(rng: random.Random, cv: float) -> float:
    """A multiplier of mean 1 whose coefficient of variation is `cv` (log-normal)."""
    if cv <= 0:
        return 1.0
    sigma = math.sqrt(math.log(1 + cv * cv))
    return math.exp(rng.gauss(-sigma * sigma / 2, sigma))


@dataclass(frozen=True)
class ModelInfo:
    """What the startup lines say about the model and the GPUs (cosmetic, but realistic)."""

    arch: str = "LlamaForCausalLM"
    dtype: str = "torch.bfloat16"
    shards: int = 8
    gpu_mem_gb: float = 79.1
    weights_gb: float = 15.0
    context_len: int = 131072
    #: when set, loading the checkpoint takes weights_gb / load_gb_per_s seconds (at time
    #: scale 1) instead of `startup.load_weights`
    load_gb_per_s: float | None = None
    #: seconds the load phase takes with `--load-format dummy` (random weights, no reading)
    dummy_load_s: float = 0.05


@dataclass(frozen=True)
class Scenario:
    name: str
    path: Path
    description: str = ""
    #: fixes the draws of flaky rules; None (`seed: random`) draws afresh on every start
    seed: int | None = 0
    startup: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_STARTUP))
    faults: tuple[Rule, ...] = ()
    throughput: float = 1000.0
    factors: tuple[Factor, ...] = ()
    #: the throughput's noise, and the latency's model (seconds, lower is better)
    throughput_noise: MetricNoise = MetricNoise()
    latency: MetricModel | None = None
    known_flags: tuple[flagcat.FlagSpec, ...] | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    model: ModelInfo = ModelInfo()
    #: the server's releases, oldest first (`versions:`); a rule's `version:` condition
    #: compares by this order
    versions: tuple[str, ...] = ()
    #: rules that make the answers wrong (the server still starts and serves)
    answers: tuple[AnswerRule, ...] = ()
    #: prompt sets (JSONL) whose expected answers the server knows, beside the shipped one
    prompt_sets: tuple[Path, ...] = ()
    #: the OpenAI routes it serves (`completions`, `chat`); the others answer 404
    routes: tuple[str, ...] = ROUTES

    def version_index(self, name: str | None) -> int | None:
        """The position of a version in `versions:` (None: no version, or not listed)."""
        return self.versions.index(name) if name in self.versions else None

    def startup_total(self) -> float:
        """Seconds from start to ready at time scale 1, on the checkpoint's weights."""
        return sum(v for k, v in self.startup.items() if k != "load_weights") + self.load_seconds(
            {}
        )

    def load_seconds(self, flags: Mapping[str, FlagValue]) -> float:
        """The load phase: from the model's size (or `startup.load_weights`), unless the
        load format is dummy."""
        if str(flags.get("load-format", "")) == DUMMY:
            return self.model.dummy_load_s
        if self.model.load_gb_per_s:
            return self.model.weights_gb / self.model.load_gb_per_s
        return self.startup["load_weights"]

    def select_fault(
        self,
        flags: Mapping[str, FlagValue],
        env: Mapping[str, str],
        seed: int,
        version: str | None = None,
    ) -> Rule | None:
        """The first rule that matches (and, if flaky, whose draw comes up), else None.
        `version`: the server's own (a build's), matched against `version:` conditions."""
        index = self.version_index(version)
        for rule in self.faults:
            if not rule.when.holds(flags, env, self.defaults, index):
                continue
            if rule.needs_real_weights and str(flags.get("load-format", "")) == DUMMY:
                continue
            if rule.probability is not None and draw(seed, rule, flags, env) >= rule.probability:
                continue
            return rule
        return None

    def answer_rules(
        self,
        flags: Mapping[str, FlagValue],
        env: Mapping[str, str],
        seed: int,
        version: str | None = None,
    ) -> tuple[AnswerRule, ...]:
        """The `answers:` rules in force for this start, in order: their conditions hold
        and, if flaky, their draw came up (each request then takes the first that applies)."""
        index = self.version_index(version)
        return tuple(
            r
            for r in self.answers
            if r.when.holds(flags, env, self.defaults, index)
            and (r.probability is None or draw(seed, r, flags, env, kind="answers") < r.probability)
        )

    def tokens_per_second(self, flags: Mapping[str, FlagValue], env: Mapping[str, str]) -> float:
        return self.throughput_model().value(flags, env, self.defaults)

    def throughput_model(self) -> MetricModel:
        return MetricModel(self.throughput, self.factors, True, self.throughput_noise)


def draw(
    seed: int,
    rule: Rule | AnswerRule,
    flags: Mapping[str, FlagValue],
    env: Mapping[str, str],
    kind: str = "faults",
) -> float:
    """A number in [0, 1) fixed by the seed, the rule and the server's command line.

    String seeds are hashed with SHA-512 by `random.Random`, so the draw is the same in
    every process regardless of PYTHONHASHSEED.
    """
    # (a fault rule's key is the one it always had: recorded flaky histories replay)
    extra = {} if kind == "faults" else {"kind": kind}
    key = json.dumps(
        {
            **extra,
            "seed": seed,
            "rule": rule.index,
            "flags": {k: v for k, v in sorted(flags.items()) if k not in _NOT_IN_DRAW},
            "env": {c.key: env.get(c.key) for c in rule.when.env},
        },
        sort_keys=True,
        default=str,
    )
    return random.Random(key).random()


def json_key(value: object, path: tuple[str, ...]) -> tuple[bool, Any]:
    """(present, value) of a key path inside a flag's value that is a JSON object."""
    if not isinstance(value, str):
        return False, None
    try:
        obj: Any = json.loads(value)
    except ValueError:
        return False, None
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return False, None
        obj = obj[key]
    return True, obj


def is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _text(value: object) -> str:
    """A value's text as it stood on the command line (a switch: `true`)."""
    if value is True:
        return "true"
    return repr(value) if isinstance(value, float) else str(value)


def _equal(actual: object, expected: object, text: str | None = None) -> bool:
    """A condition's value against a flag's or env var's: a number in the scenario compares
    numerically, text compares with the value's text (`text`, else rendered from actual)."""
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(_equal(a, e) for a, e in zip(actual, expected, strict=True))
        )
    if isinstance(actual, list):
        return False
    if isinstance(expected, bool):
        return expected is actual  # JSON's booleans (key-path conditions)
    if isinstance(expected, str):
        return (text if text is not None else _text(actual)) == expected
    if is_number(actual) and is_number(expected):
        return math.isclose(float(actual), float(expected), rel_tol=0, abs_tol=1e-12)
    return False
