"""The repair ladder: a variant that died of a resource is started again with one move.

Pure: given the starts of one variant so far (its first start, then each repaired start
with the move it carried), the moves in force (`orchestrator.config.repair`) and the deltas
under test, `decide` says what to start next (`Next`: a move and its value) or that the
variant is settled (`Settled`: which start gives its verdict, and whether it was repaired,
could not be, or needed nothing). A failure is a resource failure by its signature's class
(`RESOURCE_CLASSES`); the target failure is never one, whatever its class. A move never
turns a knob that is itself a delta under test, nor one the server's parser refused.
Resource limits are two-sided: when one start failed wanting more of a knob and another
wanting less, the ladder stops: the variant has no working window.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.config.experiment import Experiment
from orchestrator.config.repair import Move, RepairPolicy
from orchestrator.config.shortopts import server_of
from orchestrator.planner.deltas import Delta
from orchestrator.verdicts import RESOURCE_CLASSES, Signature, Verdict

Number = int | float


@dataclass(frozen=True)
class Applied:
    """A move as one repaired start carried it (stored with the run, `runs.repair`)."""

    knob: str
    env: bool
    before: Number | None  # the knob's value in the start it repairs (None: not set)
    value: Number
    way: int  # +1 raised, -1 lowered
    failure: str  # the signature of the start it repairs, as printed
    after: str  # the run id of the start it repairs
    step: int  # 1 for the first repaired start of the variant
    #: where `before` came from when the config does not set the knob: `chosen by the
    #: server` (its log printed it), `its default` (the move's documented value); ""
    #: when the config set it
    assumed: str = ""

    def name(self) -> str:
        return f"env {self.knob}" if self.env else f"--{self.knob}"

    def describe(self) -> str:
        """`--mem-fraction-static 0.85 -> 0.92`, `--mem-fraction-static 0.88 (chosen by the
        server) -> 0.92`."""
        before = "unset" if self.before is None else _text(self.before)
        if self.assumed and self.before is not None:
            before += f" ({self.assumed})"
        return f"{self.name()} {before} -> {_text(self.value)}"

    def needs(self) -> str:
        """What the start that passed with this move needed: `--mem-fraction-static >= 0.89`."""
        return f"{self.name()} {'>=' if self.way > 0 else '<='} {_text(self.value)}"

    def words(self) -> list[str]:
        """The move as command-line words (`--mem-fraction-static 0.92`, `NAME=4`)."""
        if self.env:
            return [f"{self.knob}={_text(self.value)}"]
        return [f"--{self.knob}", _text(self.value)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "knob": self.knob,
            "env": self.env,
            "before": self.before,
            "value": self.value,
            "way": self.way,
            "failure": self.failure,
            "after": self.after,
            "step": self.step,
        } | ({"assumed": self.assumed} if self.assumed else {})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Applied:
        return cls(
            knob=str(d["knob"]),
            env=bool(d.get("env")),
            before=d.get("before"),
            value=d["value"],
            way=int(d.get("way") or 1),
            failure=str(d.get("failure")),
            after=str(d.get("after")),
            step=int(d.get("step") or 1),
            assumed=str(d.get("assumed") or ""),
        )


@dataclass(frozen=True)
class Rung:
    """One start on a variant's ladder."""

    run_id: str
    applied: Applied | None  # None: the variant as planned
    verdict: Verdict
    signature: Signature | None
    detail: str = ""
    #: the arguments the server printed at start (`server_logs.printed_args`), by flag name
    printed: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Next:
    """Start the variant again with `move` set to `value`."""

    move: Move
    before: Number | None
    value: Number
    way: int
    assumed: str = ""  # see Applied.assumed

    def applied(self, failure: str, after: str, step: int) -> Applied:
        m = self.move
        return Applied(
            m.knob, m.env, self.before, self.value, self.way, failure, after, step, self.assumed
        )


@dataclass(frozen=True)
class Settled:
    """The variant's verdict is the start `final` (an index into the rungs)."""

    final: int
    #: `none` (no resource failure, or repair off), `repaired` (a move got past it),
    #: `unrepaired` (still a resource failure: `why`)
    state: str
    why: str = ""
    #: the start the ladder ended at, when another one speaks for the variant (a ladder
    #: that found no working value, or whose first start shows the target as written)
    ended: int | None = None

    @property
    def last(self) -> int:
        """The last start the ladder made that counts (what its repair note tells)."""
        return self.final if self.ended is None else self.ended


def is_resource(sig: Signature | None, target: Signature | None) -> bool:
    """A resource failure a move may address: by its class, and never the target."""
    return (
        sig is not None
        and sig.error_class in RESOURCE_CLASSES
        and not (target is not None and sig == target)
    )


def delta_knobs(deltas: Iterable[Delta]) -> frozenset[tuple[bool, str]]:
    """(is env, name) of every knob a delta under test changes: moves leave them alone."""
    out = set()
    for d in deltas:
        if d.kind == "env":
            out.add((True, d.key))
        elif d.kind in ("flag", "json", "member"):
            out.add((False, d.key))
    return frozenset(out)


def with_moves(exp: Experiment, applied: Iterable[Applied]) -> Experiment:
    """The variant's launch with the moves applied in turn (a later one of a knob wins)."""
    flags: dict[str, Any] = {}
    env: dict[str, str | None] = {}
    for a in applied:
        if a.env:
            env[a.knob] = _text(a.value)
        else:
            flags[a.knob] = a.value
    return exp.with_changes(flags=flags or None, env=env or None) if flags or env else exp


def value_of(exp: Experiment, move: Move) -> Number | None:
    """The knob's value in a launch, as a number; None when not set or not a number."""
    raw = exp.env_map().get(move.knob) if move.env else exp.flag_map().get(move.knob)
    if raw is None or isinstance(raw, bool | tuple):
        return None
    try:
        x = float(raw)
    except (TypeError, ValueError):
        return None
    return int(x) if move.integer or (isinstance(raw, int) and x.is_integer()) else x


def stepped(move: Move, x: Number, way: int) -> Number:
    """The knob one step further `way`, kept within its limits."""
    if move.step is not None:
        nxt = x + way * move.step
    else:
        assert move.factor is not None
        nxt = x * move.factor if way > 0 else x / move.factor
    if move.high is not None:
        nxt = min(nxt, move.high)
    if move.low is not None:
        nxt = max(nxt, move.low)
    if move.integer:
        nxt = math.ceil(nxt) if way > 0 else math.floor(nxt)
        return int(nxt)
    return round(nxt, 6)


def decide(
    rungs: Sequence[Rung],
    policy: RepairPolicy,
    *,
    variant: Experiment,
    deltas: Iterable[Delta],
    refused: frozenset[tuple[bool, str]] = frozenset(),
    target: Signature | None = None,
) -> Next | Settled:
    """What the ladder of one variant does after `rungs` (its starts, first one first).

    The start as planned speaks for the variant unless a move got past its resource
    failure: a ladder that ends still failing on a resource (no working value found)
    leaves the failure the variant shows as written, and so does one whose first start
    shows the target (the target is what bad shows as written, whatever a repair found)."""
    if target is not None and len(rungs) > 1 and rungs[0].signature == target:
        inner = decide(rungs, policy, variant=variant, deltas=deltas, refused=refused)
        if isinstance(inner, Next):
            return Settled(0, "unrepaired", "the start as written shows the target", len(rungs) - 1)
        return Settled(0, inner.state, inner.why, inner.last)
    last = rungs[-1]
    if last.applied is not None and last.verdict is Verdict.INVALID and len(rungs) > 1:
        a = last.applied
        return Settled(
            0,
            "unrepaired",
            f"the server refused {a.name()} {_text(a.value)}"
            + (f" ({last.detail})" if last.detail else ""),
            len(rungs) - 2 or None,
        )
    # A start that shows the target as planned is never repaired; a repaired start is
    # judged by the ladder alone (when the target is the resource failure a ladder ended
    # in, that ladder stays as it ended)
    if not is_resource(last.signature, target if len(rungs) == 1 else None):
        return Settled(len(rungs) - 1, "repaired" if len(rungs) > 1 else "none")
    assert last.signature is not None
    sig = last.signature
    if policy.steps <= 0:
        return Settled(len(rungs) - 1, "none")  # repair is off
    done = len(rungs) - 1
    launches = _launches(rungs, variant)
    ended = len(rungs) - 1 if done else None
    if done >= policy.steps:
        window = next(
            (w for m in policy.moves if (w := _no_window(m, rungs, launches, target))), ""
        )
        return Settled(
            0,
            "unrepaired",
            window or f"still {sig.error_class} after {done} repaired start(s), the most allowed",
            ended,
        )
    busy = delta_knobs(deltas)
    blocked: list[str] = []
    unset: list[str] = []  # said only when nothing else blocked: another server's knobs
    for m in policy.moves:
        way = m.way(sig.error_class, sig.phase.value)
        if way is None:
            continue
        if (m.env, m.knob) in busy:
            blocked.append(f"{m.name()} is a delta under test")
            continue
        if (m.env, m.knob) in refused:
            blocked.append(f"the server refused a value of {m.name()} before")
            continue
        window = _no_window(m, rungs, launches, target)
        if window:
            return Settled(0, "unrepaired", window, ended)
        x = value_of(launches[-1], m)
        assumed = ""
        if x is None:
            got = assumed_value(m, last)
            if got is None:
                if not m.for_server(server_of(launches[-1].exec)):
                    continue  # another server's knob: never advised
                unset.append(
                    f"{m.name()} is not set in the config and the server did not print the "
                    f"value it chose (set {m.name()} in both configs to let it move)"
                )
                continue
            x, assumed = got
        nxt = stepped(m, x, way)
        if nxt == x:
            blocked.append(f"{m.name()} is at its limit ({_text(x)})")
            continue
        return Next(m, x, nxt, way, assumed)
    blocked = blocked or unset
    why = (
        "; ".join(blocked)
        if blocked
        else f"no move addresses {sig.error_class} in {sig.phase.value}"
    )
    return Settled(0, "unrepaired", why, ended)


def needs_of(applied: Iterable[Applied]) -> list[str]:
    """What the moves carried say a start needed, one per knob (a later move wins)."""
    last: dict[tuple[bool, str], Applied] = {}
    for a in applied:
        last[(a.env, a.knob)] = a
    return [a.needs() for a in last.values()]


def assumed_value(move: Move, rung: Rung) -> tuple[Number, str] | None:
    """The value of a knob the launch does not set, and where it came from: what the
    server printed at start (SGLang prints every argument, the ones it chose included),
    else the move's documented default; None when neither tells."""
    raw = None if move.env else (rung.printed or {}).get(move.knob)
    if raw is not None:
        try:
            x = float(raw)
        except ValueError:
            x = None
        if x is not None and math.isfinite(x):
            return (int(x) if move.integer else x), "chosen by the server"
    if move.absent is not None:
        return move.absent, "its default"
    return None


def may_run(
    policy: RepairPolicy, good: Experiment, bad: Experiment, deltas: Iterable[Delta]
) -> list[tuple[Move, str]]:
    """Each move in force and whether it may run in this campaign: `may run from VALUE`,
    or why not (repair off, a delta under test, not set in either config)."""
    busy = delta_knobs(deltas)
    out = []
    for m in policy.moves:
        if policy.steps <= 0:
            why = "repair is off"
        elif (m.env, m.knob) in busy:
            why = "not: it is a delta under test"
        else:
            values = {_text(x) for x in (value_of(good, m), value_of(bad, m)) if x is not None}
            if values:
                why = f"may run, from {' / '.join(sorted(values))}"
            elif not m.for_server(server_of(bad.exec)):
                why = f"not: a knob of {m.server}, not of this server"
            elif m.absent is not None:
                why = f"may run, from {_text(m.absent)} (the value assumed when unset)"
            elif not m.env:
                why = (
                    "neither config sets it: it moves from the value the server prints "
                    "at start, if it prints one (SGLang prints every argument)"
                )
            else:
                why = "not: neither config sets it"
        out.append((m, why))
    return out


def _launches(rungs: Sequence[Rung], variant: Experiment) -> list[Experiment]:
    """The launch of each rung: the variant with the moves carried so far."""
    out = []
    carried: list[Applied] = []
    for r in rungs:
        if r.applied is not None:
            carried.append(r.applied)
        out.append(with_moves(variant, carried))
    return out


def _no_window(
    m: Move, rungs: Sequence[Rung], launches: list[Experiment], target: Signature | None
) -> str:
    """Why `m`'s knob has no working value, when one start failed wanting more of it and
    another wanting less ('' otherwise)."""
    low: tuple[Number, Signature] | None = None  # the highest value that wanted more
    high: tuple[Number, Signature] | None = None  # the lowest value that wanted less
    for i, (r, exp) in enumerate(zip(rungs, launches, strict=True)):
        if not is_resource(r.signature, target if i == 0 else None) or r.verdict is Verdict.INVALID:
            continue
        assert r.signature is not None
        way = m.way(r.signature.error_class, r.signature.phase.value)
        x = value_of(exp, m)
        if x is None:
            got = assumed_value(m, r)
            x = got[0] if got is not None else None
        if way is None or x is None:
            continue
        if way > 0 and (low is None or x > low[0]):
            low = (x, r.signature)
        if way < 0 and (high is None or x < high[0]):
            high = (x, r.signature)
    if low is None or high is None:
        return ""
    return (
        f"no working window for {m.name()}: at {_text(low[0])} it failed wanting more "
        f"({low[1]}), at {_text(high[0])} wanting less ({high[1]})"
    )


def _text(x: object) -> str:
    if isinstance(x, float):
        return f"{x:g}" if abs(x) < 1e15 else repr(x)
    return str(x)


__all__ = [
    "Applied",
    "Next",
    "Rung",
    "Settled",
    "assumed_value",
    "decide",
    "delta_knobs",
    "is_resource",
    "may_run",
    "needs_of",
    "stepped",
    "value_of",
    "with_moves",
]
