"""The typed records of a campaign: its spec, its answer, the culprit sets and the findings.

Each has exactly one way to and from the dict stored in the results store (`to_dict` /
`from_dict`); the dict is the stored JSON, so `from_dict` also reads what older versions
wrote (keys they did not write get their defaults). The runner builds these records, the
store keeps their dicts, and the CLI and the reports read them back as types.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from orchestrator.diagnosis.verdicts import Phase, Signature


class Status(enum.StrEnum):
    """How a campaign ended (or stands): the `status` of its answer and of its record."""

    FOUND = "found"  # a bisection named its culprit sets, backed by runs
    #: a best answer below the requested confidence (its runs so far); `--resume` goes on
    UNSURE = "unsure"
    DONE = "done"  # a sweep has a verdict for every config and repeat
    INCOMPLETE = "incomplete"  # stopped before an answer (a budget, contradicting runs)
    ENDPOINTS = "endpoints"  # good does not pass or bad does not fail: nothing to bisect
    INTERRUPTED = "interrupted"  # Ctrl-C, SIGTERM, SIGHUP, a closed output; resumable
    REFUSED = "refused"  # another campaign held a host's lock: nothing ran
    #: stopped by an error of the configs or of the hosts (see its message); resumable
    ERROR = "error"
    DEAD = "dead"  # shown, never stored: `running`, but its controller's process is gone


def signature_from_text(text: str) -> Signature:
    """A signature from its printed form (`phase: error_class: message`), as answers store it."""
    phase, error_class, message = text.split(": ", 2)
    return Signature(Phase(phase), error_class, message)


@dataclass(frozen=True)
class BisectOptions:
    """The options of a bisection that its resume repeats."""

    strategy: str = "auto"
    repeat: int = 1
    max_runs: int | None = None
    deadline_s: float | None = None
    fresh: bool = False
    #: the noise-aware search stops when its answer is this likely to be right
    confidence: float = 0.95
    #: a JSON-valued flag's key paths are deltas of their own (False: `--no-split`)
    split: bool = True
    #: search on dummy weights (`--load-format dummy`) and confirm the answer on real ones
    rehearse: bool = False
    #: start a variant that died of a resource again with a repair move (off: `--no-repair`)
    repair: bool = True
    #: the builds from good's to bad's, in order (`--builds`): searched by bisection
    builds: tuple[str, ...] = ()
    #: `--packages`: the distributions of good's and bad's builds as read on the host
    #: ({"good": {name: version}, "bad": {...}}): their differences are the deltas
    packages: dict[str, dict[str, str]] | None = None


@dataclass(frozen=True)
class BisectSpec:
    """What a bisection was asked: the two configs as recorded, the deltas, hosts, options."""

    good: dict[str, Any]
    bad: dict[str, Any]
    good_source: str | None
    bad_source: str | None
    deltas: list[dict[str, Any]]
    hosts: list[str]
    options: BisectOptions = BisectOptions()

    def to_dict(self) -> dict[str, Any]:
        o = self.options
        return {
            "good": self.good,
            "bad": self.bad,
            "good_source": self.good_source,
            "bad_source": self.bad_source,
            "deltas": self.deltas,
            "strategy": o.strategy,
            "hosts": self.hosts,
            "options": {
                "repeat": o.repeat,
                "max_runs": o.max_runs,
                "deadline_s": o.deadline_s,
                "fresh": o.fresh,
                "confidence": o.confidence,
            }
            | ({} if o.split else {"split": False})
            | ({"rehearse": True} if o.rehearse else {})
            | ({} if o.repair else {"repair": False})
            | ({"builds": list(o.builds)} if o.builds else {})
            | ({"packages": o.packages} if o.packages else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BisectSpec:
        opts = d.get("options") or {}
        settings = BisectOptions(
            strategy=d.get("strategy") or "auto",
            repeat=opts.get("repeat") or 1,
            max_runs=opts.get("max_runs"),
            deadline_s=opts.get("deadline_s"),
            fresh=bool(opts.get("fresh", False)),
            confidence=opts.get("confidence") or 0.95,
            split=bool(opts.get("split", True)),
            rehearse=bool(opts.get("rehearse", False)),
            repair=bool(opts.get("repair", True)),
            builds=tuple(opts.get("builds") or ()),
            packages=opts.get("packages") or None,
        )
        return cls(
            good=d.get("good") or {},
            bad=d.get("bad") or {},
            good_source=d.get("good_source"),
            bad_source=d.get("bad_source"),
            deltas=list(d.get("deltas") or []),
            hosts=list(d.get("hosts") or []),
            options=settings,
        )


@dataclass
class Culprit:
    """One culprit set of an answer, with the runs that back it."""

    deltas: list[str]  # each delta described in full (`--ep-size: absent -> 8`)
    flags: list[str]  # each delta as a flag (`--ep-size 8`)
    indices: list[int]  # the deltas' positions in the campaign's delta list
    interacting: bool  # more than one delta, needed together
    reproduced_by: str | None  # the run of good + exactly this set that failed
    cleared_by: dict[str, str | None]  # flag -> the run without it that did not fail
    clearing: dict[str, str] = field(default_factory=dict)  # flag -> what that run shows
    confirmed: bool = False
    #: how often the evidence variants failed ("fail 2 of 3"), when counted
    reproduced_counts: str | None = None
    cleared_counts: dict[str, str | None] | None = None
    #: each delta's `Delta.what` (flag, env, exec, json, member); None in answers stored
    #: before it was recorded
    whats: list[str] | None = None
    #: the repair moves the reproducing run carried (the failure shows only under them)
    repaired_with: list[str] = field(default_factory=list)
    #: what the failure, a resource failure a repair avoids, needs to go away
    #: (`--mem-fraction-static >= 0.89`): the moves that got bad past it
    needs: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        """How the answer words it: an environment variable, one key of a JSON-valued
        option or one member of a set-valued one is no "single flag"."""
        if self.interacting:
            return "interacting set"
        what = self.whats[0] if self.whats else self._what_from_text()
        return {
            "env": "environment variable",
            "exec": "command",
            "member": "set member",
            "json": "JSON key",
            "build": "build",
            "package": "package",
        }.get(what, "single flag")

    def _what_from_text(self) -> str:
        """`Delta.what` read back from the described delta, for an answer stored before
        the kinds were recorded."""
        # Delta.describe(): "+ env X=1", "~ env X=1 -> 2", "- env X (was 1)", "~ exec a -> b",
        # "~ build a -> b"
        word = self.deltas[0][2:].split(" ", 1)[0] if self.deltas else ""
        if word in ("env", "exec", "build", "package"):
            return word
        if self.deltas and " member " in self.deltas[0]:
            return "member"  # `+ --cuda-graph-bs member 4`
        return "json" if "." in word else "flag"  # `+ --hf-overrides.head_dim 16`

    def to_dict(self) -> dict[str, Any]:
        out = {
            "deltas": self.deltas,
            "flags": self.flags,
            "indices": self.indices,
            "interacting": self.interacting,
            "reproduced_by": self.reproduced_by,
            "cleared_by": self.cleared_by,
            "clearing": self.clearing,
            "confirmed": self.confirmed,
        }
        if self.cleared_counts is not None:  # counted (every answer since they exist)
            out |= {
                "reproduced_counts": self.reproduced_counts,
                "cleared_counts": self.cleared_counts,
            }
        if self.whats is not None:
            out["whats"] = self.whats
        if self.repaired_with:
            out["repaired_with"] = self.repaired_with
        if self.needs:
            out["needs"] = self.needs
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Culprit:
        flags = list(d.get("flags") or d.get("deltas") or [])
        return cls(
            deltas=list(d.get("deltas") or flags),
            flags=flags,
            indices=list(d.get("indices") or []),
            interacting=bool(d.get("interacting", len(flags) > 1)),
            reproduced_by=d.get("reproduced_by"),
            cleared_by=dict(d.get("cleared_by") or {}),
            clearing=dict(d.get("clearing") or {}),
            confirmed=bool(d.get("confirmed")),
            reproduced_counts=d.get("reproduced_counts"),
            cleared_counts=d.get("cleared_counts"),
            whats=list(d["whats"]) if d.get("whats") else None,
            repaired_with=list(d.get("repaired_with") or []),
            needs=list(d.get("needs") or []),
        )

    def claim(self, flag: str) -> str:
        """What the run that clears `flag` shows, in words."""
        return self.clearing.get(flag) or f"bad without {flag} does not fail"

    def cleared_count(self, flag: str) -> str | None:
        return (self.cleared_counts or {}).get(flag)


@dataclass
class Finding:
    """A failure other than the target, met on the way: a separate bug to report."""

    signature: Signature
    variant: tuple[int, ...]  # the smallest variant that showed it (delta indices)
    run_id: str
    label: str
    count: int = 1
    #: starts of variants with all of its deltas that passed: > 0 means it shows on some
    #: starts only (a flaky failure); None: not counted (answers stored before the count)
    passed: int | None = None
    #: a wrong answer's prompts, as its run was judged (empty for any other failure)
    prompts: tuple[str, ...] = ()

    @property
    def flaky(self) -> bool:
        return bool(self.passed)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "signature": str(self.signature),
            "variant": self.label,
            "deltas": list(self.variant),
            "run": self.run_id,
            "count": self.count,
        }
        if self.passed is not None:
            out |= {"flaky": self.flaky, "passed": self.passed}
        if self.prompts:
            out["prompts"] = list(self.prompts)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        return cls(
            signature_from_text(d["signature"]),
            tuple(d.get("deltas") or ()),
            d["run"],
            d["variant"],
            int(d.get("count", 1)),
            d.get("passed"),
            tuple(d.get("prompts") or ()),
        )

    def seen(self) -> str:
        """How often it showed, in words: `seen 2x`, `seen 2x; flaky: passed 3x with it`,
        and for a wrong answer on few prompts, which: `seen 1x; on prompt 'fact-week' only`."""
        flaky = f"; flaky: passed {self.passed}x with it" if self.flaky else ""
        return f"seen {self.count}x{flaky}{self._on()}"

    def _on(self, shown: int = 3) -> str:
        if not self.prompts:
            return ""
        ids = ", ".join(repr(p) for p in self.prompts[:shown])
        if len(self.prompts) == 1:
            return f"; on prompt {ids} only"
        if len(self.prompts) <= shown:
            return f"; on prompts {ids}"
        return f"; on {len(self.prompts)} prompts, first {ids}"


@dataclass
class RepairNote:
    """A variant whose start died of a resource: started again with a move (`repaired`),
    or left as it failed (`unrepaired`, with why)."""

    variant: str  # the variant's label
    deltas: list[int]  # its delta indices
    state: str  # repaired | unrepaired
    moves: list[str]  # each move carried, described (`--mem-fraction-static 0.85 -> 0.92`)
    before_run: str  # its first start
    before: str  # what that start failed with (a signature, as printed)
    after_run: str | None  # the start whose verdict is the variant's
    after: str  # that start's outcome in words (`fail: ...`, `pass`, `other: ...`)
    why: str = ""  # why it could not be repaired
    command: str | None = None  # the command line of the repaired start
    count: int = 1  # starts of the variant that went this way (the first one is shown)
    #: what the start that passed needed (`--mem-fraction-static >= 0.89`), when one did
    needs: list[str] = field(default_factory=list)

    def sentence(self) -> str:
        """`good + --ep-size 8 ran out (kv_cache: ...) [run c.3]; with --mem-fraction-static
        0.85 -> 0.92 it failed with the target (...) [run c.4]`."""
        head = f"{self.variant}: {self.before} [run {self.before_run}]"
        if self.state == "repaired":
            more = f" (seen {self.count}x)" if self.count > 1 else ""
            return (
                f"{head}; with {', '.join(self.moves)} it {self.after} [run {self.after_run}]{more}"
            )
        tried = (
            f"; with {', '.join(self.moves)} it {self.after} [run {self.after_run}]"
            if self.moves and self.after_run != self.before_run
            else ""
        )
        more = f" (seen {self.count}x)" if self.count > 1 else ""
        return f"{head}{tried}; not repaired: {self.why}{more}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "deltas": self.deltas,
            "state": self.state,
            "moves": self.moves,
            "before_run": self.before_run,
            "before": self.before,
            "after_run": self.after_run,
            "after": self.after,
            "why": self.why,
            "command": self.command,
            "count": self.count,
        } | ({"needs": self.needs} if self.needs else {})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RepairNote:
        return cls(
            variant=str(d.get("variant", "")),
            deltas=list(d.get("deltas") or []),
            state=str(d.get("state", "")),
            moves=list(d.get("moves") or []),
            before_run=str(d.get("before_run", "")),
            before=str(d.get("before", "")),
            after_run=d.get("after_run"),
            after=str(d.get("after", "")),
            why=str(d.get("why") or ""),
            command=d.get("command"),
            count=int(d.get("count") or 1),
            needs=list(d.get("needs") or []),
        )


@dataclass(frozen=True)
class InvalidRun:
    """A variant rejected before it could run (a flag the server refuses, ...)."""

    variant: str
    run: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "run": self.run, "reason": self.reason}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> InvalidRun:
        return cls(d.get("variant", ""), d.get("run", ""), d.get("reason", ""))


@dataclass(frozen=True)
class Narrowed:
    """Where a search that stopped early stands."""

    failure_needs_some_of: list[str]
    harmless_together: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "failure_needs_some_of": self.failure_needs_some_of,
            "harmless_together": self.harmless_together,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Narrowed:
        return cls(
            list(d.get("failure_needs_some_of") or []), list(d.get("harmless_together") or [])
        )


@dataclass
class Outcome:
    """A bisection's answer: what `--json` prints and the store keeps as the campaign's answer."""

    campaign_id: str
    status: Status
    message: str = ""
    target: Signature | None = None
    culprits: list[Culprit] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    invalid: list[InvalidRun] = field(default_factory=list)
    runs_executed: int = 0
    runs_reused: int = 0
    narrowed: Narrowed | None = None
    flaky: list[str] = field(default_factory=list)
    removed_hosts: list[tuple[str, str]] = field(default_factory=list)
    #: how sure the answer is and whether the search went noise-aware (`flaky.NoiseWatch`)
    noise: dict[str, Any] | None = None
    deltas: list[str] = field(default_factory=list)  # the campaign's deltas, described
    #: which weights the runs loaded: {"search": real|dummy, "real_starts", "dummy_starts",
    #: and with a rehearsal its course: "rehearsal" (reproduced|not reproduced|...),
    #: "check_run", "confirmed_by" (run ids on real weights), "note"}
    weights: dict[str, Any] | None = None
    #: variants started again after a resource failure, or that could not be
    repairs: list[RepairNote] = field(default_factory=list)
    #: when bad's failure as written is a resource failure: what the repair made of it
    #: (avoided it, found no working value, could not run), in the answer's own words
    resource: str = ""
    #: with an answers check: the rule that judged the runs, and what bad's answers were
    #: under it and under the next stricter rule (campaign/answers_check.rule_line)
    answers: str = ""
    #: a bisection of a probe metric: its effect table (`campaign/measured.py`)
    effects: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        noise = self.noise or {}
        # (an answer stored before runs recorded their weights writes back as it was)
        weights = {"weights": self.weights} if self.weights is not None else {}
        # (an answer without repairs, stored before they existed, writes back as it was)
        repairs = {"repairs": [r.to_dict() for r in self.repairs]} if self.repairs else {}
        repairs |= {"resource": self.resource} if self.resource else {}
        repairs |= {"answers": self.answers} if self.answers else {}
        # (joins only when measured: other answers write back as they were)
        repairs |= {"effects": self.effects} if self.effects is not None else {}
        return (
            {
                "campaign": self.campaign_id,
                "status": self.status.value,
                "message": self.message,
                "target": str(self.target) if self.target else None,
                "culprits": [c.to_dict() for c in self.culprits],
                "findings": [f.to_dict() for f in self.findings],
                "invalid": [i.to_dict() for i in self.invalid],
                "runs_executed": self.runs_executed,
                "runs_reused": self.runs_reused,
                "narrowed": self.narrowed.to_dict() if self.narrowed else None,
                "flaky": self.flaky,
                "removed_hosts": [list(h) for h in self.removed_hosts],
                "confidence": noise.get("confidence"),
                "reproduction_rate": noise.get("reproduction_rate"),
                "noise": self.noise,
                "deltas": self.deltas,
            }
            | weights
            | repairs
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Outcome:
        target = d.get("target")
        return cls(
            campaign_id=d.get("campaign", ""),
            status=Status(d.get("status") or "incomplete"),
            message=d.get("message") or "",
            target=signature_from_text(target) if target else None,
            culprits=[Culprit.from_dict(c) for c in d.get("culprits") or []],
            findings=[Finding.from_dict(f) for f in d.get("findings") or []],
            invalid=[InvalidRun.from_dict(i) for i in d.get("invalid") or []],
            runs_executed=int(d.get("runs_executed") or 0),
            runs_reused=int(d.get("runs_reused") or 0),
            narrowed=Narrowed.from_dict(d["narrowed"]) if d.get("narrowed") else None,
            flaky=list(d.get("flaky") or []),
            removed_hosts=[(str(h), str(why)) for h, why in d.get("removed_hosts") or []],
            noise=d.get("noise"),
            deltas=list(d.get("deltas") or []),
            weights=d.get("weights"),
            repairs=[RepairNote.from_dict(r) for r in d.get("repairs") or []],
            resource=str(d.get("resource") or ""),
            answers=str(d.get("answers") or ""),
            effects=d.get("effects"),
        )

    @property
    def found(self) -> bool:
        return self.status is Status.FOUND


@dataclass(frozen=True)
class SweepSpecItem:
    """One config of a sweep as recorded: its label, its swept values, the config itself."""

    label: str
    values: list[tuple[str, Any]]  # (axis, value) per swept axis
    config: dict[str, Any]  # `Experiment.to_dict()`

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "values": [list(v) for v in self.values],
            "config": self.config,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SweepSpecItem:
        return cls(
            d["label"], [(str(k), v) for k, v in d.get("values") or []], d.get("config") or {}
        )


@dataclass(frozen=True)
class SweepSpec:
    """What a sweep was asked: the sweep file, its configs as they ran, hosts and repeats."""

    sweep: str  # the sweep file
    name: str
    hosts: list[str]
    repeat: int
    axes: list[str]
    reference: int | None  # the index of the item relative bars are judged against
    reuse: bool
    items: list[SweepSpecItem]

    def to_dict(self) -> dict[str, Any]:
        return {
            "sweep": self.sweep,
            "name": self.name,
            "hosts": self.hosts,
            "repeat": self.repeat,
            "axes": self.axes,
            "reference": self.reference,
            "reuse": self.reuse,
            "items": [it.to_dict() for it in self.items],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SweepSpec:
        return cls(
            sweep=str(d.get("sweep")),
            name=str(d.get("name")),
            hosts=list(d.get("hosts") or []),
            repeat=int(d.get("repeat") or 1),
            axes=list(d.get("axes") or []),
            reference=d.get("reference"),
            reuse=bool(d.get("reuse")),
            items=[SweepSpecItem.from_dict(it) for it in d.get("items") or []],
        )


@dataclass(frozen=True)
class SweepTableRow:
    """One (config, repeat) of a sweep's table as its answer stores it."""

    config: str  # the config's label
    repeat: int  # from 0
    run: str | None = None  # None: not run
    verdict: str | None = None
    signature: str | None = None
    metric: float | None = None
    duration: float | None = None
    reused_from: str | None = None  # the run of an earlier campaign it reused
    reference: bool = False  # the config relative bars are judged against
    bar: str | None = None  # the config's probe bar (`pass_if`)

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "repeat": self.repeat,
            "run": self.run,
            "verdict": self.verdict,
            "signature": self.signature,
            "metric": self.metric,
            "duration": self.duration,
            "reused_from": self.reused_from,
            "reference": self.reference,
            "bar": self.bar,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SweepTableRow:
        return cls(
            config=d["config"],
            repeat=int(d.get("repeat") or 0),
            run=d.get("run"),
            verdict=d.get("verdict"),
            signature=d.get("signature"),
            metric=d.get("metric"),
            duration=d.get("duration"),
            reused_from=d.get("reused_from"),
            reference=bool(d.get("reference")),
            bar=d.get("bar"),
        )


@dataclass
class SweepAnswer:
    """A sweep's answer: what `sweep --json` prints and the store keeps (its table and totals)."""

    campaign_id: str
    status: Status
    message: str = ""
    resume: str | None = None  # the command that continues it, as the CLI worded it
    resumable: bool = False  # stopped on a budget: the same command goes on
    executed: int = 0  # by the invocation that stored it
    reused: int = 0
    total_executed: int = 0  # by every invocation
    total_reused: int = 0
    removed_hosts: list[tuple[str, str]] = field(default_factory=list)
    reference: str | None = None  # the reference config's label
    notes: list[str] = field(default_factory=list)
    rows: list[SweepTableRow] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "campaign": self.campaign_id,
            "status": self.status.value,
            "message": self.message,
            "resume": self.resume,
            "resumable": self.resumable,
            "executed": self.executed,
            "reused": self.reused,
            "total_executed": self.total_executed,
            "total_reused": self.total_reused,
            "removed_hosts": [list(h) for h in self.removed_hosts],
            "reference": self.reference,
            "notes": self.notes,
            "rows": [r.to_dict() for r in self.rows],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SweepAnswer:
        executed, reused = int(d.get("executed") or 0), int(d.get("reused") or 0)
        return cls(
            campaign_id=d.get("campaign", ""),
            status=Status(d.get("status") or "incomplete"),
            message=d.get("message") or "",
            resume=d.get("resume"),
            resumable=bool(d.get("resumable")),
            executed=executed,
            reused=reused,
            # answers from before the totals: one invocation's counts were the totals
            total_executed=int(d.get("total_executed", executed) or 0),
            total_reused=int(d.get("total_reused", reused) or 0),
            removed_hosts=[(str(h), str(w)) for h, w in d.get("removed_hosts") or []],
            reference=d.get("reference"),
            notes=list(d.get("notes") or []),
            rows=[SweepTableRow.from_dict(r) for r in d.get("rows") or []],
        )


__all__ = [
    "BisectOptions",
    "BisectSpec",
    "Culprit",
    "Finding",
    "InvalidRun",
    "Narrowed",
    "Outcome",
    "RepairNote",
    "Status",
    "SweepAnswer",
    "SweepSpec",
    "SweepSpecItem",
    "SweepTableRow",
    "signature_from_text",
]
