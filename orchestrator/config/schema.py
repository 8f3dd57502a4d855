"""The schema of an experiment file: the pydantic models a YAML file is validated with,
and the values they read (durations, a probe's pass condition, what no launch can carry).

Every key is optional here: a file may be a partial config that `extends:` another
(`config.loading`); completeness is checked once the chain is merged (`config.experiment`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

from orchestrator.config.repair import RepairModel

Scalar = Union[bool, int, float, str]  # noqa: UP007 (pydantic needs a runtime union here)

_DURATION = re.compile(r"(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>ms|s|m|h)")
_FLAG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: What no launch can carry: NUL ends a C string (argv, environ and unit files alike);
#: a lone surrogate cannot be encoded as UTF-8; systemd refuses a unit line holding a
#: Unicode noncharacter (U+FDD0..U+FDEF, U+xFFFE, U+xFFFF) as "not UTF-8 clean".
_UNCARRIABLE = re.compile(
    "[\x00\ud800-\udfff\ufdd0-\ufdef"
    + "".join(f"{chr(p + 0xFFFE)}{chr(p + 0xFFFF)}" for p in range(0, 0x110000, 0x10000))
    + "]"
)


def uncarriable(text: str) -> str | None:
    """Why `text` cannot reach a server's argv or environment exactly, or None if it can."""
    m = _UNCARRIABLE.search(text)
    if m is None:
        return None
    ch = m[0]
    if ch == "\x00":
        return "contains a NUL character, which no argv or environment can hold"
    if 0xD800 <= ord(ch) <= 0xDFFF:
        return f"contains U+{ord(ch):04X}, a lone surrogate that is not valid Unicode text"
    return f"contains U+{ord(ch):04X}, a Unicode noncharacter systemd refuses in unit files"


#: the longest duration any setting takes (a campaign's deadline, a start's timeout): past
#: it a number is a typo (`99999999999h`), and clocks and schedulers overflow on it
MAX_DURATION_S = 30 * 24 * 3600.0


def parse_duration(value: object) -> float:
    """'15m', '90s', '1h30m', '500ms' or a number of seconds -> seconds (at most 30 days)."""
    seconds = _duration_seconds(value)
    if seconds > MAX_DURATION_S:
        raise ValueError(
            f"expected a duration of at most 30 days (720h), got {value!r} "
            f"({seconds / 86400:.3g} days)"
        )
    return seconds


def _duration_seconds(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a duration like '90s', '15m' or a number of seconds")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"expected a finite duration like '90s' or '15m', got {value!r}")
        if value <= 0:
            raise ValueError("expected a positive duration")
        return float(value)
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        pos, total = 0, 0.0
        for m in _DURATION.finditer(text):
            if m.start() != pos:
                break
            pos = m.end()
            total += float(m["num"]) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m["unit"]]
        if text and pos == len(text) and total > 0 and math.isfinite(total):
            return total
    raise ValueError(f"expected a duration like '90s', '15m' or '1h30m', got {value!r}")


# ---------------------------------------------------------------------------- raw models
# Every field is optional here: a file may be a partial config that `extends:` another.
# Completeness (exec, port) is checked after the chain is merged.


class _Raw(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ServiceModel(_Raw):
    unit: str | None = None
    exec: str | None = None
    flags: dict[str, Scalar | list[int | float | str] | None] | None = None
    env: dict[str, Scalar | None] | None = None
    workdir: str | None = None
    #: which installation runs: a path (venv/prefix), an image, or a name the host maps
    build: str | None = None
    #: distributions taken from another build over this one (name -> version), and that
    #: build: a variant of a package-level search (`bisect --packages`)
    packages: dict[str, str] | None = None
    packages_from: str | None = None

    @field_validator("build")
    @classmethod
    def _build_name(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or re.search(r"[\x00-\x20\x7f]", v)):
            raise ValueError(f"a build is one word (a path, an image or a name), got {v!r}")
        return v

    @field_validator("flags")
    @classmethod
    def _flag_names(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        for name in v or {}:
            bare = name.lstrip("-")
            if not _FLAG_NAME.match(bare):
                raise ValueError(f"flag name {name!r} is not a valid option name")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        for name in v or {}:
            if not _ENV_NAME.match(name):
                raise ValueError(f"environment variable name {name!r} is not valid")
        return v

    @field_validator("unit")
    @classmethod
    def _unit_name(cls, v: str | None) -> str | None:
        return unit_name(v)


def unit_name(v: str | None) -> str | None:
    """A unit name as systemd takes it (a `service.unit` or a role's `unit`)."""
    if v is None:
        return v
    if not re.fullmatch(r"[A-Za-z0-9:_.@\\-]+", v) or v in (".", ".."):
        raise ValueError(f"unit name {v!r} must be a plain systemd unit name, not a path")
    if v.startswith("-"):  # `systemctl stop -H....service` would read it as an option
        raise ValueError(f"unit name {v!r} cannot start with '-'")
    if len(v) > 255:  # systemd's limit (UNIT_NAME_MAX), and a file name's
        raise ValueError(f"unit name of {len(v)} characters is longer than 255")
    if not re.fullmatch(r".+\.[a-z]+", v):  # what the systemd service manager accepts
        raise ValueError(f"unit name {v!r} needs its type suffix, e.g. 'sglang.service'")
    return v


#: the kinds of role a deployment holds (config.deployment)
ROLE_KINDS = ("node", "prefill", "decode", "router")
#: what a deployment does when a variant splits flags its roles must agree on
MISMATCHED_ROLES = ("refuse", "start")


class RoleModel(_Raw):
    """One role of a deployment (`roles.NAME`): a unit on a host, with flags of its own."""

    kind: str | None = None
    rank: int | None = Field(default=None, ge=0, le=63)
    host: str | None = None
    unit: str | None = None
    exec: str | None = None
    flags: dict[str, Scalar | list[int | float | str] | None] | None = None
    env: dict[str, Scalar | None] | None = None

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str | None) -> str | None:
        if v is not None and v not in ROLE_KINDS:
            raise ValueError(f"expected one of {', '.join(ROLE_KINDS)}, got {v!r}")
        return v

    @field_validator("flags")
    @classmethod
    def _flag_names(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return ServiceModel._flag_names(v)

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return ServiceModel._env_names(v)

    @field_validator("unit")
    @classmethod
    def _unit_name(cls, v: str | None) -> str | None:
        return unit_name(v)


class HealthModel(_Raw):
    path: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    timeout: float | None = None
    ready_after: int | None = Field(default=None, ge=1, le=100)
    interval: float | None = None
    settle: float | None = None

    @field_validator("timeout", "interval", "settle", mode="before")
    @classmethod
    def _duration(cls, v: object) -> float | None:
        return None if v is None else parse_duration(v)

    @field_validator("path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"expected an HTTP path starting with '/', got {v!r}")
        return v


class ProbeModel(_Raw):
    run: str | None = None
    metric: str | None = None
    pass_if: str | None = None
    timeout: float | None = None
    #: benchmark runs inside one start, and the first ones discarded as warm-up
    repeats: int | None = None
    warmup: int | None = None

    @field_validator("timeout", mode="before")
    @classmethod
    def _duration(cls, v: object) -> float | None:
        return None if v is None else parse_duration(v)

    @field_validator("repeats")
    @classmethod
    def _repeats(cls, v: int | None) -> int | None:
        if v is not None and not 1 <= v <= 50:
            raise ValueError(f"repeats must be between 1 and 50 runs of the probe, got {v}")
        return v

    @field_validator("warmup")
    @classmethod
    def _warmup(cls, v: int | None) -> int | None:
        if v is not None and not 0 <= v <= 10:
            raise ValueError(f"warmup must be between 0 and 10 discarded runs, got {v}")
        return v

    @field_validator("metric")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                compiled = re.compile(v)
            except re.error as exc:
                raise ValueError(f"metric is not a valid regular expression: {exc}") from None
            if compiled.groups < 1:
                raise ValueError("metric regex needs one group capturing the number")
        return v

    @field_validator("pass_if")
    @classmethod
    def _condition(cls, v: str | None) -> str | None:
        if v is not None:
            parse_condition(v)
        return v


class ExpectModel(_Raw):
    """What the user knows of a start on the target host: how long one takes."""

    run_time: float | None = None

    @field_validator("run_time", mode="before")
    @classmethod
    def _duration(cls, v: object) -> float | None:
        return None if v is None else parse_duration(v)


#: the values of `answers.rule`, `answers.modes` and `answers.endpoint`
ANSWER_RULES = ("exact", "logprobs-close", "score")
ANSWER_MODES = ("sequential", "batch")
ANSWER_ENDPOINTS = ("chat", "completions")


class AnswersModel(_Raw):
    """`answers:`: ask the ready server a prompt set and judge its answers against good's."""

    enabled: StrictBool | None = None
    prompts: str | None = None
    rule: str | None = None
    top_k: StrictInt | None = Field(default=None, ge=1, le=20)
    max_tokens: StrictInt | None = Field(default=None, ge=1, le=4096)
    modes: list[str] | None = None
    endpoint: str | None = None
    pass_if: str | None = None
    ready_completion: StrictBool | None = None
    timeout: float | None = None

    @field_validator("timeout", mode="before")
    @classmethod
    def _duration(cls, v: object) -> float | None:
        return None if v is None else parse_duration(v)

    @field_validator("rule")
    @classmethod
    def _rule(cls, v: str | None) -> str | None:
        if v is not None and v not in ANSWER_RULES:
            raise ValueError(f"expected one of {', '.join(ANSWER_RULES)}, got {v!r}")
        return v

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None and v not in ANSWER_ENDPOINTS:
            raise ValueError(f"expected one of {', '.join(ANSWER_ENDPOINTS)}, got {v!r}")
        return v

    @field_validator("modes")
    @classmethod
    def _modes(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if not v:
            raise ValueError(f"expected at least one of {', '.join(ANSWER_MODES)}")
        for m in v:
            if m not in ANSWER_MODES:
                raise ValueError(f"expected modes among {', '.join(ANSWER_MODES)}, got {m!r}")
        if len(set(v)) != len(v):
            raise ValueError(f"a mode is given twice: {v}")
        return v

    @field_validator("pass_if")
    @classmethod
    def _bar(cls, v: str | None) -> str | None:
        if v is not None:
            from orchestrator.diagnosis.answers import bar_problem

            why = bar_problem(v)
            if why is not None:
                raise ValueError(
                    f"score bar {v!r} cannot judge: {why}; expected a bar such as "
                    "'>= good - 0.08' or '>= 0.75'"
                )
        return v


#: the values of `rehearse:`
REHEARSALS = ("dummy-weights", "off")


class ExperimentModel(_Raw):
    name: str | None = None
    description: str | None = None
    extends: str | None = None
    service: ServiceModel | None = None
    health: HealthModel | None = None
    probe: ProbeModel | None = None
    answers: AnswersModel | None = None
    requires: dict[str, list[str]] | None = None
    #: a bisection searches on random weights first (`--load-format dummy`), see README
    rehearse: str | None = None
    expect: ExpectModel | None = None
    #: what a run that fails on a resource may change to run again (config.repair)
    repair: RepairModel | None = None
    schema_version: StrictBool | int | None = Field(default=None, alias="version")
    #: a deployment over several units (config.deployment): role name -> role
    roles: dict[str, RoleModel] | None = None
    #: a variant that splits flags the roles must agree on: `refuse` (invalid) or `start`
    mismatched_roles: str | None = None

    @field_validator("mismatched_roles")
    @classmethod
    def _mismatched(cls, v: str | None) -> str | None:
        if v is not None and v not in MISMATCHED_ROLES:
            raise ValueError(f"expected one of {', '.join(MISMATCHED_ROLES)}, got {v!r}")
        return v

    @field_validator("rehearse")
    @classmethod
    def _rehearse(cls, v: str | None) -> str | None:
        if v is not None and v not in REHEARSALS:
            raise ValueError(f"expected one of {', '.join(REHEARSALS)}, got {v!r}")
        return v


# ---------------------------------------------------------------------------- conditions

_COND = re.compile(
    r"^\s*(?P<op>>=|<=|==|!=|>|<)\s*(?:(?P<num>[-+]?\d+(?:\.\d+)?)"
    r"(?:\s*\*\s*(?P<ref>good|reference))?|(?P<ref_only>good|reference))\s*$"
)


@dataclass(frozen=True)
class Condition:
    """A pass condition on a probe metric: `>= 3000`, or relative: `>= 0.95 * good`
    (`reference` is the same word: a sweep calls its good config `reference:`)."""

    op: str
    number: float
    relative_to_good: bool = False

    def holds(self, value: float, good: float | None = None) -> bool:
        bar = self.number * (good if self.relative_to_good and good is not None else 1.0)
        return {
            ">=": value >= bar,
            "<=": value <= bar,
            ">": value > bar,
            "<": value < bar,
            "==": value == bar,
            "!=": value != bar,
        }[self.op]

    def __str__(self) -> str:
        num = f"{self.number:g}"
        return f"{self.op} {num} * good" if self.relative_to_good else f"{self.op} {num}"


def parse_condition(text: str) -> Condition:
    m = _COND.match(text)
    if not m:
        raise ValueError(
            f"pass_if {text!r} is not a condition; expected e.g. '>= 3000', '>= 0.95 * good' "
            "or '>= 0.95 * reference'"
        )
    if m["ref_only"]:
        return Condition(m["op"], 1.0, True)
    return Condition(m["op"], float(m["num"]), bool(m["ref"]))
