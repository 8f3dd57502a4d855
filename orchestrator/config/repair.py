"""Repair moves as data: what may be changed when a run fails on a resource, and how far.

A move names one knob (a flag or an environment variable), which failures point it which
way (a signature's error class, optionally only in some phases: `up` or `down`), how one
step changes it (`step`: added; `factor`: multiplied) and its limits. The built-in moves
cover SGLang's and vLLM's usual knobs; an experiment file (`repair:`) and a host of the
hosts file (`repair:`, the host's habits) declare moves of their own, which replace a
built-in move of the same knob. The ladder that uses them is `orchestrator.planner.repair`.

Which failures are resource failures is the diagnosis' word (`RESOURCE_CLASSES`: the
classifier's `cuda_oom`, `not_enough_memory`, `kv_cache_memory`, `kv_cache_too_small`),
never a flag's name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator.verdicts import RESOURCE_CLASSES, Phase

#: repaired starts a variant may take after its first, unless declared otherwise
DEFAULT_STEPS = 2
_KNOB = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Trigger:
    """A failure that points a move's knob one way: +1 raise it, -1 lower it."""

    error_class: str
    phases: frozenset[str] | None  # None: in any phase
    way: int

    def matches(self, error_class: str, phase: str) -> bool:
        return error_class == self.error_class and (self.phases is None or phase in self.phases)

    def describe(self) -> str:
        where = f" in {'/'.join(sorted(self.phases))}" if self.phases else ""
        return f"{self.error_class}{where} -> {'raise' if self.way > 0 else 'lower'}"


@dataclass(frozen=True)
class Move:
    """One knob a repair may turn, the failures that turn it, and how far."""

    knob: str  # the flag's name without dashes, or the environment variable
    env: bool
    triggers: tuple[Trigger, ...]
    step: float | None = None  # added (raise) or taken off (lower) per step
    factor: float | None = None  # multiplied (raise) or divided (lower) per step
    low: float | None = None
    high: float | None = None
    #: the value the server takes when the config does not set the knob and its log does
    #: not print it (None: unknown, the move then applies only where one of them tells)
    absent: float | None = None
    integer: bool = False
    source: str = "built-in"  # where it was declared: built-in, a file, a host
    #: the server whose knob it is (`sglang`, `vllm`); None: any server's
    server: str | None = None

    def for_server(self, server: str | None) -> bool:
        """Whether a launch of `server` (None: a command that names no known server) has
        this knob: another server's flag is refused there, never advised."""
        return self.server is None or server is None or self.server == server

    def way(self, error_class: str, phase: str) -> int | None:
        """The direction this failure points the knob, or None if it does not address it."""
        for t in self.triggers:
            if t.matches(error_class, phase):
                return t.way
        return None

    def name(self) -> str:
        """`--mem-fraction-static` or `env VLLM_CPU_KVCACHE_SPACE`."""
        return f"env {self.knob}" if self.env else f"--{self.knob}"

    def describe(self) -> str:
        how = f"+/-{self.step:g}" if self.step is not None else f"x/÷{self.factor:g}"
        lim = ", ".join(
            x
            for x in (
                f"min {self.low:g}" if self.low is not None else "",
                f"max {self.high:g}" if self.high is not None else "",
            )
            if x
        )
        return (
            f"{self.name()} {how} per step"
            + (f" ({lim})" if lim else "")
            + ": "
            + "; ".join(t.describe() for t in self.triggers)
        )


@dataclass(frozen=True)
class RepairPolicy:
    """The moves a campaign may make and how many repaired starts a variant may take."""

    moves: tuple[Move, ...]
    steps: int = DEFAULT_STEPS


_LOAD = frozenset({"init", "load_weights", "kv_cache"})
_LATE = frozenset({"warmup", "serving", "probe"})

#: SGLang's and vLLM's usual knobs. Resource limits are two-sided: out of memory while
#: loading or sizing the KV cache wants a larger static fraction, out of memory while
#: serving or capturing CUDA graphs a smaller one (more room for activations and graphs);
#: out of memory in CUDA-graph capture wants fewer captured batch sizes first; a KV cache
#: too small for the model's length wants more cache space (vLLM's CPU build sizes it with
#: VLLM_CPU_KVCACHE_SPACE, in GiB). A knob the config does not set starts from the value
#: the server printed at start (SGLang prints every argument, those it chose included),
#: else from the value a declared move gives for it (`absent:`).
BUILTIN_MOVES: tuple[Move, ...] = (
    Move(
        "cuda-graph-max-bs",
        False,
        (Trigger("cuda_oom", frozenset({"cuda_graph"}), -1),),
        factor=2.0,
        low=1,
        high=4096,
        integer=True,
        server="sglang",
    ),
    Move(
        "mem-fraction-static",
        False,
        (
            Trigger("cuda_oom", _LOAD, +1),
            Trigger("not_enough_memory", None, +1),
            # SGLang's own advice for out of memory in graph capture: less static memory
            # (the graphs live outside it), after fewer captured batch sizes
            Trigger("cuda_oom", _LATE | {"cuda_graph"}, -1),
        ),
        step=0.04,
        low=0.5,
        high=0.95,
        server="sglang",
    ),
    Move(
        "gpu-memory-utilization",
        False,
        (
            Trigger("cuda_oom", _LOAD, +1),
            Trigger("kv_cache_memory", None, +1),
            Trigger("kv_cache_too_small", None, +1),
            Trigger("cuda_oom", _LATE, -1),
        ),
        step=0.05,
        low=0.5,
        high=0.95,
        server="vllm",
    ),
    Move(
        "VLLM_CPU_KVCACHE_SPACE",
        True,
        (Trigger("kv_cache_too_small", None, +1), Trigger("kv_cache_memory", None, +1)),
        factor=2.0,
        low=1,
        high=512,
        integer=True,
        server="vllm",
    ),
)


#: flags no move may change, and why: they say where the server is and what it serves,
#: not how much of a resource it takes
FIXED_FLAGS = {
    "port": "the health check and the probe find the server by it",
    "host": "the health check and the probe find the server by it",
    "model-path": "it is the model served, not a resource setting",
    "model": "it is the model served, not a resource setting",
}


class _Raw(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class TriggerModel(_Raw):
    error_class: str = Field(alias="class")
    phases: list[str] | None = None
    way: Literal["up", "down"]

    @field_validator("error_class")
    @classmethod
    def _class(cls, v: str) -> str:
        if v not in RESOURCE_CLASSES:
            raise ValueError(
                f"expected a resource failure's class (one of "
                f"{', '.join(sorted(RESOURCE_CLASSES))}), got {v!r}"
            )
        return v

    @field_validator("phases")
    @classmethod
    def _phases(cls, v: list[str] | None) -> list[str] | None:
        known = [p.value for p in Phase]
        for p in v or []:
            if p not in known:
                raise ValueError(f"expected phases among {', '.join(known)}, got {p!r}")
        return v


class MoveModel(_Raw):
    flag: str | None = None
    env: str | None = None
    when: list[TriggerModel] = Field(min_length=1)
    step: float | None = Field(default=None, gt=0)
    factor: float | None = Field(default=None, gt=1)
    min: float | None = None
    max: float | None = None
    absent: float | None = None
    integer: bool = False

    @model_validator(mode="after")
    def _one_of(self) -> MoveModel:
        if (self.flag is None) == (self.env is None):
            raise ValueError("a move names one knob: either flag: or env:")
        if (self.step is None) == (self.factor is None):
            raise ValueError(
                "a move changes its knob by either step: (added) or factor: "
                "(multiplied), one of the two"
            )
        name = self.env if self.env is not None else (self.flag or "").lstrip("-")
        if not (_ENV if self.env is not None else _KNOB).match(name):
            raise ValueError(f"{name!r} is not a valid {'variable' if self.env else 'flag'} name")
        if self.flag is not None and name in FIXED_FLAGS:
            raise ValueError(
                f"a move cannot change --{name}: {FIXED_FLAGS[name]}; moves change a "
                "resource knob (a memory fraction, a batch or context size)"
            )
        if self.min is not None and self.max is not None and self.min >= self.max:
            raise ValueError(f"min {self.min:g} is not below max {self.max:g}")
        return self


class RepairModel(_Raw):
    steps: int | None = Field(default=None, ge=0, le=10)
    builtin: bool = True  # the built-in moves too
    moves: list[MoveModel] = Field(default_factory=list)


def to_moves(model: RepairModel, source: str) -> tuple[Move, ...]:
    """The declared moves, frozen."""
    out = []
    for m in model.moves:
        env = m.env is not None
        out.append(
            Move(
                knob=m.env if env else (m.flag or "").lstrip("-"),
                env=env,  # type: ignore[arg-type]
                triggers=tuple(
                    Trigger(
                        t.error_class,
                        frozenset(t.phases) if t.phases else None,
                        +1 if t.way == "up" else -1,
                    )
                    for t in m.when
                ),
                step=m.step,
                factor=m.factor,
                low=m.min,
                high=m.max,
                absent=m.absent,
                integer=m.integer,
                source=source,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class Declared:
    """What one file or host declares (`repair:`), frozen."""

    moves: tuple[Move, ...] = ()
    steps: int | None = None
    builtin: bool = True

    @classmethod
    def of(cls, model: RepairModel | None, source: str) -> Declared | None:
        if model is None:
            return None
        return cls(to_moves(model, source), model.steps, model.builtin)

    def to_dict(self) -> dict[str, object]:
        """The `repair:` section that declares it (a recorded config keeps it: a resumed
        campaign repairs as the first one did)."""
        moves = []
        for m in self.moves:
            d: dict[str, object] = {"env" if m.env else "flag": m.knob}
            d |= {"step": m.step} if m.step is not None else {"factor": m.factor}
            d |= {
                k: v
                for k, v in (("min", m.low), ("max", m.high), ("absent", m.absent))
                if v is not None
            }
            if m.integer:
                d["integer"] = True
            d["when"] = [
                {"class": t.error_class, "way": "up" if t.way > 0 else "down"}
                | ({"phases": sorted(t.phases)} if t.phases else {})
                for t in m.triggers
            ]
            moves.append(d)
        out: dict[str, object] = {"moves": moves}
        if self.steps is not None:
            out["steps"] = self.steps
        if not self.builtin:
            out["builtin"] = False
        return out


def policy(declared: Iterable[Declared | None], *, enabled: bool = True) -> RepairPolicy:
    """The moves in force: the built-in ones, then each declaration in turn (a host's
    habits, then the experiment file's), a declared move replacing the move of its knob.
    `enabled` False (`--no-repair`) or `steps: 0` leaves no step to take."""
    moves: dict[tuple[bool, str], Move] = {(m.env, m.knob): m for m in BUILTIN_MOVES}
    steps = DEFAULT_STEPS
    for d in declared:
        if d is None:
            continue
        if not d.builtin:
            moves = {k: m for k, m in moves.items() if m.source != "built-in"}
        for m in d.moves:
            moves.pop((m.env, m.knob), None)
            moves[(m.env, m.knob)] = m
        if d.steps is not None:
            steps = d.steps
    return RepairPolicy(tuple(moves.values()), steps if enabled else 0)


__all__ = [
    "BUILTIN_MOVES",
    "DEFAULT_STEPS",
    "Declared",
    "Move",
    "RepairModel",
    "RepairPolicy",
    "Trigger",
    "policy",
    "to_moves",
]
